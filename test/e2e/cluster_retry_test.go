package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// slowCreate is what makes a create take a while on a node, for real: a
// 15 TiB disk limit, whose sparse ext4 image mkfs.ext4 lays out (block
// group metadata, ~200 MB written) for about a second here, longer
// under load.
var slowCreate = &warrenv1.Resources{DiskBytes: 15 << 40}

// TestClusterRetryWhileCreateInFlightMakesOneSandbox checks that a
// create and its retry (same idempotency key) through two gateways make
// one sandbox while one of them is still being made on a node: the
// retry sent while the first attempt is creating finds it and waits for
// it; and a first attempt that reaches the cluster while its retry is
// creating (a request delayed on its way, as one whose client gave up
// can be) is refused where placement sends it, because the retry's
// gateway held the id on every node, so its client, retrying in turn,
// gets the same sandbox. The creates ask for anti-affinity with their
// own label, so a create placed anew would go to another node.
func TestClusterRetryWhileCreateInFlightMakesOneSandbox(t *testing.T) {
	cl := newCluster(t, clusterOptions{noCap: true})
	ctx := ctxFor(t, 5*time.Minute)
	type result struct {
		sb  *warrenv1.Sandbox
		err error
	}
	for _, tc := range []struct {
		name       string
		firstRetry bool // whether the one sent first is the retry
	}{
		{name: "retry-while-first-creates", firstRetry: false},
		{name: "first-while-retry-creates", firstRetry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			label := map[string]string{"job": "inflight-" + tc.name}
			req := func(retry bool) *warrenv1.CreateRequest {
				return &warrenv1.CreateRequest{Image: imageName, Labels: label, AntiAffinity: []string{"job"},
					IdempotencyKey: "key-" + tc.name, Retry: retry, Resources: slowCreate}
			}
			send := func(g *gwProc, retry bool) chan result {
				ch := make(chan result, 1)
				go func() {
					sb, err := g.c.Create(ctx, req(retry))
					ch <- result{sb, err}
				}()
				return ch
			}
			first := send(cl.gws[0], tc.firstRetry)
			// The second goes once the first is being made on its node
			// and the second's gateway counts it there (so that, placed
			// anew, it would go elsewhere).
			var creating string
			waitFor(t, 60*time.Second, "the first create to be under way on a node", func() bool {
				all, err := cl.gws[1].c.List(ctx, label)
				if err != nil || len(all) == 0 {
					return false
				}
				creating = all[0].GetNode() + " " + all[0].GetState().String()
				up, err := cl.gws[1].nodesUp(ctx)
				if err != nil {
					return false
				}
				for _, n := range up {
					if n.GetLabelCounts()["job="+label["job"]] == 1 {
						return true
					}
				}
				return false
			})
			second := send(cl.gws[1], !tc.firstRetry)
			a, b := <-first, <-second
			t.Logf("the second was sent with the first at %s", creating)
			if !strings.Contains(creating, "CREATING") {
				t.Logf("the first create was made before the second was sent: the in-flight case was not exercised this run")
			}
			if a.err != nil || b.err != nil {
				t.Fatalf("creates with one key: %v / %v\n%s", a.err, b.err, cl.gwLogs())
			}
			all, err := cl.gws[0].c.List(ctx, label)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != 1 || a.sb.GetId() != b.sb.GetId() {
				var where []string
				for _, sb := range all {
					where = append(where, sb.GetId()+"@"+sb.GetNode())
				}
				t.Fatalf("a create and its retry made %d sandboxes %v; they answered %s@%s and %s@%s",
					len(all), where, a.sb.GetId(), a.sb.GetNode(), b.sb.GetId(), b.sb.GetNode())
			}
			if err := cl.gws[0].c.Delete(ctx, a.sb.GetId()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestClusterNodeDownBeforeAnyListIsUnavailableAndLost checks a sandbox
// whose node dies before any gateway listed it (the gateways here list
// nodes only when they join): through the gateway that made it, Get
// answers it LOST, naming the node, and List reports it LOST; through the
// other, which never heard of it, Get and exec fail Unavailable naming
// the node (its id names the node), not NotFound; once the node is back
// the sandbox answers again.
func TestClusterNodeDownBeforeAnyListIsUnavailableAndLost(t *testing.T) {
	cl := newClusterOf(t, clusterConfig{nodes: 3, gwArgs: func(int) []string { return []string{"--list-interval", "1h"} }})
	ctx := ctxFor(t, 5*time.Minute)
	a, b := cl.gws[0].c, cl.gws[1].c
	label := map[string]string{"job": "early-loss"}
	sb, err := a.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Labels: label, Node: "node2"})
	if err != nil {
		t.Fatal(err)
	}
	cl.nodes[2].kill9()
	cl.waitNodes(30*time.Second, "node0", "node1")

	got, err := a.Get(ctx, sb.GetId())
	if err != nil || got.GetState() != warrenv1.SandboxState_SANDBOX_STATE_LOST || !strings.Contains(got.GetDeadReason(), "node2") {
		t.Errorf("get through the gateway that made it: %v %v, want LOST naming node2", got, err)
	}
	list, err := a.List(ctx, label)
	if err != nil || len(list) != 1 || list[0].GetId() != sb.GetId() || list[0].GetState() != warrenv1.SandboxState_SANDBOX_STATE_LOST {
		t.Errorf("list through the gateway that made it: %v %v, want it LOST", list, err)
	}
	for _, c := range []*client.Client{a, b} {
		_, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Shell: "true"})
		wantCategory(t, err, client.CategoryUnavailable, "exec on a sandbox of a node down before any list")
		if err != nil && !strings.Contains(err.Error(), "node2") {
			t.Errorf("the error does not name the node: %v", err)
		}
	}
	_, err = b.Get(ctx, sb.GetId())
	wantCategory(t, err, client.CategoryUnavailable, "get through the gateway that never listed it")
	if err != nil && !strings.Contains(err.Error(), "node2") {
		t.Errorf("the error does not name the node: %v", err)
	}

	cl.nodes[2].start()
	cl.waitNodes(30*time.Second, "node0", "node1", "node2")
	waitFor(t, 30*time.Second, "the sandbox to run again through both gateways", func() bool {
		for _, c := range []*client.Client{a, b} {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := c.Exec(cctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Shell: "echo back"})
			cancel()
			if err != nil || strings.TrimSpace(string(res.GetStdout())) != "back" {
				return false
			}
		}
		return true
	})
	if err := a.Delete(ctx, sb.GetId()); err != nil {
		t.Fatal(fmt.Errorf("delete: %w", err))
	}
}

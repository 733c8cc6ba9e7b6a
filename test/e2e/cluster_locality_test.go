package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestClusterPlacementFollowsImageLayers checks image locality end to
// end: a node reports the layers it has mounted, both gateways read the
// reports, and creates of an image only one node has go to that node
// through either gateway while it has room; a burst of an image no node
// has is spread over the nodes instead of following its first placement.
func TestClusterPlacementFollowsImageLayers(t *testing.T) {
	cl := newCluster(t, clusterOptions{noCap: true})
	ctx := ctxFor(t, 5*time.Minute)
	gws := []*client.Client{cl.gws[0].c, cl.gws[1].c}

	// Two images with layers of their own (the shared store holds them;
	// no node has mounted them yet).
	layers := map[string][]string{}
	for _, name := range []string{"loca", "locb"} {
		dir := filepath.Join(t.TempDir(), name)
		if out, err := exec.Command("cp", "-a", testutil.BusyboxRoot(t), dir).CombinedOutput(); err != nil {
			t.Fatalf("copy busybox root: %v %s", err, out)
		}
		if err := os.WriteFile(filepath.Join(dir, "marker"), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		img, err := cl.nodes[0].c.ImportImage(ctx, name, dir)
		if err != nil {
			t.Fatalf("import %s: %v", name, err)
		}
		layers[name] = img.GetLayers()
	}

	// Each sandbox asks for 1/24 of a node's over-committed memory (the
	// gateway's default --overcommit of 4), so that a sandbox weighs more
	// in placement than the run-queue noise between the nodes' reports.
	st, err := cl.nodes[0].c.SystemService().NodeStatus(ctx, connect.NewRequest(&warrenv1.NodeStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	mem := st.Msg.GetNodes()[0].GetMemoryBytes() * 4 / 24
	create := func(c *client.Client, image, node string, mem int64) *warrenv1.Sandbox {
		t.Helper()
		sb, err := c.Create(ctx, &warrenv1.CreateRequest{Image: image, Node: node, Labels: map[string]string{"job": "loc"},
			Resources: &warrenv1.Resources{MemoryBytes: mem}})
		if err != nil {
			t.Fatalf("create %s: %v\n%s", image, err, cl.gwLogs())
		}
		return sb
	}

	// node1 gets loca's layers mounted by a sandbox of it, and reports
	// them to both gateways.
	create(gws[0], "loca", "node1", mem)
	for _, g := range cl.gws {
		waitFor(t, 30*time.Second, "gateway "+g.name+" to see loca's layers on node1 alone", func() bool {
			up, err := g.nodesUp(ctx)
			if err != nil || len(up) != 3 {
				return false
			}
			for name, n := range up {
				has := !slices.ContainsFunc(layers["loca"], func(l string) bool { return !slices.Contains(n.GetLayers(), l) })
				if has != (name == "node1") {
					return false
				}
			}
			return true
		})
	}

	// Creates of loca through either gateway go to node1, though the
	// other nodes are emptier.
	for i := range 4 {
		if sb := create(gws[i%2], "loca", "", mem); sb.GetNode() != "node1" {
			t.Fatalf("create %d of loca, which only node1 has, went to %s", i, sb.GetNode())
		}
	}

	// A batch of locb, which no node has, spreads: its first placement
	// does not draw the rest.
	res, err := gws[1].SandboxService().BatchCreate(ctx, connect.NewRequest(&warrenv1.BatchCreateRequest{Count: 6,
		Template: &warrenv1.CreateRequest{Image: "locb", Labels: map[string]string{"job": "loc"}, Resources: &warrenv1.Resources{MemoryBytes: mem}}}))
	if err != nil || len(res.Msg.GetSandboxes()) != 6 {
		t.Fatalf("batch create of locb: %v %v", res, err)
	}
	per := map[string]int{}
	for _, sb := range res.Msg.GetSandboxes() {
		per[sb.GetNode()]++
	}
	t.Logf("locb placed as %v", per)
	if len(per) < 2 {
		t.Errorf("6 sandboxes of a new image all on one node: %v", per)
	}

	// Locality yields to capacity: a sandbox of loca asking for more
	// memory than node1 has left under over-commit (it holds 5/24 of it)
	// goes to a node without the image (the other two hold 6/24 between
	// them, so one has room). gw0 counts the creates gw1 made once node1
	// reports them.
	waitFor(t, 30*time.Second, "gateway gw0 to see node1's 5 sandboxes", func() bool {
		up, err := cl.gws[0].nodesUp(ctx)
		return err == nil && up["node1"].GetSandboxes() == 5
	})
	if sb := create(gws[0], "loca", "", mem*20); sb.GetNode() == "node1" {
		up, err := cl.gws[0].nodesUp(ctx)
		var seen []string
		for name, n := range up {
			seen = append(seen, fmt.Sprintf("%s: %d sandboxes, %d/%d bytes", name, n.GetSandboxes(), n.GetAllocMemoryBytes(), n.GetMemoryBytes()*4))
		}
		t.Fatalf("a sandbox of loca too large for node1 (%d bytes) went there; gateway gw0 sees %v (%v)", mem*20, seen, err)
	}

	all, err := gws[0].List(ctx, map[string]string{"job": "loc"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		if err := gws[1].Delete(ctx, sb.GetId()); err != nil {
			t.Errorf("delete %s: %v", sb.GetId(), err)
		}
	}
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// routePath is the host path of harness id's API socket.
func (e *env) routePath(id string) string {
	return filepath.Join(e.runDir, "devfs", id, "warren.sock")
}

// routeClient is a client of harness id's route, from the host: the same
// listener the harness's processes reach at /dev/warren.sock.
func (e *env) routeClient(id string) *client.Client {
	e.t.Helper()
	c, err := client.New("unix://"+e.routePath(id), client.WithToken(""))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// inHarness runs the warren CLI inside harness id (copied to /warren),
// which finds the route through $WARREN_ADDR.
func (e *env) inHarness(id, args string) (stdout, stderr string, code int32) {
	e.t.Helper()
	res := e.sh(id, "/warren "+args)
	return string(res.Stdout), string(res.Stderr), res.ExitCode
}

// waitNotFound polls until Get of id is NotFound.
func (e *env) waitNotFound(id string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		_, err := e.c.Get(ctxFor(e.t, 10*time.Second), id)
		if client.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still there after %v (get: %v)", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A harness sandbox drives the API from inside with the real CLI through
// its route, and the route is scoped to the sandboxes it creates: it
// creates a child and execs in it, lists only its own, and is refused
// (permission_denied) on another sandbox, itself, the image store,
// node-level calls, a nested harness and a child with more network than
// it has; its cap is Exhausted; the trainer drives the child through the
// node's API too; the route works again after a daemon restart; deleting
// the harness deletes its children and leaves nothing on the node.
func TestHarnessSandboxScopedRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "other"})
	h := e.create(&warrenv1.CreateRequest{Id: "hx", Harness: &warrenv1.HarnessOptions{MaxChildren: 2}})
	if h.GetHarness().GetMaxChildren() != 2 || h.GetEnv()["WARREN_ADDR"] != "unix:///dev/warren.sock" {
		t.Fatalf("harness: %v env %v", h.GetHarness(), h.GetEnv())
	}
	bin, err := os.ReadFile(e.bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.WriteFile(ctxFor(t, time.Minute), &warrenv1.WriteFileRequest{SandboxId: "hx", Path: "/warren", Content: bin, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}

	if out, serr, code := e.inHarness("hx", "sandbox create --image bb --id kid1"); code != 0 || strings.TrimSpace(out) != "kid1" {
		t.Fatalf("create a child from inside: exit %d %q %q", code, out, serr)
	}
	if out, serr, code := e.inHarness("hx", "sandbox exec kid1 -- echo from-harness"); code != 0 || out != "from-harness\n" {
		t.Errorf("exec in the child from inside: exit %d %q %q", code, out, serr)
	}
	out, serr, code := e.inHarness("hx", "--json sandbox ls")
	var resp struct {
		Sandboxes []struct {
			ID     string `json:"id"`
			Parent string `json:"parent"`
		} `json:"sandboxes"`
	}
	listed := &resp.Sandboxes
	if code != 0 || json.Unmarshal([]byte(out), &resp) != nil || len(*listed) != 1 || (*listed)[0].ID != "kid1" || (*listed)[0].Parent != "hx" {
		t.Errorf("list from inside: exit %d %q %q, want kid1 alone, parent hx", code, out, serr)
	}
	for _, args := range []string{
		"sandbox get other", "sandbox exec other -- true", "sandbox rm other", "sandbox get hx",
		"image ls", "image rm bb", "layer ls", "sandbox commit kid1 mylayer",
		"sandbox create --image bb --harness",
		"sandbox create --image bb --network open",
		"sandbox create --image bb --allow-setuid",
		"sandbox create --image bb --network-group g",
	} {
		out, serr, code := e.inHarness("hx", args)
		if code == 0 || !strings.Contains(serr, "permission_denied") {
			t.Errorf("%q from inside the harness: exit %d %q %q, want permission_denied", args, code, out, serr)
		}
	}
	if _, serr, code := e.inHarness("hx", "sandbox create --image bb --id kid2"); code != 0 {
		t.Fatalf("second child: %q", serr)
	}
	if out, serr, code := e.inHarness("hx", "sandbox create --image bb --id kid3"); code == 0 || !strings.Contains(serr, "exhausted") {
		t.Errorf("a child past max_children: exit %d %q %q, want exhausted", code, out, serr)
	}
	// The harness's own sandboxes are the trainer's too.
	kid, err := e.c.Get(ctxFor(t, 10*time.Second), "kid1")
	if err != nil || kid.GetParent() != "hx" {
		t.Fatalf("trainer's get of the child: %v %v, want parent hx", kid, err)
	}
	if got := e.shOK("kid1", "echo from-trainer"); got != "from-trainer\n" {
		t.Errorf("trainer's exec in the child: %q", got)
	}
	all, err := e.c.List(ctxFor(t, 10*time.Second), nil)
	if err != nil || len(all) != 4 {
		t.Errorf("trainer's list: %d sandboxes (%v), want 4", len(all), err)
	}

	// A restart re-opens the route of the live harness.
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(e.routePath("hx")); err == nil {
		t.Errorf("route socket left while no daemon runs")
	}
	e.start()
	if out, serr, code := e.inHarness("hx", "sandbox exec kid2 -- echo after-restart"); code != 0 || out != "after-restart\n" {
		t.Errorf("exec from inside after a restart: exit %d %q %q", code, out, serr)
	}
	if _, serr, code := e.inHarness("hx", "sandbox get other"); code == 0 || !strings.Contains(serr, "permission_denied") {
		t.Errorf("get of another sandbox after a restart: %q, want permission_denied", serr)
	}

	// Deleting the harness deletes its children and the route.
	if err := e.c.Delete(ctxFor(t, time.Minute), "hx"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"kid1", "kid2"} {
		if _, err := e.c.Get(ctxFor(t, 10*time.Second), id); !client.IsNotFound(err) {
			t.Errorf("child %s after its harness was deleted: %v, want not_found", id, err)
		}
	}
	if _, err := os.Lstat(e.routePath("hx")); err == nil {
		t.Errorf("route socket left after the harness was deleted")
	}
	if _, err := e.c.Get(ctxFor(t, 10*time.Second), "other"); err != nil {
		t.Errorf("another sandbox after the harness was deleted: %v", err)
	}
	if err := e.c.Delete(ctxFor(t, time.Minute), "other"); err != nil {
		t.Fatal(err)
	}
	e.expectBaseline("after deleting the harness and the other sandbox")
}

// A harness's children go with it whatever ends it: its init dying while
// the daemon runs, dying while no daemon runs (the next daemon deletes
// the orphans after adoption), and its lifetime passing. A call through
// the route of a harness in a user namespace works (the socket is open
// to its unprivileged ids), and its children must be in one too.
func TestHarnessSandboxChildrenFollowIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	mk := func(h string, timeout int64, userns bool) []string {
		t.Helper()
		e.create(&warrenv1.CreateRequest{Id: h, Harness: &warrenv1.HarnessOptions{}, TimeoutSeconds: timeout, UserNamespace: &userns})
		rc := e.routeClient(h)
		var kids []string
		for i := range 2 {
			kid, err := rc.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Labels: map[string]string{"n": string(rune('a' + i))}})
			if err != nil {
				t.Fatalf("create a child of %s through its route: %v", h, err)
			}
			if kid.GetParent() != h {
				t.Errorf("child %s: parent %q, want %s", kid.GetId(), kid.GetParent(), h)
			}
			kids = append(kids, kid.GetId())
		}
		return kids
	}
	gone := func(what string, ids []string) {
		t.Helper()
		for _, id := range ids {
			if err := e.waitNotFound(id, 30*time.Second); err != nil {
				t.Errorf("%s: child %s still there: %v", what, id, err)
			}
		}
	}

	// Dies while the daemon runs.
	kids := mk("hdie", 0, false)
	if err := syscall.Kill(e.initPid("hdie"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone("harness died", kids)
	if _, err := e.waitState("hdie", warrenv1.SandboxState_SANDBOX_STATE_STOPPED, 10*time.Second); err != nil {
		t.Errorf("dead harness: %v", err)
	}
	if _, err := os.Lstat(e.routePath("hdie")); err == nil {
		t.Errorf("route socket left after the harness died")
	}

	// Dies while no daemon runs.
	kids = mk("hdown", 0, true)
	rc := e.routeClient("hdown")
	if _, err := rc.Create(ctx, &warrenv1.CreateRequest{Image: imageName, UserNamespace: new(bool)}); !client.IsPermissionDenied(err) {
		t.Errorf("a child without a user namespace of a harness in one: %v, want permission_denied", err)
	}
	e.kill9()
	pid := e.initPid("hdown")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.start()
	gone("harness died while no daemon ran", kids)

	// Its lifetime passes.
	kids = mk("httl", 3, false)
	gone("harness timed out", kids)
	if err := e.waitNotFound("httl", 30*time.Second); err != nil {
		t.Errorf("timed-out harness: %v", err)
	}

	for _, id := range []string{"hdie", "hdown"} {
		if err := e.c.Delete(ctx, id); err != nil && !client.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	left, err := e.c.List(ctx, nil)
	if err != nil || len(left) != 0 {
		t.Errorf("sandboxes left: %d (%v)", len(left), err)
	}
	e.expectBaseline("after every harness is gone")
}

// Harness cycles leak nothing in the daemon: each harness's listener,
// its server's goroutines and connections, and the socket file go with
// the harness.
func TestHarnessSandboxNoLeaks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	cycle := func(i int) {
		id := fmt.Sprintf("hl%d", i)
		e.create(&warrenv1.CreateRequest{Id: id, Harness: &warrenv1.HarnessOptions{}})
		rc, err := client.New("unix://"+e.routePath(id), client.WithToken(""))
		if err != nil {
			t.Fatal(err)
		}
		kid, err := rc.Create(ctx, &warrenv1.CreateRequest{Image: imageName})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := rc.Exec(ctx, &warrenv1.ExecRequest{SandboxId: kid.GetId(), Argv: []string{"true"}}); err != nil || res.GetExitCode() != 0 {
			t.Fatalf("exec through the route: %v %v", res, err)
		}
		// A call in flight when the harness goes: the route's end ends it.
		p, err := rc.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: kid.GetId(), Argv: []string{"sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() {
			_, err := rc.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: kid.GetId(), ProcessId: p.GetProcessId()})
			waited <- err
		}()
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-waited:
		case <-time.After(30 * time.Second):
			t.Fatal("a call through the route outlived the harness")
		}
		rc.Close()
		if _, err := os.Lstat(e.routePath(id)); err == nil {
			t.Fatalf("route socket of %s left", id)
		}
	}
	cycle(0)
	fds0, gor0 := e.daemonFDs(), e.goroutines(t)
	for i := 1; i <= 10; i++ {
		cycle(i)
	}
	var fds, gor int
	deadline := time.Now().Add(10 * time.Second)
	for {
		fds, gor = e.daemonFDs(), e.goroutines(t)
		if (fds <= fds0+4 && gor <= gor0+10) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("daemon: %d -> %d file descriptors, %d -> %d goroutines over 10 harness cycles", fds0, fds, gor0, gor)
	if fds > fds0+4 || gor > gor0+10 {
		t.Errorf("daemon grew over 10 harness cycles: fds %d -> %d, goroutines %d -> %d", fds0, fds, gor0, gor)
	}
	e.expectBaseline("after the harness cycles")
}

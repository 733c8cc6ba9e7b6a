package daemon

import (
	"fmt"
	"sync"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/caller"
	"github.com/warrenrl/warren/internal/errdefs"
)

// A harness's child may not be contained less tightly than the harness:
// no wider network, no setuid the harness lacks, no leaving the user
// namespace, and never a network group.
func TestCheckChild(t *testing.T) {
	port := uint32(443)
	allow := func(rules ...*warrenv1.NetworkRule) *warrenv1.NetworkPolicy {
		return &warrenv1.NetworkPolicy{Mode: "allowlist", Allow: rules}
	}
	pypi := &warrenv1.NetworkRule{Host: "pypi.org", Port: &port, Protocol: "tcp"}
	cidr := &warrenv1.NetworkRule{Cidr: "10.9.0.0/16"}
	cases := []struct {
		name          string
		parent, child *warrenv1.NetworkPolicy
		setuid        bool
		parentSetuid  bool
		userNS        bool
		parentUserNS  bool
		ok            bool
	}{
		{name: "none under none", ok: true},
		{name: "open under none", child: &warrenv1.NetworkPolicy{Mode: "open"}},
		{name: "allowlist under none", child: allow(pypi)},
		{name: "anything under open", parent: &warrenv1.NetworkPolicy{Mode: "open"}, child: allow(cidr), ok: true},
		{name: "subset of the allowlist", parent: allow(pypi, cidr), child: allow(cidr), ok: true},
		{name: "rule outside the allowlist", parent: allow(pypi), child: allow(cidr)},
		{name: "open under allowlist", parent: allow(pypi), child: &warrenv1.NetworkPolicy{Mode: "open"}},
		{name: "group under open", parent: &warrenv1.NetworkPolicy{Mode: "open"}, child: &warrenv1.NetworkPolicy{Mode: "none", Group: "g"}},
		{name: "setuid without the harness's", setuid: true},
		{name: "setuid with the harness's", setuid: true, parentSetuid: true, ok: true},
		{name: "out of the harness's user namespace", parentUserNS: true},
		{name: "in a user namespace under a harness without", userNS: true, ok: true},
	}
	for _, c := range cases {
		parent := &warrenv1.Sandbox{Id: "h", Network: c.parent, AllowSetuid: c.parentSetuid, UserNamespace: c.parentUserNS}
		net, err := networkPolicy("network", c.child)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		err = checkChild(parent, net, c.setuid, c.userNS)
		if c.ok != (err == nil) || (err != nil && errdefs.CategoryOf(err) != errdefs.PermissionDenied) {
			t.Errorf("%s: %v, want ok %v (else permission_denied)", c.name, err, c.ok)
		}
	}
}

// routes is a Router that records which harnesses have a route.
type routes struct {
	mu   sync.Mutex
	open map[string]string
}

func (r *routes) OpenRoute(id, path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.open[id] = path
	return nil
}

func (r *routes) CloseRoute(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.open, id)
}

func (r *routes) has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.open[id]
	return ok
}

// Creates of children racing the deletion of their harness are each
// refused or deleted with it: none outlives the harness (a child is
// either in the map when the deletion looks for children, or its create
// finds the harness DELETING). The route is closed with the harness, and
// the cap counts children at once, not ever.
func TestHarnessChildrenRaceItsDeletion(t *testing.T) {
	rt := &routes{open: map[string]string{}}
	e := newEnv(t, func(c *Config) { c.Router = rt })
	ctx := ctxT(t)
	h, err := e.m.Create(ctx, &warrenv1.CreateRequest{Id: "h", Image: "busybox", Harness: &warrenv1.HarnessOptions{MaxChildren: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if !rt.has("h") || h.GetEnv()[EnvHarnessAddr] != "unix:///dev/warren.sock" || h.GetHarness().GetMaxChildren() != 3 {
		t.Fatalf("harness: route %v, %v", rt.has("h"), h)
	}
	hctx := caller.WithHarness(ctx, "h")
	for i := range 3 {
		if _, err := e.m.Create(hctx, &warrenv1.CreateRequest{Id: fmt.Sprintf("k%d", i), Image: "busybox"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.m.Create(hctx, &warrenv1.CreateRequest{Image: "busybox"}); errdefs.CategoryOf(err) != errdefs.Exhausted {
		t.Fatalf("a fourth child: %v, want exhausted", err)
	}
	if _, err := e.m.Delete(hctx, &warrenv1.DeleteRequest{Id: "k0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(hctx, &warrenv1.CreateRequest{Id: "k3", Image: "busybox"}); err != nil {
		t.Fatalf("a child after one was deleted: %v", err)
	}
	list, err := e.m.List(hctx, &warrenv1.ListRequest{})
	if err != nil || len(list.GetSandboxes()) != 3 {
		t.Fatalf("the harness's list: %v %v, want its 3 children", list, err)
	}

	// Delete the harness while more children are being created.
	if _, err := e.m.Delete(hctx, &warrenv1.DeleteRequest{Id: "k1"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = e.m.Create(hctx, &warrenv1.CreateRequest{Id: fmt.Sprintf("r%d", i), Image: "busybox"})
		}()
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "h"}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	all, err := e.m.List(ctx, &warrenv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all.GetSandboxes() {
		t.Errorf("sandbox %s (parent %q) outlived the harness", s.GetId(), s.GetParent())
	}
	if rt.has("h") {
		t.Error("the harness's route is still open")
	}
}

// TestHarnessCallsFindOnlyItsChildren: the server checks a harness's call
// against its children before the daemon runs it; a child deleted and its
// id taken by a sandbox of the node's in between (the trainer chooses ids
// too) must not be reached: the daemon checks the sandbox it finds again.
func TestHarnessCallsFindOnlyItsChildren(t *testing.T) {
	rt := &routes{open: map[string]string{}}
	e := newEnv(t, func(c *Config) { c.Router = rt })
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, &warrenv1.CreateRequest{Id: "h", Image: "busybox", Harness: &warrenv1.HarnessOptions{MaxChildren: 2}}); err != nil {
		t.Fatal(err)
	}
	hctx := caller.WithHarness(ctx, "h")
	if _, err := e.m.Create(hctx, &warrenv1.CreateRequest{Id: "c", Image: "busybox"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Exec(hctx, &warrenv1.ExecRequest{SandboxId: "c", Shell: "true"}); err != nil {
		t.Fatalf("the harness's exec on its child: %v", err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(ctx, &warrenv1.CreateRequest{Id: "c", Image: "busybox"}); err != nil {
		t.Fatal(err)
	}
	denied := func(what string, err error) {
		t.Helper()
		if errdefs.CategoryOf(err) != errdefs.PermissionDenied {
			t.Errorf("%s on the node's sandbox that took its child's id: %v, want permission_denied", what, err)
		}
	}
	_, err := e.m.Exec(hctx, &warrenv1.ExecRequest{SandboxId: "c", Shell: "true"})
	denied("exec", err)
	_, err = e.m.Get(hctx, &warrenv1.GetRequest{Id: "c"})
	denied("get", err)
	_, err = e.m.ListProcesses(hctx, &warrenv1.ListProcessesRequest{SandboxId: "c"})
	denied("list processes", err)
	_, err = e.m.WriteFile(hctx, &warrenv1.WriteFileRequest{SandboxId: "c", Path: "/x", Content: []byte("x")})
	denied("write file", err)
	_, err = e.m.Pause(hctx, &warrenv1.PauseRequest{Id: "c"})
	denied("pause", err)
	_, err = e.m.Delete(hctx, &warrenv1.DeleteRequest{Id: "c"})
	denied("delete", err)
	if sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "c"}); err != nil || sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("the node's sandbox: %v %v", sb, err)
	}
}

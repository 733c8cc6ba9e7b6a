package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestFnCallSandbox: Create with backend "fncall" gives a sandbox taken
// from a pool that behaves as one through the API and the CLI (exec,
// files, limits, delete), reports its backend, refuses what it cannot do
// (hibernate) as Unsupported, survives a daemon crash (adopted, its
// environment kept by the container backend's sweep), and leaves nothing
// behind (the harness's baseline check at the end). An unknown backend
// is Invalid and names the node's.
func TestFnCallSandbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)

	v, err := e.c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// container first (the default), fncall; the VM backends where the
	// node has QEMU (and the daemon the guest agent, for microvm).
	if len(v.Backends) < 2 || v.Backends[0] != "container" || v.Backends[1] != "fncall" {
		t.Errorf("backends: %v", v.Backends)
	}
	_, err = e.c.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Backend: "nosuch"})
	wantCategory(t, err, client.CategoryInvalid, "an unknown backend")
	if err != nil && !strings.Contains(err.Error(), strings.Join(v.Backends, ", ")) {
		t.Errorf("the error does not list the node's backends %v: %v", v.Backends, err)
	}

	sb := e.create(&warrenv1.CreateRequest{Id: "fn1", Backend: "fncall", Hostname: "judge",
		Env: map[string]string{"GREETING": "hi"}, Resources: &warrenv1.Resources{MemoryBytes: 64 << 20, PidsMax: 32}})
	if sb.Backend != "fncall" {
		t.Errorf("backend %q", sb.Backend)
	}
	if out := e.shOK("fn1", "hostname; echo $GREETING; id -u; cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"); out != "judge\nhi\n0\n67108864\n" {
		t.Errorf("exec: %q", out)
	}
	if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "fn1", Path: "/root/in.txt", Content: []byte("data\n")}); err != nil {
		t.Fatal(err)
	}
	if out := e.shOK("fn1", "cat /root/in.txt; echo made > /root/out.txt"); out != "data\n" {
		t.Errorf("file written through the API: %q", out)
	}
	rf, err := e.c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "fn1", Path: "/root/out.txt"})
	if err != nil || string(rf.Content) != "made\n" {
		t.Errorf("read file: %q %v", rf.GetContent(), err)
	}
	_, err = e.c.Hibernate(ctx, "fn1")
	wantCategory(t, err, client.CategoryUnsupported, "hibernating a fncall sandbox")
	out, errOut, code := e.cli(nil, "sandbox", "create", "--backend", "fncall", "--id", "fn2", "--image", imageName)
	if code != 0 {
		t.Fatalf("sandbox create --backend fncall: %d %q %q", code, out, errOut)
	}

	// A crash: the next daemon adopts both, and its container sweep
	// spares their environments.
	e.kill9()
	e.start()
	for _, id := range []string{"fn1", "fn2"} {
		if out := e.shOK(id, "echo alive"); out != "alive\n" {
			t.Errorf("%s after a daemon crash: %q", id, out)
		}
	}
	if out := e.shOK("fn1", "cat /root/out.txt"); out != "made\n" {
		t.Errorf("fn1's file after a daemon crash: %q", out)
	}
	for _, id := range []string{"fn1", "fn2"} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

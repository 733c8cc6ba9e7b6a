package microvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/errdefs"
)

// TestAdoptReachesTheRunningVM: a restarted daemon (a new Backend on the
// same state directory) adopts a VM whose first daemon is gone, its
// background processes running on; a VM paused when its daemon went is
// adopted paused and resumed through the new handle; a second adoption
// beside a live one works too, and the next one unplugs the port of an
// adopter that went; Destroy through the adopted handle stops
// QEMU and removes the VM's directory, after which Adopt is NotFound.
func TestAdoptReachesTheRunningVM(t *testing.T) {
	cfg := testConfig(t)
	state := t.TempDir()
	newBackend := backendAt(t, cfg, state)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := newBackend().Create(ctx, backend.Spec{ID: "adopt1", Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}},
		MemoryBytes: 128 << 20, Env: []string{"PATH=/bin", "WHO=kept"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	pid, err := sb.(backend.Background).StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", "echo $WHO; read x; echo got $x"}, Env: []string{"PATH=/bin", "WHO=bg"}},
		backend.BackgroundOpts{OutputCap: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.(backend.Pauser).Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	// The first daemon goes: its connection to the agent closes, the VM
	// runs on (paused).
	v := sb.(*sandbox).vm
	v.sess.Close()
	v.conn.Close()

	sb2, err := newBackend().Adopt(ctx, "adopt1", sb.State())
	if err != nil {
		t.Fatal(err)
	}
	if err := sb2.(backend.Pauser).Resume(ctx, backend.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	h2 := sb2.(backend.Background)
	list, err := h2.ListBackground(ctx)
	if err != nil || len(list) != 1 || list[0].Pid != pid || list[0].Exited {
		t.Fatalf("listed after adopt: %+v %v", list, err)
	}
	// The sandbox's defaults came along in the state.
	if r := conformance.Exec(t, sb2, backend.ProcSpec{Argv: []string{"sh", "-c", "echo $WHO"}, Env: []string{"PATH=/bin", "WHO=kept"}}, ""); r.Stdout != "kept\n" {
		t.Fatalf("exec in the adopted VM: %+v", r)
	}

	// A second adoption, beside the live first.
	sb3, err := newBackend().Adopt(ctx, "adopt1", sb2.State())
	if err != nil {
		t.Fatal(err)
	}
	w, err := sb3.(backend.Background).OpenStdin(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("y\n"))
	w.Close()
	out, _, _, ex := follow(t, h2, pid, 0, 0)
	if out != "bg\ngot y\n" || ex.Code != 0 {
		t.Fatalf("the background process across adoptions: %q %+v", out, ex)
	}

	// The first adopter goes too: the next adoption unplugs its port
	// (one without a host for longer than staleAfter) and the VM serves
	// the others on.
	v2 := sb2.(*sandbox).vm
	v2.sess.Close()
	v2.conn.Close()
	stale := filepath.Join(state, "vms", "adopt1", "a1.sock")
	old := time.Now().Add(-2 * staleAfter)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	var chardevs []struct {
		Label    string `json:"label"`
		Filename string `json:"filename"`
	}
	deadline := time.Now().Add(time.Minute)
	for {
		// QEMU sees the client go asynchronously.
		if err := sb3.(*sandbox).vm.qmpArgs(ctx, "query-chardev", nil, &chardevs); err != nil {
			t.Fatal(err)
		}
		gone := false
		for _, c := range chardevs {
			gone = gone || c.Label == "agent1" && strings.HasPrefix(c.Filename, "disconnected:")
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first adopter's port still has its client: %+v", chardevs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sb4, err := newBackend().Adopt(ctx, "adopt1", sb.State())
	if err != nil {
		t.Fatal(err)
	}
	// The stale port went, and its number was taken again: two adopted
	// ports, both with their client.
	if err := sb4.(*sandbox).vm.qmpArgs(ctx, "query-chardev", nil, &chardevs); err != nil {
		t.Fatal(err)
	}
	ports := 0
	for _, c := range chardevs {
		if strings.HasPrefix(c.Label, "agent") && c.Label != "agent" {
			ports++
			if strings.HasPrefix(c.Filename, "disconnected:") {
				t.Fatalf("a port without its client after the next adoption: %+v", chardevs)
			}
		}
	}
	if ports != 2 {
		t.Fatalf("adopted ports: %+v, want the two live ones", chardevs)
	}
	for _, s := range []backend.Sandbox{sb3, sb4} {
		if r := conformance.Exec(t, s, backend.ProcSpec{Argv: []string{"echo", "on"}}, ""); r.Stdout != "on\n" {
			t.Fatalf("exec after an unplug: %+v", r)
		}
	}

	qemu := sb3.(*sandbox).vm.Pid()
	if err := sb3.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(qemu, 0); err == nil {
		// Our child (the first handle's): a zombie until that handle's
		// wait, which its Exited follows.
		select {
		case <-sb.Exited().Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("QEMU %d runs after Destroy of an adopted VM", qemu)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "vms", "adopt1")); !os.IsNotExist(err) {
		t.Fatalf("VM directory after Destroy: %v", err)
	}
	select {
	case <-sb2.Exited().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the other adopted handle did not see its VM end")
	}
	if _, err := newBackend().Adopt(ctx, "adopt1", sb.State()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("adopt of a destroyed VM: %v, want not found", err)
	}
}

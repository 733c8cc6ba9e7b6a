package microvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
// beside a live one works too; Destroy through the adopted handle stops
// QEMU and removes the VM's directory, after which Adopt is NotFound.
func TestAdoptReachesTheRunningVM(t *testing.T) {
	cfg := testConfig(t)
	state := t.TempDir()
	newBackend := func() *Backend {
		b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
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

package microvm

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// TestCreateGivesUpOnABootThatNeverAnswers: a guest whose agent never
// answers (busybox's init stands in for the agent: it boots and serves
// nothing) fails the create once the boot bound has passed, Unavailable
// and naming the bound, and leaves no QEMU and no VM directory.
func TestCreateGivesUpOnABootThatNeverAnswers(t *testing.T) {
	cfg := testConfig(t)
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skipf("no busybox (busybox-static) to stand in for a mute guest: %v", err)
	}
	old := bootTimeout
	bootTimeout = 5 * time.Second
	t.Cleanup(func() { bootTimeout = old })
	state := t.TempDir()
	b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: busybox})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_, err = b.Create(context.Background(), backend.Spec{ID: "mute", Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}},
		MemoryBytes: 128 << 20, PidsMax: 64})
	took := time.Since(t0)
	t.Logf("create: %v after %v", err, took)
	if errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "did not answer within 5s") {
		t.Fatalf("create of a VM whose agent never answers: %v, want Unavailable naming the 5 s bound", err)
	}
	if took > time.Minute {
		t.Errorf("the create gave up after %v, want about the bound", took)
	}
	if left := leftovers(state); len(left) != 0 {
		t.Errorf("left after the failed create: %v", left)
	}
}

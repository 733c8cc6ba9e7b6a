package microvm

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/erofs"
)

// TestBalloonReturnsFreedMemory: memory the guest touched and then freed
// goes back to the node. The guest writes 128 MiB to a file on its tmpfs
// (QEMU's anonymous memory grows by it) and removes it; the balloon's
// free page reporting has QEMU discard the freed blocks, so its
// anonymous memory on the node falls back by most of the 128 MiB.
// Without the balloon it stays (checked once by booting with NoBalloon).
func TestBalloonReturnsFreedMemory(t *testing.T) {
	cfg := testConfig(t)
	cfg.MemoryMB = 512
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	vm, err := Boot(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	anon := func() int64 {
		t.Helper()
		u, err := processMemory(vm.Pid())
		if err != nil {
			t.Fatal(err)
		}
		return int64(u.Anon)
	}
	run := func(script string) {
		t.Helper()
		r, err := vm.Exec(ctx, []string{"sh", "-c", script}, nil)
		if err != nil || r.Exit.Code != 0 {
			t.Fatalf("%s: %v %+v %s", script, err, r.Exit, r.Stderr)
		}
	}
	const mib = 1 << 20
	before := anon()
	run("head -c 134217728 /dev/zero > /root/big && sync")
	full := anon()
	t.Logf("QEMU anon: %d MiB booted, %d MiB with 128 MiB written in the guest", before/mib, full/mib)
	if full < before+100*mib {
		t.Fatalf("writing 128 MiB in the guest grew QEMU's anonymous memory by %d MiB only", (full-before)/mib)
	}
	run("rm /root/big")
	// Reporting runs ~2 s after the frees, and a loaded TCG guest is
	// slow: poll with a generous deadline.
	deadline := time.Now().Add(90 * time.Second)
	for {
		now := anon()
		if full-now >= 96*mib {
			t.Logf("QEMU anon after the guest freed it: %d MiB (%d MiB returned)", now/mib, (full-now)/mib)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU anon still %d MiB 90 s after the guest freed 128 MiB (was %d MiB full)", now/mib, full/mib)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestPauseReclaimReturnsTheGuestsPageCache: a pause with reclaim has the
// guest drop its page cache before it stops, and the balloon returns it:
// after the sandbox read a 64 MiB file of its image (the guest's page
// cache, QEMU's anonymous memory on the node), the pause reports After
// lower than Before by most of it, and the VM is paused. A pause without
// reclaim reports After equal to Before.
func TestPauseReclaimReturnsTheGuestsPageCache(t *testing.T) {
	cfg := testConfig(t)
	mk, err := erofs.FindMkfs()
	if err != nil {
		t.Skipf("no mkfs.erofs: %v", err)
	}
	dir := t.TempDir()
	big := make([]byte, 64<<20)
	_, _ = rand.Read(big)
	if err := os.WriteFile(filepath.Join(dir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(t.TempDir(), "big.erofs")
	if out, err := exec.Command(mk.Path, layer, dir).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	b, err := New(Options{StateDir: t.TempDir(), QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sb, err := b.Create(ctx, backend.Spec{ID: "reclaim-" + filepath.Base(dir),
		Layers:      []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}, {Digest: "sha256:big", Blob: layer}},
		MemoryBytes: 128 << 20, PidsMax: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"sh", "-c", "cat /big > /dev/null && echo read"}}, "")
	if strings.TrimSpace(r.Stdout) != "read" {
		t.Fatalf("read the layer's file: %+v", r)
	}
	p := sb.(backend.Pauser)
	st, err := p.Pause(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	// Anonymous memory is the guest's (the file part is QEMU's code,
	// whose share moves with the other QEMUs of the node).
	t.Logf("pause with reclaim: guest memory on the node before %d MiB, after %d MiB (reclaim %v, freeze %v)", st.Before.Anon/mib, st.After.Anon/mib, st.Reclaim, st.Freeze)
	if st.After.Anon+48*mib > st.Before.Anon {
		t.Fatalf("pause with reclaim returned %d MiB of the 64 MiB file the guest cached", (int64(st.Before.Anon)-int64(st.After.Anon))/mib)
	}
	if err := p.Resume(ctx, backend.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err = p.Pause(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.After != st.Before || st.Reclaim != 0 {
		t.Fatalf("pause without reclaim: %+v", st)
	}
}

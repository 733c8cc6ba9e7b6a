package microvm

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/errdefs"
)

// counterScript counts in the guest, a number a tenth of a second, into
// /tmp/count (renamed into place: a reader never sees it half written).
const counterScript = "i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/count; sleep 0.1; done"

// sh runs a shell command in sb to its end and returns its stdout.
func sh(t *testing.T, sb backend.Sandbox, cmd string) string {
	t.Helper()
	r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"sh", "-c", cmd}}, "")
	if r.Status.Code != 0 {
		t.Fatalf("%q: %+v", cmd, r)
	}
	return r.Stdout
}

// count reads the counter's latest number.
func count(t *testing.T, sb backend.Sandbox) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(sh(t, sb, "cat /tmp/count 2>/dev/null || echo 0")))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// countsPast waits (bounded) until the counter in sb is past n.
func countsPast(t *testing.T, sb backend.Sandbox, n int) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c := count(t, sb)
		if c > n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: the counter stays at %d (want past %d)", sb.ID(), c, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// snapshotBackend is a microvm backend on a state directory of the test's.
func snapshotBackend(t *testing.T) (*Backend, backend.Spec, string) {
	t.Helper()
	cfg := testConfig(t)
	state := t.TempDir()
	b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent})
	if err != nil {
		t.Fatal(err)
	}
	// A 256 MiB VM: the sandbox's 128 MiB and the guest's own.
	spec := backend.Spec{Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}}, MemoryBytes: 128 << 20, PidsMax: 64, CPUMillis: 1000}
	return b, spec, state
}

// leftovers are the QEMU processes and VM directories of state.
func leftovers(state string) []string {
	var out []string
	ents, _ := os.ReadDir(filepath.Join(state, "vms"))
	for _, e := range ents {
		out = append(out, "vm dir "+e.Name())
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), state) {
			out = append(out, "process "+p.Name())
		}
	}
	return out
}

// TestCheckpointRestoreAndForkOfAVM: a checkpoint saves a running VM to
// its directory and ends its QEMU (Exited done); restores of it (the
// sandbox itself, and a fork under another id, from the same files) run
// on from the saved moment: the background counter keeps counting from
// where it was, under its pid, files written before are there, and the
// two diverge: each writes its own files, and their random numbers differ
// (the agent reseeded each). The checkpoint is only read; Destroy leaves
// no QEMU and no VM directory.
func TestCheckpointRestoreAndForkOfAVM(t *testing.T) {
	b, spec, state := snapshotBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec.ID = "snap"
	src, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Destroy(context.Background())
	bg := src.(backend.Background)
	pid, err := bg.StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", counterScript}}, backend.BackgroundOpts{OutputCap: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, src, "echo before > /root/f")
	before := countsPast(t, src, 3)
	qemu := src.(*sandbox).vm.Pid()
	use, err := src.(backend.MemoryReporter).MemoryUse()
	if err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(t.TempDir(), "ckpt")
	t0 := time.Now()
	if err := src.(backend.Checkpointer).Checkpoint(ctx, dir); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	fi, err := os.Stat(filepath.Join(dir, stateFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint of a %d MiB VM (QEMU's memory %d MiB): %v, state file %d MiB", 256, use.Bytes>>20, took, fi.Size()>>20)
	select {
	case <-src.Exited().Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Exited not done after the checkpoint")
	}
	if err := syscall.Kill(qemu, 0); err == nil {
		t.Fatalf("QEMU %d runs after the checkpoint", qemu)
	}
	if err := src.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(state); len(left) > 0 {
		t.Fatalf("after the checkpoint and destroy: %v", left)
	}

	// On disk for 5 s at least: the guest's clock, which stood still
	// meanwhile, must be set again.
	time.Sleep(time.Until(t0.Add(5 * time.Second)))
	again := restoreAs(ctx, t, b, spec, "snap", dir)
	lazy := spec
	lazy.LazyPages = true // eager all the same, and said why
	fork := restoreAs(ctx, t, b, lazy, "snap-fork", dir)
	for _, sb := range []backend.Sandbox{again, fork} {
		if c := count(t, sb); c < before {
			t.Fatalf("%s: the counter restarted: %d after %d", sb.ID(), c, before)
		}
		countsPast(t, sb, count(t, sb))
		if f := sh(t, sb, "cat /root/f"); f != "before\n" {
			t.Fatalf("%s: the file written before the checkpoint: %q", sb.ID(), f)
		}
		ps, err := sb.(backend.Background).ListBackground(ctx)
		if err != nil || len(ps) != 1 || ps[0].Pid != pid || ps[0].Exited {
			t.Fatalf("%s: background processes %+v %v, want the counter %d running", sb.ID(), ps, err, pid)
		}
	}
	sh(t, again, "echo again > /root/f")
	sh(t, fork, "echo fork > /root/f")
	if a, f := sh(t, again, "cat /root/f"), sh(t, fork, "cat /root/f"); a != "again\n" || f != "fork\n" {
		t.Fatalf("the restores share their files: %q %q", a, f)
	}
	random := "head -c 16 /dev/urandom | od -An -tx1"
	if a, f := sh(t, again, random), sh(t, fork, random); a == f {
		t.Fatalf("two restores of one checkpoint draw the same random numbers: %s", a)
	}
	// The guest's clock is the node's again.
	for _, sb := range []backend.Sandbox{again, fork} {
		d, err := strconv.ParseFloat(strings.TrimSpace(sh(t, sb, "date +%s")), 64)
		if off := float64(time.Now().UnixNano())/1e9 - d; err != nil || off > 3 || off < -3 {
			t.Fatalf("%s: the guest's clock is %.0fs off the node's (%v)", sb.ID(), off, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, stateFile)); err != nil {
		t.Fatalf("the restores took the checkpoint: %v", err)
	}
	for _, sb := range []backend.Sandbox{again, fork} {
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if left := leftovers(state); len(left) > 0 {
		t.Fatalf("after destroy: %v", left)
	}
}

// TestFailedCheckpointLeavesTheVMRunning: a VM with a writable disk other
// than its writable layer's is refused (unsupported: the checkpoint copies
// only that one); a
// checkpoint whose state file cannot be written (its directory on a 1 MiB
// tmpfs) fails after the VM was stopped; either way the VM runs on as it
// was: its counter counts and its agent answers on the same session.
func TestFailedCheckpointLeavesTheVMRunning(t *testing.T) {
	b, spec, _ := snapshotBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec.ID = "snap-fail"
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	if _, err := sb.(backend.Background).StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", counterScript}}, backend.BackgroundOpts{OutputCap: 1 << 16}); err != nil {
		t.Fatal(err)
	}
	n := countsPast(t, sb, 1)
	// A writable disk that is not the VM's own is refused before
	// anything is stopped.
	scratch := filepath.Join(t.TempDir(), "scratch.img")
	if err := os.WriteFile(scratch, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := sb.(*sandbox).vm.qmpArgs(ctx, "human-monitor-command", map[string]any{"command-line": "drive_add 0 if=none,id=scratch,format=raw,file=" + scratch}, nil); err != nil {
		t.Fatal(err)
	}
	err = sb.(backend.Checkpointer).Checkpoint(ctx, filepath.Join(t.TempDir(), "ckpt"))
	if errdefs.CategoryOf(err) != errdefs.Unsupported || !strings.Contains(err.Error(), "writable disk") {
		t.Fatalf("checkpoint of a VM with a writable disk: %v, want unsupported", err)
	}
	if err := sb.(*sandbox).vm.qmpArgs(ctx, "human-monitor-command", map[string]any{"command-line": "drive_del scratch"}, nil); err != nil {
		t.Fatal(err)
	}
	n = countsPast(t, sb, n)
	small := t.TempDir()
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(small, syscall.MNT_DETACH)
	err = sb.(backend.Checkpointer).Checkpoint(ctx, filepath.Join(small, "ckpt"))
	if err == nil {
		t.Fatal("a checkpoint into 1 MiB succeeded")
	}
	t.Logf("checkpoint into 1 MiB: %v", err)
	if errdefs.CategoryOf(err) == errdefs.Unsupported {
		t.Fatalf("category %v", errdefs.CategoryOf(err))
	}
	select {
	case <-sb.Exited().Done():
		t.Fatal("the VM ended with its failed checkpoint")
	default:
	}
	countsPast(t, sb, n)
	if ents, _ := os.ReadDir(filepath.Join(small, "ckpt")); len(ents) > 0 {
		t.Errorf("a failed checkpoint left %d files", len(ents))
	}
}

// TestCheckpointOfAnAdoptedVM: a VM adopted by another handle (a daemon
// restart: a hot-plugged agent port, a Config read back from QEMU's
// command line) checkpoints through that handle, and the restore (which
// has the same ports, the adoption's included) counts on.
func TestCheckpointOfAnAdoptedVM(t *testing.T) {
	b, spec, state := snapshotBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec.ID = "snap-adopted"
	first, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Destroy(context.Background())
	if _, err := first.(backend.Background).StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", counterScript}}, backend.BackgroundOpts{OutputCap: 1 << 16}); err != nil {
		t.Fatal(err)
	}
	sh(t, first, "echo before > /root/f")
	n := countsPast(t, first, 2)
	adopted, err := b.Adopt(ctx, spec.ID, first.State())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := adopted.(backend.Checkpointer).Checkpoint(ctx, dir); err != nil {
		t.Fatal(err)
	}
	sv, err := readSaved(dir)
	if err != nil {
		t.Fatal(err)
	}
	if sv.MemoryMB != 256 || sv.CPUs != 1 || sv.LayerCount != 1 || sv.SandboxMemory != 128<<20 || len(sv.Ports) != 1 {
		t.Fatalf("the adopted VM's saved settings: %+v", sv)
	}
	_ = adopted.Destroy(ctx)
	_ = first.Destroy(ctx)
	s := spec
	s.Restore = dir
	sb, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	countsPast(t, sb, n)
	if f := sh(t, sb, "cat /root/f"); f != "before\n" {
		t.Fatalf("the file written before the checkpoint: %q", f)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(state); len(left) > 0 {
		t.Fatalf("after destroy: %v", left)
	}
}

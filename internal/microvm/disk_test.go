package microvm

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
)

// TestDiskUsageFollowsTheVMsDisk: a VM with a disk limit reports what its
// writable layer takes of the node's disk (backend.DiskUser): the blocks
// of its sparse image, which grow with what the sandbox writes and shrink
// when it deletes (the guest discards, QEMU punches holes); a VM without
// a limit takes nothing on the node's disk.
func TestDiskUsageFollowsTheVMsDisk(t *testing.T) {
	cfg := testConfig(t)
	b, err := New(Options{StateDir: t.TempDir(), QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	layers := []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}}
	sb, err := b.Create(ctx, backend.Spec{ID: "vmdisk", Layers: layers, DiskBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	usage := func() uint64 {
		t.Helper()
		u, err := sb.(backend.DiskUser).DiskUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return u.Bytes
	}
	before := usage()
	run := func(script string) {
		t.Helper()
		r, err := sb.(*sandbox).vm.Exec(ctx, []string{"sh", "-c", script}, nil)
		if err != nil || r.Exit.Code != 0 {
			t.Fatalf("%s: %+v %v", script, r, err)
		}
	}
	run("dd if=/dev/zero of=/root/f bs=1M count=16 2>/dev/null && sync")
	if u := usage(); u < before+16<<20 {
		t.Fatalf("after writing 16 MiB: %d bytes (before %d)", u, before)
	}
	run("rm /root/f && sync")
	// The discards reach the image as the guest issues them: poll.
	for deadline := time.Now().Add(60 * time.Second); usage() > before+4<<20; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after deleting it: %d bytes (before %d)", usage(), before)
		}
	}
	// Without one the layer is guest memory (no boot needed to say so).
	if u, err := (&sandbox{}).DiskUsage(ctx); err != nil || u.Bytes != 0 {
		t.Fatalf("a VM without a disk: %+v %v", u, err)
	}
}

// TestCheckpointCopiesTheVMsDisk: a VM whose writable layer is on a disk
// of its own (a disk limit) checkpoints with a copy of that disk, sparse
// (its blocks are what the guest wrote, not the limit), taken while the
// VM is stopped: it holds what the guest synced (read on the node), and
// with the guest's memory, what it had not (a file still in its page
// cache); a restore and a fork each get their own copy: the files written
// before the checkpoint are there, and what each writes after goes to its
// own disk image only. A restored VM
// checkpoints and restores again, its disk with it, and its QEMU holds
// about what the original did. Destroy leaves no QEMU and no file.
func TestCheckpointCopiesTheVMsDisk(t *testing.T) {
	b, spec, state := snapshotBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	spec.ID, spec.DiskBytes = "snapdisk", 256<<20
	src, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Destroy(context.Background())
	// Markers found in disk images by their bytes: 16 letters each.
	marker := func(s string) string { return strings.Repeat(s, 16/len(s)) }
	on := func(img, m string) bool {
		t.Helper()
		b, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Contains(b, []byte(m))
	}
	sh(t, src, "echo "+marker("before")+" > /root/f && head -c 16777216 /dev/urandom > /root/big && sync")
	sum := sh(t, src, "md5sum /root/big")
	sh(t, src, "echo unsynced > /root/g")
	use, err := processMemory(src.(*sandbox).vm.Pid())
	if err != nil {
		t.Fatal(err)
	}

	checkpoint := func(sb backend.Sandbox, synced string) string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "ckpt")
		t0 := time.Now()
		if err := sb.(backend.Checkpointer).Checkpoint(ctx, dir); err != nil {
			t.Fatal(err)
		}
		var st, dst unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, diskFile), &dst); err != nil {
			t.Fatal(err)
		}
		_ = unix.Stat(filepath.Join(dir, stateFile), &st)
		if !on(filepath.Join(dir, diskFile), synced) {
			t.Fatalf("the disk's copy lacks the file synced before the checkpoint")
		}
		t.Logf("checkpoint of %s: %v; state %d MiB, disk copy %d MiB of %d MiB", sb.ID(), time.Since(t0), st.Size>>20, dst.Blocks*512>>20, dst.Size>>20)
		if dst.Size != 256<<20 || dst.Blocks*512 > 64<<20 || dst.Blocks*512 < 16<<20 {
			t.Fatalf("the disk's copy: %d bytes, %d allocated; want 256 MiB holding the 16 MiB written, sparse", dst.Size, dst.Blocks*512)
		}
		// What the disk's copy costs alone (the checkpoint takes another
		// in the same way).
		t1 := time.Now()
		how, err := copyDisk(filepath.Join(dir, diskFile), filepath.Join(t.TempDir(), "copy.img"))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("a copy of the disk (%s): %v", how, time.Since(t1))
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	// The migration succeeds and the disk's copy fails (a file is in
	// its place): the VM runs on with its disk writable again (the
	// migration's end released QEMU's images and "cont" takes them
	// back), and the checkpoint leaves nothing behind.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, diskFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := src.(backend.Checkpointer).Checkpoint(ctx, bad); err == nil || !strings.Contains(err.Error(), "disk image's copy") {
		t.Fatalf("a checkpoint whose disk copy failed: %v, want the copy's error", err)
	}
	if ents, _ := os.ReadDir(bad); len(ents) != 0 {
		t.Fatalf("the failed checkpoint left %d files", len(ents))
	}
	if out := sh(t, src, "echo "+marker("during")+" > /root/h && sync && cat /root/h && rm /root/h && sync"); out != marker("during")+"\n" {
		t.Fatalf("after a failed checkpoint the VM's disk: %q", out)
	}
	dir := checkpoint(src, marker("before"))
	if left := leftovers(state); len(left) > 0 {
		t.Fatalf("after the checkpoint and destroy: %v", left)
	}
	again, fork := restoreAs(ctx, t, b, spec, "snapdisk", dir), restoreAs(ctx, t, b, spec, "snapdisk-fork", dir)
	for _, sb := range []backend.Sandbox{again, fork} {
		if f, s := sh(t, sb, "cat /root/f /root/g"), sh(t, sb, "md5sum /root/big"); f != marker("before")+"\nunsynced\n" || s != sum {
			t.Fatalf("%s: the files written before the checkpoint: %q, %q (want %q)", sb.ID(), f, s, sum)
		}
		if !sb.(*sandbox).disk {
			t.Fatalf("%s: restored without its disk", sb.ID())
		}
		r, err := processMemory(sb.(*sandbox).vm.Pid())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: QEMU's memory %d MiB (anon %d), the original's %d MiB (anon %d)", sb.ID(), r.Bytes>>20, r.Anon>>20, use.Bytes>>20, use.Anon>>20)
		if r.Anon > use.Anon+64<<20 {
			t.Errorf("%s: the restored QEMU holds %d MiB anonymous memory, the original %d MiB", sb.ID(), r.Anon>>20, use.Anon>>20)
		}
	}
	sh(t, again, "echo "+marker("again")+" > /root/f && sync")
	sh(t, fork, "echo "+marker("fork")+" > /root/f && rm /root/big && sync")
	if a, f := sh(t, again, "cat /root/f; ls /root"), sh(t, fork, "cat /root/f; ls /root"); a != marker("again")+"\nbig\nf\ng\n" || f != marker("fork")+"\nf\ng\n" {
		t.Fatalf("the restores share their files: %q %q", a, f)
	}
	ai, fi := diskImage(again.(*sandbox).vm.cfg.Dir), diskImage(fork.(*sandbox).vm.cfg.Dir)
	if !on(ai, marker("again")) || on(ai, marker("fork")) || !on(fi, marker("fork")) || on(fi, marker("again")) || on(filepath.Join(dir, diskFile), marker("fork")) {
		t.Fatal("the restores' writes are not each on its own disk image only")
	}
	if err := fork.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	// Checkpoint -> restore -> checkpoint -> restore.
	third := restoreAs(ctx, t, b, spec, "snapdisk", checkpoint(again, marker("again")))
	if f, s := sh(t, third, "cat /root/f"), sh(t, third, "md5sum /root/big"); f != marker("again")+"\n" || s != sum {
		t.Fatalf("the second restore's files: %q, %q", f, s)
	}
	if err := third.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(state); len(left) > 0 {
		t.Fatalf("after destroy: %v", left)
	}
	if _, err := os.Stat(filepath.Join(dir, diskFile)); err != nil {
		t.Fatalf("the restores took the checkpoint's disk: %v", err)
	}
}

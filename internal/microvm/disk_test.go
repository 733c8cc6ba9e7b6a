package microvm

import (
	"context"
	"testing"
	"time"

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

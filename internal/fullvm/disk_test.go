package fullvm

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
)

// TestFullVMDiskLimitIsTheRootsUpper: with a disk limit the guest's root
// is an overlay whose upper is the VM's disk of the limit's size (the
// image's warren-root, before systemd): writing past it fails with ENOSPC
// in the guest, the sandbox stays usable, the node's disk holds only
// what was written (DiskUsage, after an adoption too), and Destroy leaves
// no file.
func TestFullVMDiskLimitIsTheRootsUpper(t *testing.T) {
	img := testImage(t)
	state := t.TempDir()
	opts := Options{StateDir: state, CgroupParent: testCgroupParent, ImageDir: img}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb, err := b.Create(ctx, backend.Spec{ID: "fvdisk", Layers: testLayers, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	sh := func(sb backend.Sandbox, script string) conformance.Result {
		return conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", script}}, "")
	}
	if r := sh(sb, "findmnt -n -o FSTYPE,OPTIONS / && findmnt -n -o SIZE /run/warren-upper"); !strings.HasPrefix(r.Stdout, "overlay ") ||
		!strings.Contains(r.Stdout, "upperdir=/run/warren-upper/upper") {
		t.Fatalf("the root with a disk limit: %+v, want an overlay over the upper disk", r)
	}
	r := sh(sb, "dd if=/dev/zero of=/root/fill bs=1M count=100 2>&1; sync")
	if !strings.Contains(r.Stdout, "No space left") {
		t.Fatalf("100 MiB under a 64 MiB disk limit: %+v", r)
	}
	use, err := sb.(backend.DiskUser).DiskUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if use.Bytes < 48<<20 || use.Bytes > 72<<20 {
		t.Fatalf("DiskUsage after filling a 64 MiB disk: %d bytes", use.Bytes)
	}
	if r := sh(sb, "rm /root/fill && echo ok > /root/after && cat /root/after"); r.Stdout != "ok\n" {
		t.Fatalf("after filling the disk: %+v", r)
	}
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	sb2, err := b2.Adopt(ctx, "fvdisk", sb.State())
	if err != nil {
		t.Fatal(err)
	}
	if use, err := sb2.(backend.DiskUser).DiskUsage(ctx); err != nil || use.Bytes == 0 {
		t.Fatalf("DiskUsage after an adoption: %+v %v", use, err)
	}
	if err := sb2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(state + "/vms"); len(ents) != 0 {
		t.Fatalf("after Destroy the state directory holds %d VM directories", len(ents))
	}
}

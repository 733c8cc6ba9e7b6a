package microvm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// A VM with a disk limit gets its writable layer on a disk of its own: a
// sparse raw file of the limit's size in the VM's directory, formatted
// ext4 here (mkfs.ext4 takes milliseconds; the guest has no mkfs, and
// the initramfs need not carry one) and given to the guest as a virtio
// block device, on which the agent puts the overlay's upper directory.
// Filling it fails with ENOSPC in the guest and touches nothing else. A
// VM without a limit keeps a tmpfs upper (guest memory), which boots
// without ext4's 2 MB module.

// minDiskBytes is the smallest disk limit, the container backend's.
const minDiskBytes = 16 << 20

var _ backend.DiskUser = (*sandbox)(nil)

// diskImage is the disk image of the VM whose directory is dir; it goes
// with the directory.
func diskImage(dir string) string { return filepath.Join(dir, "disk.img") }

// makeDisk creates img, size bytes, sparse, as ext4.
func makeDisk(img string, size int64) error {
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: create disk image")
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: size disk image")
	}
	// As the container backend's: no journal (the layer dies with the
	// sandbox), no reserved blocks, lazy inode tables (mkfs in a few
	// milliseconds; the guest's kernel zeroes them later, idle).
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=1",
		"-m", "0", img).CombinedOutput()
	if err != nil {
		return errdefs.Internalf("microvm: mkfs.ext4: %v: %s", err, out)
	}
	return nil
}

// DiskUsage is what the VM's writable layer takes of the node's disk
// (backend.DiskUser): the blocks its disk image holds (sparse: at most
// its limit; the guest gives deleted blocks back), one stat. Without a
// disk the layer is guest memory: nothing on the node's disk.
func (s *sandbox) DiskUsage(ctx context.Context) (backend.LayerUsage, error) {
	if !s.disk {
		return backend.LayerUsage{}, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(diskImage(s.vm.cfg.Dir), &st); err != nil {
		return backend.LayerUsage{}, errdefs.Wrap(errdefs.Internal, err, "microvm: stat disk image")
	}
	return backend.LayerUsage{Bytes: uint64(st.Blocks) * 512, Inodes: 1}, nil
}

package microvm

import (
	"context"
	"fmt"
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

// copyDisk copies the disk image src to dst (created), keeping it sparse:
// a reflink (FICLONE: one metadata operation, the blocks shared until
// either side writes them) where the filesystem has them (btrfs, XFS),
// else each data extent (SEEK_DATA/SEEK_HOLE) copied in the kernel
// (copy_file_range) and the holes left holes: a 256 MiB image holding
// 20 MiB copies 20 MiB. It says which it did.
func copyDisk(src, dst string) (how string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "microvm: open the disk image to copy")
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "microvm: create the disk image's copy")
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = errdefs.Wrap(errdefs.Internal, cerr, "microvm: copy the disk image")
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return "reflink", nil
	}
	fi, err := in.Stat()
	if err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "microvm: stat the disk image")
	}
	if err := copyExtents(in, out, fi.Size()); err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "microvm: copy the disk image")
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "microvm: size the disk image's copy")
	}
	return "sparse copy", nil
}

// copyExtents copies in's data extents (up to size) to the same offsets
// of out.
func copyExtents(in, out *os.File, size int64) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			return nil // only a hole follows
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("SEEK_HOLE: %w", err)
		}
		for src, dst := data, data; src < hole; {
			n, err := unix.CopyFileRange(int(in.Fd()), &src, int(out.Fd()), &dst, int(hole-src), 0)
			if err != nil {
				return fmt.Errorf("copy_file_range: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("copy_file_range: the image ended at %d", src)
			}
		}
		off = hole
	}
	return nil
}

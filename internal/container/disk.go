package container

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// A sandbox with a disk limit gets its writable layer on a filesystem of
// its own: a sparse ext4 image on a loop device, mounted at the sandbox's
// state directory. Filling it gives ENOSPC inside the sandbox and touches
// nothing else on the node. (Project quotas would be cheaper, but need
// CONFIG_QUOTA, which kernels such as this one lack.) The loop device is
// configured with AUTOCLEAR, so unmounting the filesystem frees it: there
// is nothing else to leak.

const minDiskBytes = 16 << 20

// mountDisk creates a size-byte ext4 image file img and mounts it on dir.
func mountDisk(img, dir string, size int64) error {
	if size < minDiskBytes {
		return errdefs.Invalidf("disk limit %d bytes is below the minimum of %d", size, minDiskBytes)
	}
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fsErr(err, "create disk image")
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		os.Remove(img)
		return fsErr(err, "size disk image")
	}
	// No journal: the layer dies with the sandbox, and a journal costs
	// writes and space. lazy_itable_init keeps mkfs at a few milliseconds.
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=1",
		"-m", "0", img).CombinedOutput()
	if err != nil {
		os.Remove(img)
		return errdefs.Internalf("mkfs.ext4: %v: %s", err, out)
	}
	loop, err := attachLoop(f)
	if err != nil {
		os.Remove(img)
		return err
	}
	// AUTOCLEAR frees the device on its last close: keep our handle open
	// until the mount holds its own reference, and closing it after a
	// failed mount frees the device.
	defer loop.Close()
	if err := unix.Mount(loop.Name(), dir, "ext4", unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		os.Remove(img)
		return fsErr(err, "mount disk image")
	}
	return nil
}

// unmountDisk undoes mountDisk; it is a no-op when dir is no mount.
func unmountDisk(img, dir string) error {
	err := unmount(dir)
	if rerr := os.Remove(img); rerr != nil && !os.IsNotExist(rerr) && err == nil {
		err = rerr
	}
	return err
}

// attachLoop binds img to a free loop device and returns the device, open.
func attachLoop(img *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "loop devices")
	}
	defer ctl.Close()
	// Two creates can be handed the same free device; the loser's
	// LOOP_CONFIGURE fails with EBUSY and it asks again.
	for attempt := 0; attempt < 100; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Exhausted, err, "no free loop device")
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "open "+dev)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], filepath.Base(img.Name()))
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if err == nil {
			return lf, nil
		}
		lf.Close()
		if err != unix.EBUSY {
			return nil, errdefs.Wrap(errdefs.Internal, err, "configure "+dev)
		}
		time.Sleep(time.Millisecond)
	}
	return nil, errdefs.Exhaustedf("could not claim a loop device")
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A scratch disk gives the private daemon a block device of its own: an
// ext4 filesystem in a sparse file below the run's scratch directory,
// mounted through a loop device (direct I/O, so the host's page cache
// holds no second copy) at <tmp>/disk, with the state directory at
// <tmp>/disk/state. /proc/diskstats of that loop device then counts the
// benchmark's writes only, not those of whatever else runs on the host.

// mountScratchDisk creates and mounts the scratch disk of size bytes.
func (e *Env) mountScratchDisk(ctx context.Context, size int64, readAheadKB int) error {
	img := filepath.Join(e.Tmp, "disk.img")
	dir := filepath.Join(e.Tmp, "disk")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("scratch disk image: %w", err)
	}
	e.logf("scratch disk: ext4 of %d GiB (sparse) in %s, mounted through a loop device at %s", size>>30, img, dir)
	// Inode tables and the journal are initialised now, so that no
	// ext4lazyinit writes land in the measurements.
	if err := runCmd(ctx, "mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", img); err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	if err := runCmd(ctx, "mount", "-o", "loop", img, dir); err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	e.diskDir = dir
	dev, err := deviceOf(dir)
	if err != nil {
		return err
	}
	if err := runCmd(ctx, "losetup", "--direct-io=on", "/dev/"+dev.Name); err != nil {
		e.logf("scratch disk: direct I/O not enabled on /dev/%s: %v", dev.Name, err)
	}
	// The loop device's readahead is the kernel default (128 KiB); give it
	// the backing disk's, so that reads behave as on the host's disk
	// (unless told otherwise).
	ra := ""
	if readAheadKB > 0 {
		ra = strconv.Itoa(readAheadKB)
	} else if back, err := deviceOf(e.Tmp); err == nil {
		ra = devReadAheadKB(back)
	}
	if ra != "" {
		p := fmt.Sprintf("/sys/dev/block/%d:%d/queue/read_ahead_kb", dev.Major, dev.Minor)
		if err := os.WriteFile(p, []byte(ra), 0); err != nil {
			e.logf("scratch disk: could not set read_ahead_kb %s on /dev/%s: %v", ra, dev.Name, err)
		}
	}
	e.stateDir = filepath.Join(dir, "state")
	return os.MkdirAll(e.stateDir, 0o755)
}

// unmountScratchDisk unmounts it (the loop device is freed by autoclear).
func (e *Env) unmountScratchDisk() error {
	if e.diskDir == "" {
		return nil
	}
	var err error
	for i := 0; i < 50; i++ {
		if err = unix.Unmount(e.diskDir, 0); err == nil || errors.Is(err, unix.EINVAL) {
			e.diskDir = ""
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if derr := unix.Unmount(e.diskDir, unix.MNT_DETACH); derr == nil {
		e.diskDir = ""
		return nil
	}
	return fmt.Errorf("unmount scratch disk %s: %w", e.diskDir, err)
}

// DiskDir is where benchmarks put files that belong on the daemon's disk
// (the scratch disk's mount point, or the scratch directory).
func (e *Env) DiskDir() string {
	if e.diskDir != "" {
		return e.diskDir
	}
	return e.Tmp
}

// StateDir is the private daemon's state directory ("" for --addr).
func (e *Env) StateDir() string {
	if !e.Private {
		return ""
	}
	return e.stateDir
}

// ScratchDiskSize is a sparse size that fits n copies of sizeMB plus the
// images: only what is written takes space.
func ScratchDiskSize(n, sizeMB int) int64 {
	return (int64(n)*int64(sizeMB)*2 + 8<<10) << 20
}

// devReadAheadKB reads read_ahead_kb of a disk or of a partition's disk,
// "" when unknown.
func devReadAheadKB(dev diskDevice) string {
	for _, p := range []string{
		fmt.Sprintf("/sys/dev/block/%d:%d/queue/read_ahead_kb", dev.Major, dev.Minor),
		fmt.Sprintf("/sys/dev/block/%d:%d/../queue/read_ahead_kb", dev.Major, dev.Minor),
	} {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

package container

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Sandboxes hide directories of /proc and /sys (init_linux.c,
// masked_dirs) under read-only binds of one empty directory: the root of
// a tiny read-only tmpfs the node's sandboxes share, mounted at
// <run>/empty. A bind's mountinfo line names its source directory
// relative to its filesystem's root, so a plain directory of the host
// showed the sandbox the run directory's path ("/run/warren/empty"); the
// root of a filesystem of its own shows "/". One superblock per node, not
// per sandbox (see sysfs.go).

// emptyDir is where the shared empty tmpfs is mounted.
func (b *Backend) emptyDir() string { return filepath.Join(b.opts.RunDir, "empty") }

// emptyOptions: nothing can be written (read-only), and no size to speak of.
const emptyOptions = "mode=0555,size=4k,nr_inodes=1"

// mountSharedEmpty mounts the empty tmpfs at dir, or keeps the one an
// earlier daemon mounted there.
func mountSharedEmpty(dir string) error {
	if sharedEmptyAt(dir) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o555); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "create shared empty directory")
	}
	const flags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", dir, "tmpfs", flags, emptyOptions); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "mount shared empty tmpfs")
	}
	return nil
}

// sharedEmptyAt reports whether a read-only tmpfs is mounted at dir (not
// merely a directory of the filesystem below).
func sharedEmptyAt(dir string) bool { return tmpfsAt(dir, unix.ST_RDONLY, 0) }

// tmpfsAt reports whether a tmpfs is mounted at dir itself (not merely a
// directory of the tmpfs of /run below it) whose statfs flags include
// every bit of set and none of clear: the test of each of the node's
// shared filesystems (the empty tmpfs, devfs, views).
func tmpfsAt(dir string, set, clear int64) bool {
	var st, parent unix.Stat_t
	var fs unix.Statfs_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil || st.Dev == parent.Dev {
		return false
	}
	return unix.Statfs(dir, &fs) == nil && fs.Type == unix.TMPFS_MAGIC && fs.Flags&set == set && fs.Flags&clear == 0
}

// ensureEmpty remounts the shared empty tmpfs if someone unmounted it
// since the daemon started: binding the directory below would show the
// sandbox its host path.
func (b *Backend) ensureEmpty() error {
	// One statfs per create: the directory below is on the run
	// directory's filesystem, which is not a read-only tmpfs.
	var st unix.Statfs_t
	if unix.Statfs(b.emptyDir(), &st) == nil && st.Type == unix.TMPFS_MAGIC && st.Flags&unix.ST_RDONLY != 0 {
		return nil
	}
	b.sharedMu.Lock()
	defer b.sharedMu.Unlock()
	return mountSharedEmpty(b.emptyDir())
}

// closeEmpty unmounts the shared empty tmpfs; live sandboxes keep their
// binds of it.
func (b *Backend) closeEmpty() error {
	if !sharedEmptyAt(b.emptyDir()) {
		return nil
	}
	if err := unix.Unmount(b.emptyDir(), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount shared empty tmpfs: %w", err)
	}
	return nil
}

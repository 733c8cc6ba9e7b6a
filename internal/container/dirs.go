package container

import (
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// mkdir makes dir, and its parents only if they are missing: one syscall
// in the common case, where os.MkdirAll stats first.
func mkdir(dir string) error {
	err := unix.Mkdir(dir, 0o755)
	if err == unix.ENOENT {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return &os.PathError{Op: "mkdir", Path: dir, Err: err}
	}
	return nil
}

// removeKnown removes dir, first removing the entries it is expected to
// hold by name (those ending in "/" are directories, removed only when
// empty). Whatever else is left, or an entry that is not empty, falls to
// removeTree. os.RemoveAll instead probes each name with unlink and rmdir
// and lists every directory, about three times the syscalls for a
// sandbox's usual handful of entries.
func removeKnown(dir string, entries ...string) error { return removeKnownUntil(nil, dir, entries...) }

// removeKnownUntil is removeKnown that stops once stop is closed
// (inroot.ErrStopped), leaving the rest.
func removeKnownUntil(stop <-chan struct{}, dir string, entries ...string) error {
	for _, e := range entries {
		if name, isDir := strings.CutSuffix(e, "/"); isDir {
			_ = unix.Rmdir(filepath.Join(dir, name))
		} else {
			_ = unix.Unlink(filepath.Join(dir, name))
		}
	}
	return removeTreeUntil(dir, stop)
}

// removeTree removes dir and everything below it, however deep (a
// sandbox can nest directories far past PATH_MAX and the descriptor
// limit, where os.RemoveAll gave up on a 21,000-level tree); a missing
// dir is no error. The error names the first entry it could not remove.
func removeTree(dir string) error { return removeTreeUntil(dir, nil) }

// removeTreeUntil is removeTree that stops once stop is closed
// (inroot.ErrStopped), leaving the rest.
func removeTreeUntil(dir string, stop <-chan struct{}) error {
	if err := unix.Rmdir(dir); err == nil || err == unix.ENOENT {
		return nil
	}
	// Not empty (or not a directory): the general walk.
	return inroot.RemoveTreeUntil(dir, stop)
}

package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Each sandbox's /dev is its own directory, <run>/devfs/<id>, on one tmpfs
// the node's sandboxes share, rather than a tmpfs of its own: a superblock
// per sandbox widens every memory cgroup's shrinker map on the node (at
// 3,200 sandboxes by ~50 KiB per sandbox on a freshly booted node) and
// costs a few KiB of its own. The device nodes and /dev/shm files are still
// the sandbox's own inodes, so nothing is shared between sandboxes but the
// superblock; the tmpfs has no size or inode limit, so statfs shows no
// usage to watch, and what a sandbox stores there is charged to its memory
// cgroup and bounded by its memory limit (the per-sandbox tmpfs capped
// /dev at 64 MiB as well).

// devfsDir is where the shared tmpfs is mounted.
func (b *Backend) devfsDir() string { return filepath.Join(b.opts.RunDir, "devfs") }

// devDir is sandbox id's /dev on the shared tmpfs; the init stage creates
// and fills it.
func (b *Backend) devDir(id string) string { return filepath.Join(b.devfsDir(), id) }

const devfsOptions = "mode=0755,size=0,nr_inodes=0"

// mountSharedDevfs mounts the shared tmpfs at dir, or keeps the one an
// earlier daemon mounted there (live sandboxes' /dev directories are on
// it, and their deletion must find them).
func mountSharedDevfs(dir string) error {
	if sharedDevfsAt(dir) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "create shared devfs mount point")
	}
	// Device nodes must work here: no MS_NODEV. No set-uid programs.
	// Sandboxes see the source name in mountinfo: nothing of the node's.
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID, devfsOptions); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "mount shared devfs")
	}
	return nil
}

// sharedDevfsAt reports whether a tmpfs that allows device nodes is
// mounted at dir (not merely a directory on the tmpfs of /run).
func sharedDevfsAt(dir string) bool { return tmpfsAt(dir, 0, unix.ST_NODEV) }

// ensureDevfs remounts the shared tmpfs if someone unmounted it since the
// daemon started. Sandboxes created before keep theirs (their binds hold
// the old superblock), and their directories go with it once the last of
// them is gone.
func (b *Backend) ensureDevfs() error {
	if sharedDevfsAt(b.devfsDir()) {
		return nil
	}
	b.sharedMu.Lock()
	defer b.sharedMu.Unlock()
	return mountSharedDevfs(b.devfsDir())
}

// closeDevfs unmounts the shared tmpfs when no sandbox directory is left
// on it; otherwise it stays for the next daemon, which deletes them.
func (b *Backend) closeDevfs() error {
	ents, err := os.ReadDir(b.devfsDir())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read shared devfs: %w", err)
	}
	if len(ents) > 0 || !sharedDevfsAt(b.devfsDir()) {
		return nil
	}
	if err := unix.Unmount(b.devfsDir(), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount shared devfs: %w", err)
	}
	return nil
}

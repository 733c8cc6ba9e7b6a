package container

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// The agent's executable, seen from inside every sandbox. The daemon execs
// the agent from a memfd (or a file on a host mount), which CRIU can
// restore neither as an executable nor as a mapping (docs/HIBERNATE.md).
// The same bytes sit in a tiny read-only tmpfs of the node at
// <run>/agentfs/warren-agent-<sha>; the init stage binds that file
// read-only at /dev/.warren-agent and moves its own mappings and exe link
// onto it (init_linux.c, adopt_exe), so a checkpoint names a file of the
// sandbox's own mount tree and a restore binds it again from here. One
// superblock per node; the page cache of the file is shared by every
// sandbox; old versions stay for the sandboxes and checkpoints that name
// them.

// agentfsDir is where the agent tmpfs is mounted.
func (b *Backend) agentfsDir() string { return filepath.Join(b.opts.RunDir, "agentfs") }

// agentExeName is the agent file's name for bin: its content's hash, so a
// checkpoint taken under another agent names the file it needs.
func agentExeName(bin []byte) string {
	sum := sha256.Sum256(bin)
	return "warren-agent-" + hex.EncodeToString(sum[:8])
}

// agentExeSandboxPath is where a sandbox sees the agent file.
const agentExeSandboxPath = "/dev/.warren-agent"

// ensureAgentExe makes sure the agent tmpfs holds bin and returns its host
// path.
func (b *Backend) ensureAgentExe(bin []byte) (string, error) {
	dir := b.agentfsDir()
	path := filepath.Join(dir, agentExeName(bin))
	if tmpfsAt(dir, unix.ST_RDONLY, 0) {
		if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, bin) {
			return path, nil
		}
	}
	b.sharedMu.Lock()
	defer b.sharedMu.Unlock()
	if err := writeAgentExe(dir, path, bin); err != nil {
		return "", err
	}
	return path, nil
}

// writeAgentExe mounts the agent tmpfs at dir where there is none, writes
// bin at path in it, and leaves it read-only. Executables must run from
// it: no MS_NOEXEC.
func writeAgentExe(dir, path string, bin []byte) error {
	if !tmpfsAt(dir, 0, 0) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "create agent tmpfs mount point")
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=8m,nr_inodes=64"); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "mount agent tmpfs")
		}
	} else if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "remount agent tmpfs writable")
	}
	err := func() error {
		if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, bin) {
			return nil
		}
		tmp := path + ".tmp"
		_ = os.Remove(tmp)
		if err := os.WriteFile(tmp, bin, 0o555); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}()
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "write agent executable")
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "remount agent tmpfs read-only")
	}
	return nil
}

// closeAgentfs unmounts the agent tmpfs; live sandboxes keep their binds
// of its file, and the next daemon mounts a new one.
func (b *Backend) closeAgentfs() error {
	if err := unix.Unmount(b.agentfsDir(), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return errdefs.Wrap(errdefs.Internal, err, "unmount agent tmpfs")
	}
	return nil
}

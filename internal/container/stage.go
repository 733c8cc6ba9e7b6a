package container

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// newStage makes the mount namespace that every sandbox's root is put on
// (init_linux.c, root_on_stage): its only mount is a copy of the node's
// shared empty tmpfs (read-only, no superblock of its own), at its root.
// A sandbox's init chroots into its tree on top of a copy of it instead of
// calling pivot_root, whose walk of every thread on the node grew each
// create's cost with the sandboxes already there. The namespace lives as
// long as the descriptor returned; sandboxes hold their own copies.
// The pivot_root here is the daemon's one.
func newStage(emptyDir string) (*os.File, error) {
	var ns *os.File
	err := throwawayThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		f, err := os.Open("/proc/thread-self/ns/mnt")
		if err != nil {
			return err
		}
		if err := stageRoot(emptyDir); err != nil {
			f.Close()
			return err
		}
		ns = f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("make the sandboxes' stage mount namespace: %w", err)
	}
	return ns, nil
}

// stageRoot leaves the calling thread's new mount namespace with the
// empty tmpfs at emptyDir as its only mount, at its root.
func stageRoot(emptyDir string) error {
	if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Chdir(emptyDir); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the node's root: %w", err)
	}
	return nil
}

// sandboxMounts is a sandbox's mount namespace and its root, opened from
// the node for a thread to enter (enter).
type sandboxMounts struct{ ns, root int }

// openSandboxMounts opens init pid's mount namespace and root directory.
func openSandboxMounts(pid int) (sandboxMounts, error) {
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return sandboxMounts{-1, -1}, err
	}
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(ns)
		return sandboxMounts{-1, -1}, err
	}
	return sandboxMounts{ns, root}, nil
}

func (m sandboxMounts) close() {
	unix.Close(m.ns)
	unix.Close(m.root)
}

// enter moves the calling thread (one of its own: throwawayThread) into
// the namespace and the sandbox's root. setns leaves a thread at the
// namespace's root, which for a sandbox is the stage under its chroot
// (root_on_stage, init_linux.c), not the sandbox's "/": absolute paths
// after this resolve as the sandbox's own processes resolve them.
func (m sandboxMounts) enter() error {
	// setns into a mount namespace refuses a thread sharing its
	// filesystem context (Go's threads do).
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare CLONE_FS: %w", err)
	}
	if err := unix.Setns(m.ns, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the sandbox's mount namespace: %w", err)
	}
	if err := unix.Fchdir(m.root); err != nil {
		return fmt.Errorf("enter the sandbox's root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("enter the sandbox's root: %w", err)
	}
	return nil
}

package container

import (
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// rebind replaces mounts inside a running sandbox's mount namespace:
// for each target (an absolute path inside the sandbox), the view bind
// there, if any, is unmounted, and src (a host path; "" for none) is
// bound read-only in its place. It is how an Update that changes the
// CPU count changes the CPU views (views.go) of a live sandbox.
//
// The sources are opened as detached mounts (open_tree) before entering
// the namespace, where their host paths are not visible; a thread then
// leaves the daemon's shared filesystem context (unshare(CLONE_FS): Go's
// threads share it, and setns refuses a mount namespace to a thread that
// does), enters the sandbox's mount namespace and attaches them
// (move_mount). That thread is never returned to the runtime: it exits
// with its goroutine, namespace and all (throwawayThread).
func rebind(initPid int, targets []string, srcs []string) error {
	trees := make([]int, len(targets))
	defer func() {
		for _, t := range trees {
			if t > 0 {
				unix.Close(t)
			}
		}
	}()
	for i, src := range srcs {
		trees[i] = -1
		if src == "" {
			continue
		}
		t, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "open_tree "+src)
		}
		trees[i] = t
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
		if err := unix.MountSetattr(t, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "mount_setattr "+src)
		}
	}
	sm, err := openSandboxMounts(initPid)
	if err != nil {
		return errdefs.Wrap(errdefs.NotFound, err, "sandbox mount namespace")
	}
	defer sm.close()
	return throwawayThread(func() error {
		if err := sm.enter(); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "rebind views")
		}
		for i, dst := range targets {
			// Our bind is the only mount a sandbox can have there (it
			// has no CAP_SYS_ADMIN); EINVAL: none.
			if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
				return errdefs.Wrap(errdefs.Internal, err, "unmount view "+dst)
			}
			if trees[i] < 0 {
				continue
			}
			if err := unix.MoveMount(trees[i], "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return errdefs.Wrap(errdefs.Internal, err, "move_mount view "+dst)
			}
		}
		return nil
	})
}

// throwawayThread runs fn on an OS thread of its own that ends when fn
// returns: for changes to a thread (its namespaces, its filesystem
// context, its priority) that are not to be undone. Never on the
// process's main thread: the runtime cannot end that one and keeps it,
// asleep, with whatever fn left it in, for the daemon's life: a
// sandbox's mount namespace (pinning every mount of a deleted sandbox)
// and, since /proc/self is the main thread's, the daemon reading that
// namespace's mount table as its own. While this goroutine holds the
// main thread, a goroutine it starts runs on another.
func throwawayThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			errc <- fn()
			return // still locked: the thread ends with this goroutine
		}
		inner := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			inner <- fn()
		}()
		err := <-inner
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

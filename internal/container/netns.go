package container

import (
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// hostNetnsFD is the daemon's network namespace, opened once, when the
// package is initialised: threads that made a sandbox's namespace go back
// to it. Not /proc/self/ns/net, which is the main thread's: the namespace
// pool's thread, locked for life in namespaces it makes, may be that one.
var hostNetnsFD, hostNetnsErr = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)

// inNewNetns runs f on a thread of its own in a new network namespace:
// what f creates (sockets, children) belongs to it. The thread returns to
// the daemon's namespace afterwards, or, where it cannot, ends with f's
// goroutine instead of serving others in the wrong namespace.
func inNewNetns(f func() error) error {
	if hostNetnsErr != nil {
		return errdefs.Wrap(errdefs.Internal, hostNetnsErr, "open the daemon's network namespace")
	}
	host := hostNetnsFD
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// unshare(2) acts on this thread alone once CLONE_FS is not
		// among its flags.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- errdefs.Wrap(errdefs.Internal, err, "unshare network namespace")
			return
		}
		err := f()
		if unix.Setns(host, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

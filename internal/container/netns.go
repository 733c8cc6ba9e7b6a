package container

import (
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// The main goroutine keeps the main thread (a LockOSThread in an init
// function lasts into main): goroutines of this package lock threads and
// move them into sandboxes' namespaces (network, mount, ...), and one that
// ends locked leaves its thread behind, which for the main thread means
// wedged in that namespace for good. /proc/self is the main thread's: the
// daemon's mountinfo read through it showed a restore's private mounts
// (criuUserNSView) once such a goroutine had run there.
func init() { runtime.LockOSThread() }

// hostNetnsFD is the daemon's network namespace, opened once, when the
// package is initialised: threads that made a sandbox's namespace go back
// to it. Read from this thread's own (the main thread, kept by the main
// goroutine: init above).
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

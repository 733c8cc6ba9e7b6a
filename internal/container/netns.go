package container

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// hostNetns is the daemon's network namespace, open once: threads that
// made a sandbox's namespace go back to it.
var hostNetns = sync.OnceValues(func() (int, error) {
	return unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
})

// inNewNetns runs f on a thread of its own in a new network namespace:
// what f creates (sockets, children) belongs to it. The thread returns to
// the daemon's namespace afterwards, or, where it cannot, ends with f's
// goroutine instead of serving others in the wrong namespace.
func inNewNetns(f func() error) error {
	host, err := hostNetns()
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "open the daemon's network namespace")
	}
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

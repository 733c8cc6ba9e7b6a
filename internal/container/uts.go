package container

import (
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
)

var _ backend.HostnameSetter = (*sandbox)(nil)

// SetHostname changes a running sandbox's hostname from the node's side
// (its processes hold no CAP_SYS_ADMIN): a thread enters its UTS
// namespace, sets the name and goes back to the daemon's, as fncall
// names a pooled environment after the sandbox it becomes. A thread that
// cannot go back is thrown away (it ends with its goroutine); a new
// thread for every call cost ~0.5 ms.
func (s *sandbox) SetHostname(name string) error {
	if err := etcfiles.CheckHostname(name); err != nil {
		return errdefs.Wrap(errdefs.Invalid, err, "hostname")
	}
	home, err := daemonUTS()
	if err != nil {
		return err
	}
	ns, err := unix.Open("/proc/"+strconv.Itoa(s.st.Pid)+"/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errdefs.Wrap(errdefs.NotFound, err, "sandbox UTS namespace")
	}
	defer unix.Close(ns)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(ns, unix.CLONE_NEWUTS); err != nil {
			runtime.UnlockOSThread() // still the daemon's
			errc <- errdefs.Wrap(errdefs.Internal, err, "enter sandbox UTS namespace")
			return
		}
		err := unix.Sethostname([]byte(name))
		if err != nil {
			err = errdefs.Wrap(errdefs.Internal, err, "sethostname")
		}
		if unix.Setns(home, unix.CLONE_NEWUTS) == nil {
			runtime.UnlockOSThread()
		} // else: still locked, the thread ends with this goroutine
		errc <- err
	}()
	return <-errc
}

// daemonUTS is the daemon's own UTS namespace, opened once (while the
// daemon's threads are all in it).
var daemonUTS = sync.OnceValues(func() (int, error) {
	fd, err := unix.Open("/proc/thread-self/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, errdefs.Wrap(errdefs.Internal, err, "the daemon's UTS namespace")
	}
	return fd, nil
})

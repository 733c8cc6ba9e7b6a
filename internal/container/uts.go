package container

import (
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
)

var _ backend.HostnameSetter = (*sandbox)(nil)

// SetHostname changes a running sandbox's hostname from the node's side
// (its processes hold no CAP_SYS_ADMIN): a thread enters its UTS
// namespace and is thrown away. fncall names a pooled environment after
// the sandbox it becomes.
func (s *sandbox) SetHostname(name string) error {
	if err := etcfiles.CheckHostname(name); err != nil {
		return errdefs.Wrap(errdefs.Invalid, err, "hostname")
	}
	ns, err := unix.Open("/proc/"+strconv.Itoa(s.st.Pid)+"/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errdefs.Wrap(errdefs.NotFound, err, "sandbox UTS namespace")
	}
	defer unix.Close(ns)
	return throwawayThread(func() error {
		if err := unix.Setns(ns, unix.CLONE_NEWUTS); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "enter sandbox UTS namespace")
		}
		if err := unix.Sethostname([]byte(name)); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "sethostname")
		}
		return nil
	})
}

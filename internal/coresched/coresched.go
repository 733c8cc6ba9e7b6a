// Package coresched gives a sandbox's processes a core-scheduling cookie
// of their own (prctl PR_SCHED_CORE, Linux 5.14 with CONFIG_SCHED_CORE):
// the scheduler then never runs tasks of another cookie on the sibling
// hyperthread of a core one of them runs on, so a latency-sensitive
// sandbox does not share a physical core with best-effort threads. A
// kernel without it (ENOSYS/EINVAL on PR_SCHED_CORE_GET) is detected
// once: Available says so, and the QoS code leaves the mechanism out.
package coresched

import (
	"errors"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Available reports whether the kernel has core scheduling: a GET of this
// process's cookie succeeds.
var Available = sync.OnceValue(func() bool {
	var cookie uint64
	return prctl(unix.PR_SCHED_CORE_GET, 0, unix.PR_SCHED_CORE_SCOPE_THREAD_GROUP, uintptr(unsafe.Pointer(&cookie))) == nil
})

func prctl(cmd, pid, scope, arg uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_PRCTL, unix.PR_SCHED_CORE, cmd, pid, scope, arg, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Cookie reads the core cookie of process pid (0: none).
func Cookie(pid int) (uint64, error) {
	var cookie uint64
	err := prctl(unix.PR_SCHED_CORE_GET, uintptr(pid), unix.PR_SCHED_CORE_SCOPE_THREAD_GROUP, uintptr(unsafe.Pointer(&cookie)))
	return cookie, err
}

// Isolate gives the processes pids one new cookie, shared by them all
// (and inherited by what they fork); share false takes every cookie away
// instead. The cookie is made on the first process and carried to the
// others by a thread of the daemon that takes it and is then thrown away
// (a locked goroutine that never unlocks ends its thread), so no daemon
// thread keeps it. Processes gone meanwhile are skipped.
func Isolate(pids []int, share bool) error {
	if !Available() {
		return errdefs.Unsupportedf("the kernel has no core scheduling (PR_SCHED_CORE)")
	}
	if len(pids) == 0 {
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread ends with this goroutine, taking the
		// cookie it holds with it.
		errc <- isolate(pids, share)
	}()
	return <-errc
}

func isolate(pids []int, share bool) error {
	first := 0
	if share {
		for ; first < len(pids); first++ {
			err := prctl(unix.PR_SCHED_CORE_CREATE, uintptr(pids[first]), unix.PR_SCHED_CORE_SCOPE_THREAD_GROUP, 0)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.ESRCH) {
				return errdefs.Wrap(errdefs.Internal, err, "create a core-scheduling cookie")
			}
		}
		if first == len(pids) {
			return nil
		}
		// This thread takes the cookie to hand it on.
		if err := prctl(unix.PR_SCHED_CORE_SHARE_FROM, uintptr(pids[first]), unix.PR_SCHED_CORE_SCOPE_THREAD, 0); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "take a core-scheduling cookie")
		}
		first++
	}
	// Without share this thread has no cookie (the runtime makes threads
	// from a template thread that never had one): sharing it clears.
	for _, pid := range pids[first:] {
		err := prctl(unix.PR_SCHED_CORE_SHARE_TO, uintptr(pid), unix.PR_SCHED_CORE_SCOPE_THREAD_GROUP, 0)
		if err != nil && !errors.Is(err, unix.ESRCH) {
			return errdefs.Wrap(errdefs.Internal, err, "share a core-scheduling cookie")
		}
	}
	return nil
}

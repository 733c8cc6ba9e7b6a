package container

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// SetLastPID sets the last pid handed out in the pid namespace of the
// process initPid (a sandbox's init), so that the next process gets
// last+1; with raise it only ever moves it up. A CRIU restore leaves the
// restored namespace handing out pids from the bottom, so that the first
// commands after a restore would get the pids of processes that exited
// before the checkpoint, whose records (and the pids an E2B client holds
// as handles) are still about. The restore raises it past every pid the
// agent has a record of, as the sandbox would have gone on.
//
// The kernel takes the value only from a process inside the namespace:
// a thread of ours joins it for its children and starts /bin/sh there,
// which writes it (root of the node's user namespace: allowed in every
// sandbox's). The thread is never given back to the runtime.
func SetLastPID(initPid, last int, raise bool) error {
	script := `echo "$1" > /proc/sys/kernel/ns_last_pid`
	if raise {
		// dash's read fails at the end of a sysctl file, with the value read.
		script = `read cur < /proc/sys/kernel/ns_last_pid; [ "$cur" -ge "$1" ] || echo "$1" > /proc/sys/kernel/ns_last_pid`
	}
	errc := make(chan error, 1)
	go func() {
		// Locked and never unlocked: the runtime ends the thread with
		// this goroutine instead of reusing it in the sandbox's pid
		// namespace.
		runtime.LockOSThread()
		ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/pid", initPid))
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWPID); err != nil {
			errc <- fmt.Errorf("join the pid namespace of %d: %w", initPid, err)
			return
		}
		out, err := exec.Command("/bin/sh", "-c", script, "sh", strconv.Itoa(last)).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("set the last pid of the pid namespace of %d to %d: %w: %s", initPid, last, err, out)
		}
		errc <- err
	}()
	return <-errc
}

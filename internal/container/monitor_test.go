package container

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMonitorReapsByPidfdNotPid: when a watched init that is not our
// child exits (an init adopted after a restart), the monitor must not wait
// on its pid, which may by then belong to one of our own children: that
// wait would steal the child's exit status. Here the watch names the pid
// of our child B while its pidfd names another process X; B's status must
// still be ours to collect after X's exit was handled.
func TestMonitorReapsByPidfdNotPid(t *testing.T) {
	// X: a grandchild, reparented away from us when its shell exits.
	out, err := exec.Command("sh", "-c", "sleep 0.3 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	xpid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	xfd, err := unix.PidfdOpen(xpid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", xpid, err)
	}
	// B: our own child, exited and not yet reaped.
	b, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		unix.Close(xfd)
		t.Fatal(err)
	}
	watchUntilExit(t, xfd, b.Pid)
	var ws unix.WaitStatus
	got, err := unix.Wait4(b.Pid, &ws, unix.WNOHANG, nil)
	if err != nil || got != b.Pid {
		t.Fatalf("our child %d: wait4 = %d, %v; the monitor reaped a process it was not watching", b.Pid, got, err)
	}
}

// TestMonitorReapsChild: an init that is our child leaves no zombie.
func TestMonitorReapsChild(t *testing.T) {
	var pidfd int
	attr := &os.ProcAttr{Sys: &unix.SysProcAttr{PidFD: &pidfd}}
	p, err := os.StartProcess("/bin/true", []string{"true"}, attr)
	if err != nil {
		t.Fatal(err)
	}
	watchUntilExit(t, pidfd, p.Pid)
	if _, err := unix.Wait4(p.Pid, nil, unix.WNOHANG, nil); err != unix.ECHILD {
		t.Fatalf("child %d after the monitor saw it exit: wait4 err %v, want ECHILD (reaped)", p.Pid, err)
	}
}

// watchUntilExit has a new monitor watch pidfd (naming pid) and returns
// once the monitor has handled the exit.
func watchUntilExit(t *testing.T, pidfd, pid int) {
	t.Helper()
	m, err := newMonitor()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(m.epfd) })
	exited := make(chan struct{})
	if err := m.watch(pidfd, pid, func() { close(exited) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the monitor did not see the watched process exit")
	}
}

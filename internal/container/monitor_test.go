package container

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/testutil"
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
	t.Cleanup(m.close)
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

// TestMonitorGroupExit: a process watched through its cgroup's
// cgroup.events fires once its group is empty, not when the group is
// frozen and thawed (which modifies the same file), and is reaped if it is
// our child. Without watchGroup's re-read of the file, or with the wrong
// key, this fails: it fires at the freeze, or never.
func TestMonitorGroupExit(t *testing.T) {
	grp, events := monitorTestGroup(t, "mg")
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "100"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if err := grp.AddProc(p.Pid); err != nil {
		t.Fatal(err)
	}
	m, err := newMonitor()
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	exited := make(chan time.Time, 1)
	if err := m.watchGroup(events, p.Pid, true, func() { exited <- time.Now() }); err != nil {
		t.Fatal(err)
	}
	if n := m.count(); n != 0 {
		t.Errorf("the monitor holds %d pidfds for a group watch, want 0", n)
	}
	if err := grp.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := grp.Thaw(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatal("the watch fired on a freeze and thaw of a live group")
	case <-time.After(200 * time.Millisecond):
	}
	killed := time.Now()
	if err := p.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-exited:
		t.Logf("exit seen %v after the kill", at.Sub(killed))
	case <-time.After(10 * time.Second):
		t.Fatal("the monitor did not see the group empty")
	}
	if _, err := unix.Wait4(p.Pid, nil, unix.WNOHANG, nil); err != unix.ECHILD {
		t.Fatalf("child %d after the monitor saw its group empty: wait4 err %v, want ECHILD (reaped)", p.Pid, err)
	}
}

// TestMonitorGroupEmptyAtWatch: a group that emptied before its watch was
// added (an init that died between its start and attach) fires at once:
// no event will ever come for it.
func TestMonitorGroupEmptyAtWatch(t *testing.T) {
	_, events := monitorTestGroup(t, "me")
	m, err := newMonitor()
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	exited := make(chan struct{})
	if err := m.watchGroup(events, 0, false, func() { close(exited) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch of an empty group did not fire")
	}
}

// monitorTestGroup makes a cgroup (below a parent of its own) and returns
// it with its cgroup.events file; it skips on a host with no cgroup2
// directory per group (pure v1), where the monitor watches pidfds.
func monitorTestGroup(t *testing.T, name string) (cgroups.Group, string) {
	t.Helper()
	testutil.RequireRoot(t)
	parent := fmt.Sprintf("warren-montest-%s%d", name, os.Getpid())
	grp, err := cgroups.New(parent, name, cgroups.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = grp.Kill(5 * time.Second)
		_ = grp.Delete()
		_ = cgroups.RemoveParent(parent)
	})
	events := cgroups.EventsFile(grp)
	if events == "" {
		t.Skip("no cgroup2 directory per group on this host (pure cgroup v1)")
	}
	return grp, events
}

// TestMonitorCloseEndsItsLoop: close ends the monitor's goroutine (closing
// the epoll descriptor alone leaves a blocked epoll_wait asleep for good)
// and closes the pidfds it owned, without calling their watches: the
// processes live on.
func TestMonitorCloseEndsItsLoop(t *testing.T) {
	m, err := newMonitor()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	pidfd, err := unix.PidfdOpen(child.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	called := make(chan struct{}, 1)
	if err := m.watch(pidfd, child.Process.Pid, func() { called <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { m.close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("close did not end the monitor's loop")
	}
	select {
	case <-m.done:
	default:
		t.Fatal("the loop's done channel is open after close")
	}
	if n := m.count(); n != 0 {
		t.Errorf("%d watches left after close", n)
	}
	select {
	case <-called:
		t.Error("close called a watch: the process had not exited")
	default:
	}
	if err := unix.Kill(child.Process.Pid, 0); err != nil {
		t.Errorf("the watched process: %v", err)
	}
}

// TestHelperInotifyWithoutWatches is not a test: run by
// limitedInotify in a user namespace of its own, it allows that
// namespace no inotify watch, opens an inotify instance (whose watches
// count against that namespace's limit, whoever adds them) and sends it
// back over its fd 3.
func TestHelperInotifyWithoutWatches(t *testing.T) {
	if os.Getenv("WARREN_TEST_INOTIFY_HELPER") != "1" {
		t.Skip("helper process of TestWatchFallsBackToPidfdWithoutInotifyWatches")
	}
	if err := os.WriteFile("/proc/sys/user/max_inotify_watches", []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	ino, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(3, []byte{0}, unix.UnixRights(ino), nil, 0); err != nil {
		t.Fatal(err)
	}
}

// limitedInotify returns an inotify descriptor (the caller's to close)
// whose watches count against a user namespace that allows none: adding
// one fails with ENOSPC, as on a node whose root processes used up
// fs.inotify.max_user_watches, without touching that node-wide limit
// (the other test packages running meanwhile share it).
func limitedInotify(t *testing.T) int {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "helper-sock"), os.NewFile(uintptr(fds[1]), "helper-sock")
	defer ours.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperInotifyWithoutWatches$", "-test.count=1")
	cmd.Env = append(os.Environ(), "WARREN_TEST_INOTIFY_HELPER=1")
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	theirs.Close()
	if err != nil {
		t.Fatalf("inotify helper in a user namespace: %v\n%s", err, out)
	}
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(ours.Fd()), make([]byte, 1), oob, unix.MSG_DONTWAIT)
	if err != nil {
		t.Fatalf("receive the helper's inotify descriptor: %v\n%s", err, out)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("the helper's message: %v %v", msgs, err)
	}
	rights, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(rights) != 1 {
		t.Fatalf("the helper's descriptor: %v %v", rights, err)
	}
	// The caller owns it: a group watcher wraps it in an *os.File, whose
	// finalizer would close the number again after a cleanup here had
	// (a later test's daemon stage, given that number, lost it at a GC:
	// "setns stage mount namespace: Invalid argument").
	return rights[0]
}

// TestWatchFallsBackToPidfdWithoutInotifyWatches: when the kernel
// refuses the inotify watch of a new sandbox's cgroup.events (the node's
// root processes are out of watches), the daemon warns and watches the
// sandbox's init through a pidfd instead, and sees it exit.
func TestWatchFallsBackToPidfdWithoutInotifyWatches(t *testing.T) {
	testutil.RequireRoot(t)
	ino := limitedInotify(t)
	// The shared group watcher is made on first use: make it, then put
	// one over the limited instance in its place for this test.
	if _, err := sharedGroupWatcher(); err != nil {
		t.Fatal(err)
	}
	real := groupWatch.w
	w := newGroupWatcher(ino)
	groupWatch.w = w
	t.Cleanup(func() {
		groupWatch.w = real
		w.f.Close() // once, through the File that owns it
	})
	opts := testOptions(t, "inof-")
	var warnings strings.Builder
	opts.Warn = func(msg string, args ...any) { fmt.Fprintln(&warnings, msg, args) }
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	before := b.mon.count()
	sb, pid := runningSandbox(t, b, "inof")
	if cgroups.EventsFile(sb.(*sandbox).grp) == "" {
		t.Skip("no cgroup2 directory per group on this host (pure cgroup v1): every sandbox is watched through a pidfd")
	}
	if !strings.Contains(warnings.String(), "watching its init's pidfd") || !strings.Contains(warnings.String(), "no space left") {
		t.Errorf("warnings: %q, want the fallback to a pidfd, naming ENOSPC", warnings.String())
	}
	if n := b.mon.count(); n != before+1 {
		t.Fatalf("the monitor holds %d pidfds (%d before the create), want one more: the sandbox's init", n, before)
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.(*sandbox).exited.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not see the sandbox's init exit through its pidfd")
	}
	if n := b.mon.count(); n != before {
		t.Errorf("the monitor holds %d pidfds after the exit, want %d", n, before)
	}
}

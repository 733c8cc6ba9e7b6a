package container

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cgroups"
)

// monitor watches every sandbox init in one epoll set, so that thousands
// of sandboxes cost one goroutine and one thread rather than one blocked
// wait per sandbox.
//
// A sandbox with a cgroup2 directory (v2 hosts, and the unified hierarchy
// of hybrid ones) is watched instead through its group's cgroup.events,
// one inotify watch each on the process's one inotify descriptor
// (groupWatcher): its init is gone
// once the group has no process left (`populated 0`), since the init is
// its pid namespace's and every process of the group is in that
// namespace. Others (pure v1 hosts; a lazily restored sandbox, whose
// lazy-pages server is in its group but not its pid namespace) are
// watched through a pidfd each. Descriptors per sandbox were what made
// creates slow at 10,000 sandboxes: every fork copies the daemon's file
// table and every exec closes the copy's close-on-exec descriptors, one
// step per descriptor (a start+wait of /bin/true here: 4.9 ms with no
// extra descriptors, 14.7 ms with 10,000; docs/BENCHMARKS.md).
type monitor struct {
	epfd int
	stop int           // eventfd in the epoll set: close() ends the loop
	done chan struct{} // closed when the loop has ended
	mu   sync.Mutex
	cbs  map[int32]watch // by pidfd
}

type watch struct {
	pid    int // for the log only: the pidfd, not the pid, names the process
	onExit func()
}

func newMonitor() (*monitor, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	// The pidfd watches are keyed by descriptor; the eventfd's is -1.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: -1}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, stop, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(stop)
		return nil, err
	}
	m := &monitor{epfd: epfd, stop: stop, done: make(chan struct{}), cbs: map[int32]watch{}}
	go m.loop()
	return m, nil
}

// close stops the monitor's pidfd watches without calling them: its loop
// ends, and its descriptors (the epoll set, the pidfds it owns) close. A
// closed epoll descriptor alone would not wake an epoll_wait already
// blocked on it: the goroutine and its thread stayed for good, one per
// closed backend. The sandboxes live on; a next backend adopts them.
func (m *monitor) close() {
	select {
	case <-m.done: // closed already: its descriptors are, too
		return
	default:
	}
	var one = [8]byte{1}
	_, _ = unix.Write(m.stop, one[:])
	<-m.done
}

// watch calls onExit once when pid exits. It takes ownership of pidfd.
func (m *monitor) watch(pidfd, pid int, onExit func()) error {
	m.mu.Lock()
	m.cbs[int32(pidfd)] = watch{pid: pid, onExit: onExit}
	m.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(pidfd)}
	if err := unix.EpollCtl(m.epfd, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
		m.mu.Lock()
		delete(m.cbs, int32(pidfd))
		m.mu.Unlock()
		return err
	}
	return nil
}

// watchGroup calls onExit once the cgroup whose cgroup.events file is
// events has no process left: the init pid and all of its pid namespace
// are gone. child says pid is this daemon's unreaped child, which is then
// reaped (by pid: an unreaped child's pid cannot have been reused) before
// onExit. The caller has checked that the init is alive and in the group;
// a group that emptied before the watch began fires at once.
func (m *monitor) watchGroup(events string, pid int, child bool, onExit func()) error {
	g, err := sharedGroupWatcher()
	if err != nil {
		return err
	}
	return g.add(gwatch{events: events, pid: pid, child: child, onExit: onExit})
}

// count is how many processes are watched through a descriptor of their
// own (a pidfd each).
func (m *monitor) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.cbs)
}

func (m *monitor) loop() {
	defer func() {
		m.mu.Lock()
		for fd := range m.cbs {
			unix.Close(int(fd))
		}
		m.cbs = map[int32]watch{}
		m.mu.Unlock()
		unix.Close(m.epfd)
		unix.Close(m.stop)
		close(m.done)
	}()
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(m.epfd, events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			// Not expected (only this loop closes the epoll set, once
			// close() asked through the eventfd); going on matters more than stopping: a
			// monitor that ended silently would leave every later exit
			// unnoticed.
			slog.Error("sandbox exit monitor: epoll_wait failed; retrying", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, ev := range events[:n] {
			if ev.Fd == -1 {
				return // close()
			}
			m.mu.Lock()
			w, ok := m.cbs[ev.Fd]
			delete(m.cbs, ev.Fd)
			m.mu.Unlock()
			if !ok {
				continue
			}
			_ = unix.EpollCtl(m.epfd, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
			reap(int(ev.Fd), w.pid)
			unix.Close(int(ev.Fd))
			w.onExit() // cancels a context: must not block
		}
	}
}

// groupWatcher is the process's one inotify instance for every monitor's
// group watches: fs.inotify.max_user_instances (128 by default) is shared
// by all of the node's root processes, and an instance per backend ran
// out in the daemon's tests, which make hundreds. It is read through the
// runtime's poller (no thread of its own).
type groupWatcher struct {
	f   *os.File
	ino int
	mu  sync.Mutex
	// By watch descriptor. Watch descriptors are not reused while the
	// instance lives (the kernel hands them out cyclically from 1): a
	// stale event cannot name a newer watch. A second watch of the same
	// file (two backends in one process: tests) gets the same one.
	grps map[int32][]gwatch
	// byPath finds a group's watch by its cgroup.events file (gone).
	byPath map[string]int32
}

// gwatch is a sandbox watched through its group's cgroup.events.
type gwatch struct {
	events string // the cgroup.events file
	pid    int    // the init
	child  bool   // the init is this daemon's unreaped child: reap it by pid
	onExit func()
}

var groupWatch struct {
	once sync.Once
	w    *groupWatcher
	err  error
}

// sharedGroupWatcher starts the process's group watcher on first use.
func sharedGroupWatcher() (*groupWatcher, error) {
	groupWatch.once.Do(func() {
		ino, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			groupWatch.err = fmt.Errorf("inotify_init1: %w", err)
			return
		}
		g := newGroupWatcher(ino)
		groupWatch.w = g
		go g.loop()
	})
	return groupWatch.w, groupWatch.err
}

// newGroupWatcher is a group watcher over inotify descriptor ino; its
// loop is the caller's to start.
func newGroupWatcher(ino int) *groupWatcher {
	return &groupWatcher{f: os.NewFile(uintptr(ino), "inotify"), ino: ino, grps: map[int32][]gwatch{}, byPath: map[string]int32{}}
}

func (g *groupWatcher) add(w gwatch) error {
	g.mu.Lock()
	wd, err := unix.InotifyAddWatch(g.ino, w.events, unix.IN_MODIFY)
	if err != nil {
		g.mu.Unlock()
		return err
	}
	g.grps[int32(wd)] = append(g.grps[int32(wd)], w)
	g.byPath[w.events] = int32(wd)
	g.mu.Unlock()
	// An emptying before the watch was added made no event we could see.
	g.check(int32(wd), false)
	return nil
}

// loop reads the inotify descriptor and checks each group an event names.
// IN_MODIFY comes for every change of cgroup.events (populated, frozen);
// IN_IGNORED once the group's directory is removed, which only an empty
// group allows. An overflow (IN_Q_OVERFLOW, past
// fs.inotify.max_queued_events) lost events: every group is looked at.
func (g *groupWatcher) loop() {
	buf := make([]byte, 64<<10) // ~4,000 events a read
	for {
		n, err := g.f.Read(buf)
		if err != nil {
			// Not expected (the descriptor is never closed); going on
			// matters more than stopping, as in the monitor's loop.
			slog.Error("sandbox exit monitor: reading inotify failed; retrying", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				g.checkAll()
			case ev.Mask&unix.IN_IGNORED != 0:
				g.check(ev.Wd, true)
			default:
				g.check(ev.Wd, false)
			}
		}
	}
}

func (g *groupWatcher) checkAll() {
	g.mu.Lock()
	wds := make([]int32, 0, len(g.grps))
	for wd := range g.grps {
		wds = append(wds, wd)
	}
	g.mu.Unlock()
	for _, wd := range wds {
		g.check(wd, false)
	}
}

// check fires the watch wd if its group is empty (or gone: removed says
// the kernel dropped the watch with the directory).
func (g *groupWatcher) check(wd int32, removed bool) {
	g.mu.Lock()
	ws, ok := g.grps[wd]
	g.mu.Unlock()
	if !ok {
		return
	}
	if !removed {
		populated, err := cgroups.Populated(ws[0].events)
		switch {
		case err == nil && populated:
			return
		case err != nil && !errors.Is(err, os.ErrNotExist):
			// Not expected (the file is the kernel's); the next event
			// or an overflow looks again.
			slog.Warn("sandbox exit monitor: reading cgroup.events", "file", ws[0].events, "err", err)
			return
		}
	}
	g.mu.Lock()
	ws, ok = g.grps[wd]
	delete(g.grps, wd)
	if ok && g.byPath[ws[0].events] == wd {
		delete(g.byPath, ws[0].events)
	}
	g.mu.Unlock()
	if !ok {
		return // fired meanwhile
	}
	if !removed {
		_, _ = unix.InotifyRmWatch(g.ino, uint32(wd))
	}
	for _, w := range ws {
		if !w.child {
			w.onExit()
			continue
		}
		// The group empties as the init's exit passes the cgroup step,
		// a little before the init can be waited for: wait for it off
		// the loop.
		go func() {
			reapChild(w.pid)
			w.onExit()
		}()
	}
}

// groupRemoved looks again at the watches of the group whose
// cgroup.events file is events, which this process just removed. The
// kernel sends no inotify event for a cgroup file that goes with its
// directory, and it rate-limits cgroup.events notifications (one per
// 10 ms, later ones by timer): a group that empties within 10 ms of its
// last notification (a kill right after a thaw) and is removed at once
// cancels that timer, and its "populated 0" never comes. The conformance
// suite's NetworkLeaks saw it when one backend swept a sandbox another
// watched (its init stayed a zombie, its Exited never fired).
func groupRemoved(events string) {
	if events == "" {
		return
	}
	g, err := sharedGroupWatcher()
	if err != nil {
		return
	}
	g.mu.Lock()
	wd, ok := g.byPath[events]
	g.mu.Unlock()
	if ok {
		g.check(wd, false)
	}
}

// reapChild waits for pid, this daemon's child, to exit and collects it.
func reapChild(pid int) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err != unix.EINTR {
			if err != nil && err != unix.ECHILD {
				slog.Warn("reaping sandbox init", "pid", pid, "err", err)
			}
			return
		}
	}
}

// reap collects the exit status of the process pidfd refers to if it is
// this daemon's child; one adopted after a restart is not (ECHILD), and
// the host's init reaps it. Waiting by pidfd, not by pid: the pid of an
// adopted init that exited may already belong to another child of this
// daemon, whose status a wait by pid would steal.
func reap(pidfd, pid int) {
	for {
		err := unix.Waitid(unix.P_PIDFD, pidfd, nil, unix.WEXITED|unix.WNOHANG, nil)
		switch err {
		case unix.EINTR:
			continue
		case nil, unix.ECHILD:
		default:
			slog.Warn("reaping sandbox init", "pid", pid, "err", err)
		}
		return
	}
}

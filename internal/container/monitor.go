package container

import (
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// monitor watches every sandbox init through a pidfd in one epoll set, so
// that thousands of sandboxes cost one goroutine and one thread rather
// than one blocked wait per sandbox.
type monitor struct {
	epfd int
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
	m := &monitor{epfd: epfd, cbs: map[int32]watch{}}
	go m.loop()
	return m, nil
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

// count is how many processes are watched (one pidfd each).
func (m *monitor) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.cbs)
}

func (m *monitor) loop() {
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(m.epfd, events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			if err == unix.EBADF {
				return // closed
			}
			// Not expected; going on matters more than stopping: a
			// monitor that ended silently would leave every later exit
			// unnoticed.
			slog.Error("sandbox exit monitor: epoll_wait failed; retrying", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, ev := range events[:n] {
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

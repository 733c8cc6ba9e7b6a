package container

import (
	"sync"

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
	pid    int
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

func (m *monitor) loop() {
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(m.epfd, events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return
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
			unix.Close(int(ev.Fd))
			// Reap it if it is our child (created by this daemon); after a
			// restart it is not, and the host's init reaps it.
			var ws unix.WaitStatus
			_, _ = unix.Wait4(w.pid, &ws, unix.WNOHANG, nil)
			w.onExit() // cancels a context: must not block
		}
	}
}

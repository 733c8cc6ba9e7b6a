package container

import (
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// nsPool keeps network namespaces made ahead of the creates that take
// them, each with its loopback up, made by one goroutine in the
// background. A new network namespace was the costliest part of the
// init's clone (a p50 of ~240 us of its ~600 here: every protocol's
// per-namespace setup) and bringing its lo up another ~50 us of the init
// stage; a sandbox given one from the pool is cloned without
// CLONE_NEWNET, and its init joins the namespace (setns, a few us) before
// anything else. Only sandboxes with network mode none take them: the
// daemon attaches the others' interfaces to the init's namespace before
// sending its config, before the init has joined a pooled one. An empty
// pool (a burst of creates) means a clone with CLONE_NEWNET, as before.
//
// A namespace is made by the host's root in the host's user namespace,
// as the clone made it, and has never held a process: nothing in it but
// lo. Its memory is charged to the daemon's cgroup, as the clone's was
// (the clone runs before the init joins the sandbox's cgroup).
type nsPool struct {
	size int

	mu     sync.Mutex
	ready  []*os.File // /proc/thread-self/ns/net of each namespace
	closed bool
	kick   chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

// nsPoolSize covers a few creates in a row while the filler catches up
// (~0.3 ms a namespace); each idle namespace is ~a few tens of KiB of
// kernel memory.
const nsPoolSize = 4

func newNSPool(size int) *nsPool {
	p := &nsPool{size: size, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go p.fill()
	p.wake()
	return p
}

// take returns a namespace for the caller to pass to a sandbox's init
// and close, or nil when the pool is empty.
func (p *nsPool) take() *os.File {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wake()
	if len(p.ready) == 0 {
		return nil
	}
	f := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	return f
}

func (p *nsPool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// fill makes the namespaces from one thread, locked to it and never
// unlocked: each unshare moves the thread into the namespace it makes, so
// no other goroutine may run there, and a thread made and ended for each
// namespace (as Go does for one never unlocked) cost more than the
// namespace here. The runtime ends the thread with the filler.
func (p *nsPool) fill() {
	runtime.LockOSThread()
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		for {
			p.mu.Lock()
			full := p.closed || len(p.ready) >= p.size
			p.mu.Unlock()
			if full {
				break
			}
			f, err := newNetNS()
			if err != nil {
				// Creates clone their own namespace meanwhile; the next
				// take tries again.
				break
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				f.Close()
				return
			}
			p.ready = append(p.ready, f)
			p.mu.Unlock()
		}
	}
}

// close stops the filler and drops the namespaces no create took.
func (p *nsPool) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	for _, f := range ready {
		f.Close()
	}
}

// newNetNS makes a network namespace with its loopback up and moves the
// calling thread, which must be locked, into it.
func newNetNS() (*os.File, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, os.NewSyscallError("unshare network namespace", err)
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "/proc/thread-self/ns/net", Err: err}
	}
	f := os.NewFile(uintptr(fd), "netns")
	if err := loopbackUp(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// loopbackUp sets lo up in the calling thread's network namespace, as
// the init stage's loopback_up does in a namespace of its own.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return os.NewSyscallError("SIOCGIFFLAGS lo", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return os.NewSyscallError("SIOCSIFFLAGS lo", err)
	}
	return nil
}

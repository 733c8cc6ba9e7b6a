package container

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

var _ backend.PortDialer = (*sandbox)(nil)

// portDialTimeout bounds a connect to a sandbox's loopback: it answers at
// once (accepted or refused) unless the listener's backlog is full.
const portDialTimeout = 10 * time.Second

// DialPort connects to TCP port on the sandbox's loopback from a thread
// moved into the sandbox's network namespace for the socket() and
// connect() calls: the socket stays in that namespace for its life, so
// the connection never crosses the host's network nor the sandbox's
// egress filter, and a sandbox without a network is reached alike. The
// namespace is the init's, opened by pid and then proven to be the same
// init by its start time (as attach does), so a reused pid cannot lead
// into another process's namespace.
func (s *sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, errdefs.Invalidf("port %d: want 1 to 65535", port)
	}
	if hostNetnsErr != nil {
		return nil, errdefs.Wrap(errdefs.Internal, hostNetnsErr, "open the daemon's network namespace")
	}
	pid := s.st.Pid
	ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Conflict, err, "sandbox "+s.id+": open its network namespace (has it stopped?)")
	}
	defer ns.Close()
	if st, err := procStartTime(pid); err != nil || st != s.st.StartTime {
		return nil, errdefs.Conflictf("sandbox %s: its init is gone", s.id)
	}
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: errdefs.Wrap(errdefs.Internal, err, "enter the sandbox's network namespace")}
			return
		}
		// Every step of the dial (socket, connect, the wait for it) runs
		// on this locked thread: one address at a time, no resolver.
		// IPv4's loopback first (servers on 0.0.0.0, 127.0.0.1 or a
		// dual-stack ::), then IPv6's, for a server bound to ::1 only.
		d := net.Dialer{Timeout: portDialTimeout}
		c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if errors.Is(err, syscall.ECONNREFUSED) {
			if c6, err6 := d.DialContext(ctx, "tcp6", net.JoinHostPort("::1", strconv.Itoa(port))); err6 == nil {
				c, err = c6, nil
			}
		}
		if unix.Setns(hostNetnsFD, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	if r.err != nil {
		if errors.Is(r.err, syscall.ECONNREFUSED) {
			return nil, errdefs.Wrap(errdefs.Unavailable, r.err, fmt.Sprintf("nothing listens on port %d in sandbox %s", port, s.id))
		}
		if errdefs.CategoryOf(r.err) != errdefs.Unknown {
			return nil, r.err
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, r.err, fmt.Sprintf("connect to port %d in sandbox %s", port, s.id))
	}
	return r.c, nil
}

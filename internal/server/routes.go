package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"

	"golang.org/x/net/netutil"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/caller"
	"github.com/warrenrl/warren/internal/errdefs"
)

// The routes of harness sandboxes (daemon.Router): one unix socket per
// harness, in a directory of the harness's own (its /dev), served by an
// http.Server of its own whose every request carries the harness's id
// (caller.WithHarness), which the scope check (scope.go) then enforces.
// The listener is the credential: nothing else reaches that socket but
// the harness (and root on the host), so no token can leak.
//
// Routes opened before Serve (the daemon adopting live harnesses at
// start) wait and are served from Serve on; Serve's shutdown closes them
// all. Closing a route closes its listener, removes the socket file and
// ends its calls in flight.

// A harness is a sandbox, not a trusted client: its route takes fewer
// connections, streams and unread bytes than the node's socket, so that
// one harness cannot hold thousands of the daemon's goroutines or
// gigabytes of its buffers. 32 connections of 256 streams still carry a
// harness driving its whole cap of children with several calls each.
const (
	RouteMaxConns      = 32
	RouteMaxStreams    = 256
	routeRecvPerConn   = 16 << 20
	routeRecvPerStream = 4 << 20
)

// route is one harness's listener and server.
type route struct {
	id     string
	budget *budget // its calls' bucket (budget.go); nil: none
	ln     *net.UnixListener
	srv    *http.Server  // nil until served
	done   chan struct{} // closed when srv.Serve returned; nil until served
}

// OpenRoute listens on the unix socket path for calls of harness id,
// replacing a route id had (and whatever is at path: the directory is the
// harness's own, and a file there is a dead daemon's socket or the
// harness's doing).
func (s *Server) OpenRoute(id, path string) error {
	ln, err := listenRoute(path)
	if err != nil {
		return err
	}
	r := &route{id: id, ln: ln, budget: newBudget(s.cfg.HarnessCallsPerSecond, s.cfg.HarnessCallBurst)}
	s.routeMu.Lock()
	if s.routesClosed {
		s.routeMu.Unlock()
		_ = ln.Close()
		return errdefs.Unavailablef("the server is shutting down")
	}
	if s.routes == nil {
		s.routes = map[string]*route{}
	}
	old := s.routes[id]
	s.routes[id] = r
	if s.serveRoute != nil {
		s.serveRoute(r)
	}
	s.routeMu.Unlock()
	if old != nil {
		old.close()
	}
	return nil
}

// CloseRoute closes harness id's route, if it has one, and waits until
// its server stopped.
func (s *Server) CloseRoute(id string) {
	s.routeMu.Lock()
	r := s.routes[id]
	delete(s.routes, id)
	s.routeMu.Unlock()
	if r != nil {
		r.close()
	}
}

// Routes lists the harnesses that have a route (for tests).
func (s *Server) Routes() []string {
	s.routeMu.Lock()
	defer s.routeMu.Unlock()
	out := make([]string, 0, len(s.routes))
	for id := range s.routes {
		out = append(out, id)
	}
	return out
}

// startRoutes serves the routes opened so far and every one opened from
// now on with h; the returned func stops them all and refuses new ones.
func (s *Server) startRoutes(reqCtx context.Context, h http.Handler, log *slog.Logger) (stop func()) {
	serve := func(r *route) {
		r.srv = NewHTTPServer(h)
		r.srv.HTTP2.MaxConcurrentStreams = RouteMaxStreams
		r.srv.HTTP2.MaxReceiveBufferPerConnection = routeRecvPerConn
		r.srv.HTTP2.MaxReceiveBufferPerStream = routeRecvPerStream
		r.srv.BaseContext = func(net.Listener) context.Context {
			return withBudget(caller.WithHarness(reqCtx, r.id), r.budget)
		}
		r.srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
		r.done = make(chan struct{})
		go func() {
			defer close(r.done)
			if err := r.srv.Serve(netutil.LimitListener(r.ln, RouteMaxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Warn("harness route failed", "harness", r.id, "err", err)
			}
		}()
	}
	s.routeMu.Lock()
	s.serveRoute = serve
	for _, r := range s.routes {
		serve(r)
	}
	s.routeMu.Unlock()
	return func() {
		s.routeMu.Lock()
		s.routesClosed, s.serveRoute = true, nil
		all := s.routes
		s.routes = nil
		s.routeMu.Unlock()
		for _, r := range all {
			r.close()
		}
	}
}

func (r *route) close() {
	if r.srv != nil {
		_ = r.srv.Close()
		<-r.done
	}
	// Removes the socket file (unlink on close) if Serve did not.
	_ = r.ln.Close()
}

// listenRoute binds a unix socket at path that every user of the harness
// may connect to (mode 0666: the directory is the harness's alone, and a
// harness in a user namespace runs as an unprivileged host id). The mode
// is set through a descriptor opened without following links, so a
// harness that swaps the file for a symlink to a host file between the
// bind and the chmod gains nothing.
func listenRoute(path string) (*net.UnixListener, error) {
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, errdefs.Wrap(errdefs.Internal, err, "remove the old socket "+path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "listen on "+path)
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = ln.Close()
		return nil, errdefs.Wrap(errdefs.Internal, err, "open the socket "+path)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		_ = ln.Close()
		return nil, errdefs.Internalf("%s is not the socket just bound (replaced meanwhile?): %v", path, err)
	}
	// chmod of /proc/self/fd/N changes the inode fd refers to, which
	// is a socket: no link is followed past it.
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), 0o666); err != nil {
		_ = ln.Close()
		return nil, errdefs.Wrap(errdefs.Internal, err, fmt.Sprintf("chmod the socket %s", path))
	}
	return ln, nil
}

package e2b

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/server"
)

// The proxy to the sandboxes' own servers: what E2B's get_host(port)
// names (PORT-ID.DOMAIN, or E2b-Sandbox-Id and E2b-Sandbox-Port). It is
// the standard library's reverse proxy over connections the Manager makes
// into the sandbox (DialPort: on the node, from inside the sandbox's
// network namespace; on a gateway, through the sandbox's node), so
// streaming responses and upgrades (WebSockets) pass through. As E2B's
// sandbox URLs are by default, it is open to whoever reaches the door:
// no key or token is asked for (docs/E2B.md).

// targetKey carries the sandbox and port of a proxied request to the
// transport's dial.
type targetKey struct{}

type target struct {
	id   string
	port int
}

func (s *Server) newProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			t, _ := ctx.Value(targetKey{}).(target)
			c, err := s.m.DialPort(ctx, t.id, t.port)
			if err != nil {
				return nil, err
			}
			return s.ports.Track(t.id, c), nil
		},
		// Connections are kept per sandbox and port (the URL's host
		// below), briefly: pause and fork close them (ports.CloseAll).
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		// Servers in sandboxes speak HTTP/1.1 (or upgrade from it).
		ForceAttemptHTTP2: false,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t, _ := pr.In.Context().Value(targetKey{}).(target)
			pr.Out.URL.Scheme = "http"
			// The host keys the transport's idle connections; the
			// request's Host header stays the client's.
			pr.Out.URL.Host = net.JoinHostPort(t.id, strconv.Itoa(t.port))
			pr.SetXForwarded()
		},
		Transport:     tr,
		FlushInterval: -1, // streams (SSE, chunked) pass at once
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ErrorHandler:  s.proxyError,
	}
}

// proxyPort passes r to port of sandbox id.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request, id, portText string) {
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("port %q of sandbox %s: want 1 to 65535", portText, id))
		return
	}
	ctx := context.WithValue(r.Context(), targetKey{}, target{id, port})
	s.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// proxyError answers a request the proxy could not pass on: 404 for a
// sandbox that does not exist (E2B's SDKs read it as gone), 502 with the
// reason otherwise (nothing listens on the port, the sandbox is paused or
// stopped, its node is down).
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(targetKey{}).(target)
	switch server.CategoryOf(err) {
	case errdefs.NotFound:
		writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %s not found", t.id))
		return
	case errdefs.Invalid:
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if errors.Is(err, context.Canceled) {
		// The client went away; nobody reads the answer.
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	s.log.Debug("e2b port proxy", "sandbox", t.id, "port", t.port, "err", err)
	writeError(w, http.StatusBadGateway, fmt.Sprintf("port %d of sandbox %s is not reachable: %v", t.port, t.id, err))
}

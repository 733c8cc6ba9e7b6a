// Package server exposes a daemon Manager over HTTP: the connect services
// of api/warren/v1 (gRPC, gRPC-Web, Connect) plus a few plain HTTP
// endpoints, on a unix socket and optionally on TCP with bearer-token auth.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

// DefaultSocket is where the daemon listens unless told otherwise.
const DefaultSocket = "/run/warren/warren.sock"

// MaxConcurrentStreams is the HTTP/2 stream limit per connection. Clients
// multiplex many calls on one connection (long WaitProcess and ExecStream
// calls included), so it is generous; clients open another connection
// when it is reached.
const MaxConcurrentStreams = 4096

// Config configures a Server.
type Config struct {
	// SocketPath is the unix socket to listen on; empty disables it.
	SocketPath string
	// ListenAddr is an optional TCP address such as 127.0.0.1:7070.
	ListenAddr string
	// Token is the bearer token required on the TCP listener.
	Token string
	// InsecureNoAuth allows a TCP listener without a token.
	InsecureNoAuth bool
	// Metrics serves GET /metrics; nil disables it.
	Metrics http.Handler
	Logger  *slog.Logger
	// ShutdownTimeout bounds the graceful shutdown; in-flight calls are
	// cancelled after it. Zero means 10s.
	ShutdownTimeout time.Duration
	// Size limits; zero selects the defaults.
	ReadMaxBytes    int
	ArchiveMaxBytes int64
	ImageMaxBytes   int64
	// StallTimeout cuts archive downloads and uploads whose client moves
	// no data for this long (HandlerOptions.StallTimeout); zero means
	// DefaultStallTimeout.
	StallTimeout time.Duration
	// HarnessCallsPerSecond and HarnessCallBurst are each harness
	// route's call budget (budget.go); zero selects the defaults, a
	// negative rate none.
	HarnessCallsPerSecond float64
	HarnessCallBurst      int
	// UI serves the web dashboard under /ui/ on the socket and the TCP
	// listener (never on a harness's route); nil disables it.
	UI UIFactory
}

// Server serves the API on its listeners.
type Server struct {
	cfg    Config
	log    *slog.Logger
	unixLn net.Listener
	tcpLn  net.Listener

	// The routes of harness sandboxes (routes.go).
	routeMu      sync.Mutex
	routes       map[string]*route
	serveRoute   func(*route) // set while Serve serves
	routesClosed bool
}

// New checks cfg and returns a Server that is not listening yet.
func New(cfg Config) (*Server, error) {
	if cfg.SocketPath == "" && cfg.ListenAddr == "" {
		return nil, errdefs.Invalidf("no listener configured: need a socket path or a TCP address")
	}
	if cfg.ListenAddr != "" && cfg.Token == "" && !cfg.InsecureNoAuth {
		return nil, errdefs.Invalidf("refusing to listen on TCP %s without a token (use --token-file or WARREN_TOKEN, or --insecure-no-auth)", cfg.ListenAddr)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	return &Server{cfg: cfg, log: cfg.Logger}, nil
}

// Listen opens the listeners. Call it before building the Manager: it fails
// when another daemon already serves the socket.
func (s *Server) Listen() error {
	if s.cfg.SocketPath != "" {
		ln, err := ListenUnix(s.cfg.SocketPath)
		if err != nil {
			return err
		}
		s.unixLn = ln
	}
	if s.cfg.ListenAddr != "" {
		ln, err := ListenTCP(s.cfg.ListenAddr)
		if err != nil {
			s.Close()
			return fmt.Errorf("listen on %s: %w", s.cfg.ListenAddr, err)
		}
		s.tcpLn = ln
	}
	return nil
}

// SetMetrics sets the /metrics handler after New (before Serve): a
// gateway's metrics read the gateway, made after the listeners.
func (s *Server) SetMetrics(h http.Handler) { s.cfg.Metrics = h }

// Addrs returns the addresses being listened on (after Listen).
func (s *Server) Addrs() []net.Addr {
	var out []net.Addr
	for _, ln := range []net.Listener{s.unixLn, s.tcpLn} {
		if ln != nil {
			out = append(out, ln.Addr())
		}
	}
	return out
}

// Close closes listeners that Serve has not taken over, and the harness
// routes opened without being served.
func (s *Server) Close() {
	for _, ln := range []*net.Listener{&s.unixLn, &s.tcpLn} {
		if *ln != nil {
			(*ln).Close()
			*ln = nil
		}
	}
	s.routeMu.Lock()
	var pending []*route
	if s.serveRoute == nil {
		for _, r := range s.routes {
			pending = append(pending, r)
		}
		s.routes = nil
	}
	s.routeMu.Unlock()
	for _, r := range pending {
		r.close()
	}
}

// NewHTTPServer returns an http.Server for h that speaks HTTP/1.1 and
// HTTP/2 with prior knowledge (h2c), as gRPC over plain TCP needs.
func NewHTTPServer(h http.Handler) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &protos,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          MaxConcurrentStreams,
			MaxReceiveBufferPerConnection: 64 << 20,
			MaxReceiveBufferPerStream:     8 << 20,
		},
	}
}

// Serve serves m on the listeners until ctx is done, then shuts down
// gracefully: it stops accepting, lets in-flight calls finish for up to
// ShutdownTimeout and then cancels them. It does not close m. It returns
// early with an error if a listener fails.
func (s *Server) Serve(ctx context.Context, m Manager) error {
	if s.unixLn == nil && s.tcpLn == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	base := HandlerOptions{
		Metrics:         s.cfg.Metrics,
		Logger:          s.log,
		ReadMaxBytes:    s.cfg.ReadMaxBytes,
		ArchiveMaxBytes: s.cfg.ArchiveMaxBytes,
		ImageMaxBytes:   s.cfg.ImageMaxBytes,
		StallTimeout:    s.cfg.StallTimeout,
	}
	reqCtx, cancelReqs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()

	type served struct {
		srv *http.Server
		ln  net.Listener
	}
	var all []served
	var uiAPI *http.Client
	uiStopping := make(chan struct{})
	if s.cfg.UI != nil {
		// The dashboard's own way in: the API without a token, in
		// process. Only the dashboard holds a client of it.
		pl := newPipeListener()
		all = append(all, served{NewHTTPServer(NewHandler(m, base)), pl})
		uiAPI = pl.client()
		defer uiAPI.CloseIdleConnections()
	}
	withUI := func(o HandlerOptions) HandlerOptions {
		if s.cfg.UI != nil {
			o.UI = s.cfg.UI(uiAPI, s.cfg.Metrics, o.Token, uiStopping)
		}
		return o
	}
	if s.unixLn != nil {
		srv := NewHTTPServer(NewHandler(m, withUI(base)))
		all = append(all, served{srv, s.unixLn})
	}
	if s.tcpLn != nil {
		o := base
		o.Token = s.cfg.Token
		srv := NewHTTPServer(NewHandler(m, withUI(o)))
		all = append(all, served{srv, s.tcpLn})
	}
	errc := make(chan error, len(all))
	var wg sync.WaitGroup
	for _, sv := range all {
		sv.srv.BaseContext = func(net.Listener) context.Context { return reqCtx }
		sv.srv.ErrorLog = slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
		if _, ok := sv.ln.(*pipeListener); !ok {
			s.log.Info("listening", "addr", sv.ln.Addr().String(), "network", sv.ln.Addr().Network())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sv.srv.Serve(sv.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve %s: %w", sv.ln.Addr(), err)
			}
		}()
	}
	// Serve owns the listeners now; http.Server closes them.
	s.unixLn, s.tcpLn = nil, nil
	// Harness routes share one handler; the listener says who calls.
	stopRoutes := s.startRoutes(reqCtx, NewHandler(m, base), s.log)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	s.log.Info("shutting down", "grace", s.cfg.ShutdownTimeout)
	close(uiStopping)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	var swg sync.WaitGroup
	for _, sv := range all {
		swg.Add(1)
		go func() {
			defer swg.Done()
			if err := sv.srv.Shutdown(sctx); err != nil {
				s.log.Warn("graceful shutdown timed out; cancelling in-flight calls", "addr", sv.ln.Addr().String())
				cancelReqs()
				sv.srv.Close()
			}
		}()
	}
	swg.Wait()
	wg.Wait()
	stopRoutes()
	return serveErr
}

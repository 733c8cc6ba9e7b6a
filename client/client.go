// Package client is the Go SDK of the Warren daemon.
//
//	c, err := client.New("") // $WARREN_ADDR or unix:///run/warren/warren.sock
//	sb, err := c.Create(ctx, &warrenv1.CreateRequest{Image: "debian"})
//	res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.Id, Shell: "echo hi"})
//
// A Client is safe for concurrent use and multiplexes calls over HTTP/2
// connections, so one Client per process is enough even for thousands of
// concurrent calls. Failed calls return an *Error carrying the error
// category (see IsNotFound and friends).
//
// Inside a harness sandbox (CreateRequest.harness) $WARREN_ADDR names the
// harness's route to the API, unix:///dev/warren.sock, so client.New("")
// there reaches it: Create makes the harness's own sandboxes, List shows
// them only, and calls on anything else are PermissionDenied
// (IsPermissionDenied).
package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
)

// DefaultAddr is the daemon's default unix socket.
const DefaultAddr = "unix:///run/warren/warren.sock"

// Environment variables read by New.
const (
	EnvAddr  = "WARREN_ADDR"
	EnvToken = "WARREN_TOKEN"
)

// Client talks to one Warren daemon.
type Client struct {
	sandboxes warrenv1connect.SandboxServiceClient
	images    warrenv1connect.ImageServiceClient
	system    warrenv1connect.SystemServiceClient

	http *http.Client // plain HTTP endpoints (archives, image and layer uploads)
	// createRetry is how long Create keeps sending a create again after
	// Unavailable answers (WithCreateRetry).
	createRetry time.Duration
	baseURL     string
	addr        string
	unix        bool
	close       func()

	// For DialPort, which dials its own connection (an HTTP/1.1 upgrade).
	network, target string
	token, ua       string
	tlsConfig       *tls.Config
}

type options struct {
	token      string
	tokenSet   bool
	http1      bool
	userAgent  string
	tlsConfig  *tls.Config
	httpClient *http.Client
	connectOps []connect.ClientOption
	// createRetry: WithCreateRetry; nil means DefaultCreateRetry.
	createRetry *time.Duration
}

// DefaultCreateRetry is how long Create sends a create again after
// Unavailable answers (a gateway restarting, a connection lost) unless
// WithCreateRetry says otherwise.
const DefaultCreateRetry = 30 * time.Second

// WithCreateRetry sets how long Create keeps sending a create again after
// an Unavailable answer (0: never). Every attempt carries the same
// idempotency key, so a retry whose earlier attempt was made after all
// answers that sandbox instead of making a second.
func WithCreateRetry(d time.Duration) Option {
	return func(o *options) { o.createRetry = &d }
}

// Option configures New.
type Option func(*options)

// WithToken sets the bearer token sent with every request (default:
// $WARREN_TOKEN). The daemon requires it on TCP listeners only.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSet = token, true }
}

// WithHTTP1 talks HTTP/1.1 and the Connect protocol instead of gRPC over
// HTTP/2, for proxies that do not pass HTTP/2 through. Calls are then not
// multiplexed: each in-flight call holds a connection.
func WithHTTP1() Option { return func(o *options) { o.http1 = true } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(o *options) { o.userAgent = ua } }

// WithTLSConfig sets the TLS configuration for https:// addresses.
func WithTLSConfig(c *tls.Config) Option { return func(o *options) { o.tlsConfig = c } }

// WithHTTPClient replaces the HTTP client entirely (the address then only
// supplies the base URL; unix socket dialing is up to the caller).
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithConnectOptions appends options to the underlying connect clients
// (interceptors, for example).
func WithConnectOptions(opts ...connect.ClientOption) Option {
	return func(o *options) { o.connectOps = append(o.connectOps, opts...) }
}

// New returns a client of the daemon at addr, one of
//
//	unix:///run/warren/warren.sock   (also a bare absolute path)
//	http://127.0.0.1:7070            (also host:port)
//	https://warren.example.com
//
// An empty addr means $WARREN_ADDR, or DefaultAddr. New does not connect;
// the first call does.
func New(addr string, opts ...Option) (*Client, error) {
	if addr == "" {
		addr = os.Getenv(EnvAddr)
	}
	if addr == "" {
		addr = DefaultAddr
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if !o.tokenSet {
		o.token = os.Getenv(EnvToken)
	}
	if o.userAgent == "" {
		o.userAgent = "warren-go-client"
	}

	network, target, baseURL, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	c := &Client{addr: addr, baseURL: baseURL, unix: network == "unix", close: func() {}, createRetry: DefaultCreateRetry,
		network: network, target: target, token: o.token, ua: o.userAgent, tlsConfig: o.tlsConfig}
	if o.createRetry != nil {
		c.createRetry = max(*o.createRetry, 0)
	}

	hc := o.httpClient
	useGRPC := false
	if hc == nil {
		t := &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
			TLSClientConfig:       o.tlsConfig,
			HTTP2: &http.HTTP2Config{
				MaxReceiveBufferPerConnection: 64 << 20,
				MaxReceiveBufferPerStream:     16 << 20,
				SendPingTimeout:               30 * time.Second,
				PingTimeout:                   15 * time.Second,
			},
		}
		dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
		if network == "unix" {
			t.Proxy = nil
			t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, "unix", target)
			}
		} else {
			t.DialContext = dialer.DialContext
		}
		var protos http.Protocols
		switch {
		case o.http1:
			protos.SetHTTP1(true)
		case network == "https":
			// ALPN picks HTTP/2 when the server offers it; the Connect
			// protocol works on either.
			protos.SetHTTP1(true)
			protos.SetHTTP2(true)
		default:
			// Plain text: HTTP/2 with prior knowledge (h2c), gRPC.
			protos.SetUnencryptedHTTP2(true)
			useGRPC = true
		}
		t.Protocols = &protos
		hc = &http.Client{Transport: t}
		c.close = t.CloseIdleConnections
	}
	c.http = &http.Client{Transport: &headerTransport{next: transportOf(hc), token: o.token, ua: o.userAgent}, Jar: hc.Jar}

	copts := []connect.ClientOption{connect.WithReadMaxBytes(256 << 20)}
	if c.unix {
		// Compressing over a local socket only burns CPU.
		copts = append(copts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	if useGRPC {
		copts = append(copts, connect.WithGRPC())
	}
	copts = append(copts, o.connectOps...)
	c.sandboxes = warrenv1connect.NewSandboxServiceClient(c.http, baseURL, copts...)
	c.images = warrenv1connect.NewImageServiceClient(c.http, baseURL, copts...)
	c.system = warrenv1connect.NewSystemServiceClient(c.http, baseURL, copts...)
	return c, nil
}

// Addr returns the address the client was created with.
func (c *Client) Addr() string { return c.addr }

// IsUnix reports whether the client talks to a local unix socket, where
// the daemon shares the client's filesystem.
func (c *Client) IsUnix() bool { return c.unix }

// Close releases idle connections. In-flight calls are not interrupted.
func (c *Client) Close() error {
	c.close()
	return nil
}

func transportOf(hc *http.Client) http.RoundTripper {
	if hc.Transport != nil {
		return hc.Transport
	}
	return http.DefaultTransport
}

// parseAddr splits addr into a network ("unix", "http", "https"), a dial
// target (socket path) and the base URL of requests.
func parseAddr(addr string) (network, target, baseURL string, err error) {
	switch {
	case strings.HasPrefix(addr, "/"):
		return "unix", addr, "http://warren", nil
	case strings.HasPrefix(addr, "unix:"):
		u, err := url.Parse(addr)
		if err != nil {
			return "", "", "", invalidAddr(addr, err)
		}
		p := u.Path
		if u.Opaque != "" { // unix:relative/path
			p = u.Opaque
		}
		if u.Host != "" { // unix://relative/path
			p = u.Host + u.Path
		}
		if p == "" {
			return "", "", "", invalidAddr(addr, fmt.Errorf("no socket path"))
		}
		return "unix", p, "http://warren", nil
	case strings.HasPrefix(addr, "http://"), strings.HasPrefix(addr, "https://"):
		u, err := url.Parse(addr)
		if err != nil {
			return "", "", "", invalidAddr(addr, err)
		}
		if u.Host == "" {
			return "", "", "", invalidAddr(addr, fmt.Errorf("no host"))
		}
		return u.Scheme, u.Host, strings.TrimRight(u.Scheme+"://"+u.Host+u.Path, "/"), nil
	case strings.Contains(addr, "://"):
		return "", "", "", invalidAddr(addr, fmt.Errorf("unsupported scheme (want unix, http or https)"))
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", "", "", invalidAddr(addr, err)
	}
	return "http", addr, "http://" + addr, nil
}

func invalidAddr(addr string, err error) error {
	return &Error{Category: CategoryInvalid, Code: connect.CodeInvalidArgument, Message: fmt.Sprintf("bad daemon address %q: %v", addr, err), err: err}
}

// headerTransport adds the bearer token and user agent to every request.
type headerTransport struct {
	next  http.RoundTripper
	token string
	ua    string
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if t.token != "" {
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	if r.Header.Get("User-Agent") == "" {
		r.Header.Set("User-Agent", t.ua)
	}
	return t.next.RoundTrip(r)
}

// SandboxService, ImageService and SystemService return the generated
// connect clients underneath, for callers that pass messages through as
// they are (the cluster gateway, internal/gateway). Their errors are
// *connect.Error, not *Error.
func (c *Client) SandboxService() warrenv1connect.SandboxServiceClient { return c.sandboxes }
func (c *Client) ImageService() warrenv1connect.ImageServiceClient     { return c.images }
func (c *Client) SystemService() warrenv1connect.SystemServiceClient   { return c.system }

package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/warrenrl/warren/gen/e2b/filesystem/filesystempbconnect"
	"github.com/warrenrl/warren/gen/e2b/process/processpbconnect"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/connset"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/server"
)

// EnvdVersion is the envd version Warren reports. The SDKs gate features
// on it: 0.5.7 is the first with everything this package implements that
// they check for (commands' stdin flag 0.3.0, the sandbox's default user
// when none is named 0.4.0, CloseStdin 0.5.2, octet-stream uploads
// 0.5.7) and below file metadata (0.6.2), which is not implemented.
const EnvdVersion = "0.5.7"

// EnvdPort is the port E2B's SDKs address envd on (E2b-Sandbox-Port, and
// the PORT in a PORT-ID.DOMAIN host).
const EnvdPort = "49983"

// Manager is what this front door calls: a subset of server.Manager plus
// server.PortDialer. *daemon.Manager satisfies it on a node, and
// *gateway.Gateway in a cluster, routing each call to the sandbox's node
// and placing creates; nothing here knows which it has.
type Manager interface {
	Create(context.Context, *warrenv1.CreateRequest) (*warrenv1.Sandbox, error)
	Get(context.Context, *warrenv1.GetRequest) (*warrenv1.Sandbox, error)
	List(context.Context, *warrenv1.ListRequest) (*warrenv1.ListResponse, error)
	Delete(context.Context, *warrenv1.DeleteRequest) (*warrenv1.DeleteResponse, error)
	ExtendTimeout(context.Context, *warrenv1.ExtendTimeoutRequest) (*warrenv1.Sandbox, error)
	UpdateSandbox(context.Context, *warrenv1.UpdateSandboxRequest) (*warrenv1.Sandbox, error)
	Pause(context.Context, *warrenv1.PauseRequest) (*warrenv1.PauseResponse, error)
	Resume(context.Context, *warrenv1.ResumeRequest) (*warrenv1.ResumeResponse, error)
	Hibernate(context.Context, *warrenv1.HibernateRequest) (*warrenv1.HibernateResponse, error)
	Fork(context.Context, *warrenv1.ForkRequest) (*warrenv1.ForkResponse, error)

	Exec(context.Context, *warrenv1.ExecRequest) (*warrenv1.ExecResult, error)
	StartProcess(context.Context, *warrenv1.ExecRequest) (*warrenv1.ProcessInfo, error)
	ListProcesses(context.Context, *warrenv1.ListProcessesRequest) (*warrenv1.ListProcessesResponse, error)
	SignalProcess(context.Context, *warrenv1.SignalProcessRequest) (*warrenv1.SignalProcessResponse, error)
	WriteStdin(context.Context, *warrenv1.WriteStdinRequest) (*warrenv1.WriteStdinResponse, error)
	AttachProcess(ctx context.Context, req *warrenv1.AttachProcessRequest, send func(*warrenv1.ProcessEvent) error) error
	ResizeProcess(context.Context, *warrenv1.ResizeProcessRequest) (*warrenv1.ResizeProcessResponse, error)

	WriteFile(context.Context, *warrenv1.WriteFileRequest) (*warrenv1.WriteFileResponse, error)
	ReadFile(context.Context, *warrenv1.ReadFileRequest) (*warrenv1.ReadFileResponse, error)
	ListFiles(context.Context, *warrenv1.ListFilesRequest) (*warrenv1.ListFilesResponse, error)
	StatFile(context.Context, *warrenv1.StatFileRequest) (*warrenv1.FileInfo, error)
	MakeDir(context.Context, *warrenv1.MakeDirRequest) (*warrenv1.MakeDirResponse, error)
	RemoveFile(context.Context, *warrenv1.RemoveFileRequest) (*warrenv1.RemoveFileResponse, error)
	WatchDir(ctx context.Context, req *warrenv1.WatchDirRequest, send func(*warrenv1.WatchDirEvent) error) error
	SandboxStats(context.Context, *warrenv1.SandboxStatsRequest) (*warrenv1.SandboxStatsResponse, error)

	// DialPort connects to a TCP port inside the sandbox, for the proxy
	// to its servers (proxy.go).
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// Config configures a Server.
type Config struct {
	Addr    string   // TCP address, e.g. 127.0.0.1:3000
	Keys    []string // accepted X-API-Key values (e2b_<hex>); at least one
	Manager Manager
	Logger  *slog.Logger
}

// Server is the E2B front door.
type Server struct {
	cfg      Config
	m        Manager
	log      *slog.Logger
	ln       net.Listener
	http     *http.Server
	rest     http.Handler
	envd     http.Handler
	open     streams  // process streams, by sandbox (pause ends them)
	watchers watchers // the watcher calls' watches (watch.go)
	// proxy passes requests to the sandboxes' own servers (proxy.go);
	// ports are its connections, by sandbox (pause closes them).
	proxy *httputil.ReverseProxy
	ports connset.Set
}

var keyRE = regexp.MustCompile(`^e2b_[0-9a-f]{16,}$`)

// ReadKeys reads an API key file: one key per line, each e2b_ followed by
// at least 16 lowercase hex digits; blank lines and # comments are skipped.
func ReadKeys(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read E2B API key file: %w", err)
	}
	var keys []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !keyRE.MatchString(line) {
			return nil, errdefs.Invalidf("%s line %d: an E2B API key is e2b_ followed by at least 16 lowercase hex digits", path, i+1)
		}
		keys = append(keys, line)
	}
	if len(keys) == 0 {
		return nil, errdefs.Invalidf("%s holds no E2B API key", path)
	}
	return keys, nil
}

// New checks cfg and builds the server; Listen binds it.
func New(cfg Config) (*Server, error) {
	if cfg.Manager == nil {
		return nil, errdefs.Invalidf("e2b: no manager")
	}
	if len(cfg.Keys) == 0 {
		return nil, errdefs.Invalidf("e2b: no API key configured")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, m: cfg.Manager, log: cfg.Logger}
	s.rest = s.restHandler()
	s.proxy = s.newProxy()
	mux := http.NewServeMux()
	mux.Handle(processpbconnect.NewProcessHandler(processService{s}))
	mux.Handle(filesystempbconnect.NewFilesystemHandler(filesystemService{s}))
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /files", s.getFile)
	mux.HandleFunc("POST /files", s.postFiles)
	s.envd = mux
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	// The Python SDK (2.63) speaks HTTP/1.1 to a plain-http URL, streams
	// included; clients that speak HTTP/2 without TLS (prior knowledge)
	// are served too.
	protocols.SetUnencryptedHTTP2(true)
	s.http = &http.Server{
		Handler:           s,
		Protocols:         protocols,
		ReadHeaderTimeout: 30 * time.Second,
		// Idle keep-alive connections of clients that went away are
		// closed; streams in flight are not idle.
		IdleTimeout: 5 * time.Minute,
		ErrorLog:    slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return s, nil
}

// Listen binds the TCP address.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "e2b: listen")
	}
	s.ln = ln
	return nil
}

// Addr is the bound address (after Listen).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until Close; http.ErrServerClosed is not an error.
func (s *Server) Serve() error {
	if err := s.http.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close stops the server: open streams are cut, within a few seconds for
// calls in flight to finish.
func (s *Server) Close() error {
	s.watchers.closeAll()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.http.Shutdown(ctx); err != nil {
		return s.http.Close()
	}
	return nil
}

type ctxKey struct{}

// sandboxOf is the sandbox an envd request is for.
func sandboxOf(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// ServeHTTP routes a request to envd (a PORT-ID.DOMAIN host with envd's
// port, or one of envd's paths for the sandbox E2b-Sandbox-Id names), to
// a server in the sandbox (a PORT-ID.DOMAIN host, or E2b-Sandbox-Id with
// E2b-Sandbox-Port, naming another port) or to the REST API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port := hostSandbox(r.Host)
	if id == "" {
		hid, hport := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
		switch {
		case hid != "" && hport != "" && hport != EnvdPort:
			id, port = hid, hport
		case envdPath(r.URL.Path):
			id, port = hid, hport
		}
	}
	if id == "" {
		s.rest.ServeHTTP(w, r)
		return
	}
	if port != "" && port != EnvdPort {
		s.proxyPort(w, r, id, port)
		return
	}
	if !s.tokenOK(id, r.Header.Get("X-Access-Token")) {
		writeError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token for sandbox "+id)
		return
	}
	s.envd.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, id)))
}

// envdPath tells envd's routes from the REST API's: the two sets are
// disjoint, and the header alone cannot decide, since SDKs send
// E2b-Sandbox-Id on some REST calls too (connect, in 2.x before v2).
func envdPath(p string) bool {
	return p == "/files" || p == "/health" || strings.HasPrefix(p, "/process.Process/") || strings.HasPrefix(p, "/filesystem.Filesystem/")
}

// hostSandbox reads PORT-ID.DOMAIN; a host of any other form names none.
func hostSandbox(host string) (id, port string) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	first, _, ok := strings.Cut(host, ".")
	if !ok {
		return "", ""
	}
	port, id, ok = strings.Cut(first, "-")
	if !ok || port == "" || strings.Trim(port, "0123456789") != "" || !sandboxIDRE.MatchString(id) {
		return "", ""
	}
	return id, port
}

var sandboxIDRE = regexp.MustCompile(`^[a-z0-9]+$`)

// accessToken is the envd access token of sandbox id under key: issued by
// the REST API with the sandbox, checked on every envd call.
func accessToken(key, id string) string {
	mac := hmac.New(sha256.New, []byte(key))
	io.WriteString(mac, "warren-e2b-envd\x00"+id)
	return hex.EncodeToString(mac.Sum(nil))
}

// token is the access token issued for id (under the first key).
func (s *Server) token(id string) string { return accessToken(s.cfg.Keys[0], id) }

// tokenOK accepts a token issued under any configured key, so that a key
// added to the file before the old one is dropped keeps sandboxes reachable.
func (s *Server) tokenOK(id, tok string) bool {
	ok := false
	for _, k := range s.cfg.Keys {
		if subtle.ConstantTimeCompare([]byte(accessToken(k, id)), []byte(tok)) == 1 {
			ok = true
		}
	}
	return ok
}

// keyOK checks X-API-Key.
func (s *Server) keyOK(key string) bool {
	ok := false
	for _, k := range s.cfg.Keys {
		if subtle.ConstantTimeCompare([]byte(k), []byte(key)) == 1 {
			ok = true
		}
	}
	return ok
}

// health answers envd's GET /health the way E2B's proxy and envd do
// together: 204 for a running sandbox, 502 saying it "was not found" for
// one that is gone (the SDKs read that as killed or timed out), 502 for
// one that is paused; 503 for a LOST one (its node is down, say), which
// may come back.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	id := sandboxOf(r.Context())
	sb, err := s.m.Get(r.Context(), &warrenv1.GetRequest{Id: id})
	switch {
	case err == nil && sb.GetState() == warrenv1.SandboxState_SANDBOX_STATE_LOST:
		s.fail(w, lostErr(sb))
	case server.CategoryOf(err) == errdefs.NotFound || (err == nil && e2bState(sb.GetState()) == ""):
		writeError(w, http.StatusBadGateway, "sandbox "+id+" was not found")
	case err != nil:
		s.fail(w, err)
	case sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_RUNNING:
		writeError(w, http.StatusBadGateway, "sandbox "+id+" is paused; connect resumes it")
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

package server

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

func TestToConnectError(t *testing.T) {
	cases := []struct {
		err  error
		code connect.Code
		cat  string
	}{
		{errdefs.NotFoundf("sandbox x not found"), connect.CodeNotFound, "not_found"},
		{errdefs.Invalidf("bad id"), connect.CodeInvalidArgument, "invalid"},
		{errdefs.Exhaustedf("node full"), connect.CodeResourceExhausted, "exhausted"},
		{errdefs.Conflictf("sandbox x is dead"), connect.CodeFailedPrecondition, "conflict"},
		{errdefs.AlreadyExistsf("sandbox x is taken"), connect.CodeAlreadyExists, "conflict"},
		{fmt.Errorf("create: %w", errdefs.AlreadyExistsf("sandbox x is taken")), connect.CodeAlreadyExists, "conflict"},
		// The text does not decide: only the error's kind does.
		{errdefs.Conflictf("a directory of that name already exists"), connect.CodeFailedPrecondition, "conflict"},
		{errdefs.Unsupportedf("backend vm cannot commit"), connect.CodeUnimplemented, "unsupported"},
		{errdefs.Unavailablef("try later"), connect.CodeUnavailable, "unavailable"},
		{errdefs.New(errdefs.DeadlineExceeded, "slow"), connect.CodeDeadlineExceeded, "deadline_exceeded"},
		{errdefs.New(errdefs.Unauthenticated, "who"), connect.CodeUnauthenticated, "unauthenticated"},
		{errdefs.PermissionDeniedf("/proc is off limits"), connect.CodePermissionDenied, "permission_denied"},
		{errdefs.Internalf("bug"), connect.CodeInternal, "internal"},
		{errors.New("plain"), connect.CodeInternal, "internal"},
		{fmt.Errorf("wrapped: %w", errdefs.NotFoundf("x")), connect.CodeNotFound, "not_found"},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded, "deadline_exceeded"},
		{context.Canceled, connect.CodeCanceled, "unknown"},
		{connect.NewError(connect.CodeNotFound, errors.New("x")), connect.CodeNotFound, "not_found"},
	}
	for _, c := range cases {
		err := ToConnectError(c.err)
		var ce *connect.Error
		if !errors.As(err, &ce) {
			t.Fatalf("%v: not a connect error", c.err)
		}
		if ce.Code() != c.code || ce.Meta().Get(CategoryHeader) != c.cat {
			t.Errorf("%v: got %v/%q, want %v/%q", c.err, ce.Code(), ce.Meta().Get(CategoryHeader), c.code, c.cat)
		}
	}
	if ToConnectError(nil) != nil {
		t.Error("nil error became non-nil")
	}
}

// The client package does not import errdefs, so it spells the category
// names and the category header again: they must stay those of errdefs
// and of this package.
func TestClientCategoriesMatch(t *testing.T) {
	if client.CategoryHeader != CategoryHeader {
		t.Errorf("client.CategoryHeader = %q, server sends %q", client.CategoryHeader, CategoryHeader)
	}
	mirror := map[errdefs.Category]client.Category{
		errdefs.Unknown:          client.CategoryUnknown,
		errdefs.NotFound:         client.CategoryNotFound,
		errdefs.Invalid:          client.CategoryInvalid,
		errdefs.Exhausted:        client.CategoryExhausted,
		errdefs.Conflict:         client.CategoryConflict,
		errdefs.Unavailable:      client.CategoryUnavailable,
		errdefs.DeadlineExceeded: client.CategoryDeadlineExceeded,
		errdefs.Unauthenticated:  client.CategoryUnauthenticated,
		errdefs.PermissionDenied: client.CategoryPermissionDenied,
		errdefs.Internal:         client.CategoryInternal,
		errdefs.Unsupported:      client.CategoryUnsupported,
	}
	for _, c := range errdefs.Categories() {
		if got, ok := mirror[c]; !ok || string(got) != c.String() {
			t.Errorf("errdefs category %q: client has %q", c.String(), got)
		}
	}
}

// testServer runs a Server on a unix socket and, when tcp is set, on a
// random TCP port, until the test ends.
type testServer struct {
	srv  *Server
	sock string
	tcp  string
	m    *fakeManager
	stop func() error
}

func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "wsrv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startServer(t *testing.T, cfg Config) *testServer {
	t.Helper()
	if cfg.SocketPath == "" {
		cfg.SocketPath = filepath.Join(shortTempDir(t), "run", "w.sock")
	}
	cfg.ShutdownTimeout = 2 * time.Second
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ts := &testServer{srv: s, sock: cfg.SocketPath, m: newFake()}
	for _, a := range s.Addrs() {
		if a.Network() == "tcp" {
			ts.tcp = a.String()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ts.m) }()
	var once sync.Once
	var serr error
	ts.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case serr = <-done:
			case <-time.After(10 * time.Second):
				serr = errors.New("Serve did not return")
			}
		})
		return serr
	}
	t.Cleanup(func() {
		if err := ts.stop(); err != nil {
			t.Error(err)
		}
	})
	return ts
}

func newClient(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestErrorsOverTheWire(t *testing.T) {
	ts := startServer(t, Config{ListenAddr: "127.0.0.1:0", InsecureNoAuth: true})
	for name, c := range map[string]*client.Client{
		"unix-grpc":     newClient(t, "unix://"+ts.sock),
		"tcp-grpc":      newClient(t, "http://"+ts.tcp),
		"tcp-connect-1": newClient(t, ts.tcp, client.WithHTTP1()),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			id := strings.ReplaceAll(name, "-", "")
			if _, err := c.Create(ctx, &warrenv1.CreateRequest{Id: id, Image: "busybox"}); err != nil {
				t.Fatal(err)
			}
			_, err := c.Create(ctx, &warrenv1.CreateRequest{Id: id, Image: "busybox"})
			if !client.IsConflict(err) || !client.IsAlreadyExists(err) {
				t.Fatalf("duplicate create: %v", err)
			}
			_, err = c.Create(ctx, &warrenv1.CreateRequest{Id: "y"})
			if !client.IsInvalid(err) {
				t.Fatalf("create without image: %v", err)
			}
			_, err = c.Get(ctx, "nope")
			var ce *client.Error
			if !client.IsNotFound(err) || !errors.As(err, &ce) || ce.Code != connect.CodeNotFound || ce.Message != "sandbox nope not found" {
				t.Fatalf("get missing: %#v", err)
			}
			if got := err.Error(); got != "not_found: sandbox nope not found" {
				t.Fatalf("message %q", got)
			}
			// Categories that share a code are told apart by the header.
			ts.m.mu.Lock()
			ts.m.err = errdefs.Exhaustedf("disk full")
			ts.m.mu.Unlock()
			_, err = c.Get(ctx, id)
			ts.m.mu.Lock()
			ts.m.err = nil
			ts.m.mu.Unlock()
			if !client.IsExhausted(err) {
				t.Fatalf("exhausted: %v", err)
			}
			_, err = c.Exec(ctx, &warrenv1.ExecRequest{Shell: "panic"})
			if !client.IsInternal(err) {
				t.Fatalf("panic: %v", err)
			}
			res, err := c.Exec(ctx, &warrenv1.ExecRequest{Argv: []string{"echo", "hi"}})
			if err != nil || string(res.Stdout) != "echo hi" || res.ExitCode != 2 {
				t.Fatalf("exec: %v %v", res, err)
			}
			var out, errb bytes.Buffer
			res, err = c.ExecStream(ctx, &warrenv1.ExecRequest{Argv: []string{"a", "b"}}, func(ev *warrenv1.ExecEvent) error {
				out.Write(ev.GetStdout())
				errb.Write(ev.GetStderr())
				return nil
			})
			if err != nil || res.ExitCode != 7 || out.String() != "ab" || errb.String() != "ee" {
				t.Fatalf("exec stream: %v %v %q %q", res, err, out.String(), errb.String())
			}
			// Deadline: WaitProcess blocks until the call is cancelled.
			dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err = c.WaitProcess(dctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: "p-1"})
			cancel()
			if !client.IsDeadlineExceeded(err) {
				t.Fatalf("wait deadline: %v", err)
			}
			v, err := c.Version(ctx)
			if err != nil || v.Version != "test" {
				t.Fatalf("version: %v %v", v, err)
			}
		})
	}
}

func TestArchiveEndpoints(t *testing.T) {
	ts := startServer(t, Config{})
	c := newClient(t, "unix://"+ts.sock)
	ctx := context.Background()

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: 5, Typeflag: tar.TypeReg})
	tw.Write([]byte("hello"))
	tw.Close()
	if err := c.Upload(ctx, "sb", "/dir", &buf); err != nil {
		t.Fatal(err)
	}
	rc, err := c.Download(ctx, "sb", "/dir/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(tr)
	rc.Close()
	if string(b) != "hello" {
		t.Fatalf("got %q", b)
	}

	_, err = c.Download(ctx, "sb", "/missing")
	if !client.IsNotFound(err) {
		t.Fatalf("missing download: %v", err)
	}
	// sparse=1 reaches the manager; any other value but 0/false is
	// refused before it.
	rc, err = c.DownloadSparse(ctx, "sb", "/dir/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	resp, err := unixClient(ts.sock, false).Get("http://warren/v1/sandboxes/sb/archive?path=/dir/hello.txt&sparse=yes")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "query parameter sparse") {
		t.Fatalf("sparse=yes: %d %s", resp.StatusCode, body)
	}
	_, err = c.Download(ctx, "sb", "")
	if !client.IsInvalid(err) {
		t.Fatalf("download without path: %v", err)
	}
	// A failure after the first byte breaks the stream: the client sees
	// an error from Download or from reading, never a clean EOF.
	rc, err = c.Download(ctx, "sb", "/fail-mid")
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if err == nil {
		t.Fatal("mid-stream failure read as a clean EOF")
	}
	// Corrupt tar -> invalid.
	if err := c.Upload(ctx, "sb", "/dir", strings.NewReader(strings.Repeat("garbage", 100))); !client.IsInvalid(err) {
		t.Fatalf("bad tar: %v", err)
	}
	for _, name := range []string{"img", "library/debian:12"} {
		img, err := c.ImportImageTar(ctx, name, strings.NewReader("0123456789"))
		if err != nil || img.Name != name || img.SizeBytes != 10 {
			t.Fatalf("image upload %s: %v %v", name, img, err)
		}
	}
}

func TestArchiveBodyLimit(t *testing.T) {
	h := NewHandler(newFake(), HandlerOptions{ArchiveMaxBytes: 1024})
	srv := httptest.NewServer(h)
	defer srv.Close()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: 4096, Typeflag: tar.TypeReg})
	tw.Write(make([]byte, 4096))
	tw.Close()
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/sandboxes/sb/archive?path=/x", &buf)
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var j JSONError
	if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || j.Category != "exhausted" || j.Code != "resource_exhausted" {
		t.Fatalf("status %d, %+v", resp.StatusCode, j)
	}
	// Wrong content type.
	req, _ = http.NewRequest(http.MethodPut, srv.URL+"/v1/sandboxes/sb/archive?path=/x", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusBadRequest {
		t.Fatalf("content type: status %d", resp2.StatusCode)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "warren_up 1\n") })
	srv := httptest.NewServer(NewHandler(newFake(), HandlerOptions{Metrics: metrics}))
	defer srv.Close()
	for path, want := range map[string]string{"/metrics": "warren_up 1\n", "/healthz": "ok\n"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != want {
			t.Errorf("%s: %d %q", path, resp.StatusCode, b)
		}
	}
	srv2 := httptest.NewServer(NewHandler(newFake(), HandlerOptions{}))
	defer srv2.Close()
	resp, err := http.Get(srv2.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("metrics disabled: %d", resp.StatusCode)
	}
}

func TestTCPAuth(t *testing.T) {
	const token = "s3cret-token"
	ts := startServer(t, Config{ListenAddr: "127.0.0.1:0", Token: token})
	ctx := context.Background()

	// The unix socket needs no token.
	if _, err := newClient(t, ts.sock, client.WithToken("")).Version(ctx); err != nil {
		t.Fatalf("unix without token: %v", err)
	}
	for name, opts := range map[string][]client.Option{
		"none":       {client.WithToken("")},
		"wrong":      {client.WithToken("s3cret-tokeN")},
		"prefix":     {client.WithToken("s3cret")},
		"none-http1": {client.WithToken(""), client.WithHTTP1()},
	} {
		c := newClient(t, "http://"+ts.tcp, opts...)
		if _, err := c.Version(ctx); !client.IsUnauthenticated(err) {
			t.Errorf("%s: rpc: %v", name, err)
		}
		if _, err := c.Download(ctx, "sb", "/x"); !client.IsUnauthenticated(err) {
			t.Errorf("%s: download: %v", name, err)
		}
		if _, err := c.ExecStream(ctx, &warrenv1.ExecRequest{Argv: []string{"a"}}, nil); !client.IsUnauthenticated(err) {
			t.Errorf("%s: stream: %v", name, err)
		}
	}
	for name, opts := range map[string][]client.Option{
		"grpc":  {client.WithToken(token)},
		"http1": {client.WithToken(token), client.WithHTTP1()},
	} {
		c := newClient(t, "http://"+ts.tcp, opts...)
		if _, err := c.Version(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := c.Download(ctx, "sb", "/x"); !client.IsNotFound(err) {
			t.Errorf("%s: download: %v", name, err)
		}
	}
	t.Setenv("WARREN_TOKEN", token)
	if _, err := newClient(t, "http://"+ts.tcp).Version(ctx); err != nil {
		t.Errorf("token from env: %v", err)
	}

	// Plain HTTP: health is open, the rest needs the token.
	resp, err := http.Get("http://" + ts.tcp + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("healthz: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", "http://"+ts.tcp+"/metrics", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var j JSONError
	json.NewDecoder(resp.Body).Decode(&j)
	resp.Body.Close()
	if resp.StatusCode != 401 || j.Code != "unauthenticated" || j.Category != "unauthenticated" || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("metrics with wrong token: %d %+v", resp.StatusCode, j)
	}
}

func TestTCPNeedsToken(t *testing.T) {
	_, err := New(Config{ListenAddr: "127.0.0.1:0"})
	if errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("TCP without token: %v", err)
	}
	if _, err := New(Config{ListenAddr: "127.0.0.1:0", InsecureNoAuth: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("no listener accepted")
	}
}

func TestUnixSocket(t *testing.T) {
	dir := filepath.Join(shortTempDir(t), "run")
	path := filepath.Join(dir, "w.sock")
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v", fi.Mode())
	}
	di, _ := os.Stat(dir)
	if di.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v", di.Mode())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("leftover files: %v", ents)
	}
	go func(ln net.Listener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}(ln)
	// A live daemon on the socket: refuse, and leave it alone.
	if _, err := ListenUnix(path); errdefs.CategoryOf(err) != errdefs.Conflict {
		t.Fatalf("second listener: %v", err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatal("socket removed by the refused listener")
	}
	ln.Close()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left after close: %v", err)
	}

	// A stale socket (nobody listening) is replaced.
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	ln, err = ListenUnix(path)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	ln.Close()

	// A regular file is not replaced.
	os.WriteFile(path, []byte("x"), 0o644)
	if _, err := ListenUnix(path); errdefs.CategoryOf(err) != errdefs.Conflict {
		t.Fatalf("regular file: %v", err)
	}
}

func TestSecondServerRefused(t *testing.T) {
	ts := startServer(t, Config{})
	s, err := New(Config{SocketPath: ts.sock})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); errdefs.CategoryOf(err) != errdefs.Conflict {
		t.Fatalf("second server: %v", err)
	}
	if _, err := newClient(t, ts.sock).Version(context.Background()); err != nil {
		t.Fatalf("first server broken: %v", err)
	}
}

func TestGracefulShutdown(t *testing.T) {
	ts := startServer(t, Config{})
	c := newClient(t, ts.sock)
	ctx := context.Background()
	if _, err := c.Version(ctx); err != nil {
		t.Fatal(err)
	}
	// A call that never ends on its own is cancelled after the grace period.
	errc := make(chan error, 1)
	go func() {
		_, err := c.ExecStream(ctx, &warrenv1.ExecRequest{Argv: []string{"x"}, Shell: "block"}, nil)
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := ts.stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %v", d)
	}
	if err := <-errc; err == nil {
		t.Error("blocked stream ended without error")
	}
	if _, err := os.Lstat(ts.sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left after shutdown: %v", err)
	}
	if _, err := c.Version(ctx); !client.IsUnavailable(err) {
		t.Errorf("after shutdown: %v", err)
	}
}

func TestManyConcurrentCalls(t *testing.T) {
	ts := startServer(t, Config{})
	c := newClient(t, ts.sock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 3000
	// Hold many long calls open at once, beyond the per-connection stream
	// limit of a default HTTP/2 server, then run short calls beside them.
	waitCtx, stopWaits := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.WaitProcess(waitCtx, &warrenv1.WaitProcessRequest{SandboxId: "x", ProcessId: "p"})
		}()
	}
	var errs sync.Map
	var wg2 sync.WaitGroup
	for i := 0; i < n; i++ {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			res, err := c.Exec(ctx, &warrenv1.ExecRequest{Argv: []string{"a", "b", "c"}})
			if err != nil || res.ExitCode != 3 {
				errs.Store(i, fmt.Sprint(res, err))
			}
		}()
	}
	wg2.Wait()
	stopWaits()
	wg.Wait()
	errs.Range(func(k, v any) bool {
		t.Errorf("call %v: %v", k, v)
		return false
	})
}

// TestNoCompressionOnUnixSocket checks that the client does not ask for
// gzip on the local socket, where it only burns CPU.
func TestNoCompressionOnUnixSocket(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "w.sock")
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	f := newFake()
	f.files["sb:/big"] = bytes.Repeat([]byte("a"), 100<<10)
	var mu sync.Mutex
	var encodings []string
	h := NewHandler(f, HandlerOptions{Logger: slog.New(slog.DiscardHandler)})
	srv := NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		mu.Lock()
		encodings = append(encodings, r.Proto+" "+w.Header().Get("Grpc-Encoding")+w.Header().Get("Content-Encoding"))
		mu.Unlock()
	}))
	go srv.Serve(ln)
	defer srv.Close()
	c := newClient(t, "unix://"+path)
	res, err := c.ReadFile(context.Background(), &warrenv1.ReadFileRequest{SandboxId: "sb", Path: "/big"})
	if err != nil || len(res.Content) != 100<<10 {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(encodings) != 1 || strings.TrimSpace(encodings[0]) != "HTTP/2.0" {
		t.Fatalf("responses: %q", encodings)
	}
}

func TestImageAndLayerCalls(t *testing.T) {
	ts := startServer(t, Config{ListenAddr: "127.0.0.1:0", InsecureNoAuth: true})
	for name, c := range map[string]*client.Client{
		"unix-grpc":     newClient(t, "unix://"+ts.sock),
		"tcp-connect-1": newClient(t, ts.tcp, client.WithHTTP1()),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			// PullImage streams its events; the last one has the image.
			var phases []string
			img, err := c.PullImage(ctx, &warrenv1.PullImageRequest{Ref: "reg/x:1", Name: "x"}, func(e *warrenv1.PullImageEvent) error {
				phases = append(phases, e.Phase)
				return nil
			})
			if err != nil || img.GetName() != "x" || img.GetSource() != "reg/x:1" || strings.Join(phases, ",") != "resolve,layer,done" {
				t.Fatalf("pull: %v %v %v", img, err, phases)
			}
			phases = nil
			_, err = c.PullImage(ctx, &warrenv1.PullImageRequest{Ref: "fail"}, func(e *warrenv1.PullImageEvent) error {
				phases = append(phases, e.Phase)
				return nil
			})
			if !client.IsNotFound(err) || len(phases) != 1 {
				t.Fatalf("failed pull: %v %v", err, phases)
			}
			stop := errors.New("stop")
			if _, err := c.PullImage(ctx, &warrenv1.PullImageRequest{Ref: "reg/x:1"}, func(*warrenv1.PullImageEvent) error { return stop }); err != stop {
				t.Fatalf("pull stopped by the callback: %v", err)
			}
			// Layers: by path, by upload (names with '/'), list, remove.
			if l, err := c.BuildLayer(ctx, "ws", "/some/dir"); err != nil || l.GetName() != "ws" {
				t.Fatalf("build layer: %v %v", l, err)
			}
			for _, n := range []string{"ws", "team/ws:1"} {
				l, err := c.BuildLayerTar(ctx, n, strings.NewReader("0123456789"))
				if err != nil || l.GetName() != n || l.GetSizeBytes() != 10 {
					t.Fatalf("layer upload %s: %v %v", n, l, err)
				}
			}
			if ls, err := c.ListLayers(ctx); err != nil || len(ls) != 1 {
				t.Fatalf("list layers: %v %v", ls, err)
			}
			if err := c.RemoveLayer(ctx, "busy"); !client.IsConflict(err) {
				t.Fatalf("remove busy layer: %v", err)
			}
			if err := c.RemoveLayer(ctx, "ws"); err != nil {
				t.Fatal(err)
			}
			st, err := c.ImageStats(ctx, "a", "layer:b")
			if err != nil || len(st) != 1 || st[0].GetOwner() != "a,layer:b" || st[0].GetResident() != 4096 {
				t.Fatalf("stats: %v %v", st, err)
			}
			vs, err := c.VerifyImage(ctx)
			if err != nil || len(vs) != 2 || !vs[0].GetOk() || vs[1].GetOk() || vs[1].GetError() != "corrupt" {
				t.Fatalf("verify: %v %v", vs, err)
			}
			// CommitSandbox of an unknown sandbox.
			if _, err := c.CommitSandbox(ctx, "nope", "l"); !client.IsNotFound(err) {
				t.Fatalf("commit of a missing sandbox: %v", err)
			}
		})
	}
}

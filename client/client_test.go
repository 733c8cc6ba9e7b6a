package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
)

func TestParseAddr(t *testing.T) {
	cases := []struct{ addr, network, target, base string }{
		{"unix:///run/warren/warren.sock", "unix", "/run/warren/warren.sock", "http://warren"},
		{"unix:/tmp/w.sock", "unix", "/tmp/w.sock", "http://warren"},
		{"unix://rel/w.sock", "unix", "rel/w.sock", "http://warren"},
		{"/tmp/w.sock", "unix", "/tmp/w.sock", "http://warren"},
		{"http://127.0.0.1:7070", "http", "127.0.0.1:7070", "http://127.0.0.1:7070"},
		{"http://host:7070/", "http", "host:7070", "http://host:7070"},
		{"https://warren.example.com/api", "https", "warren.example.com", "https://warren.example.com/api"},
		{"localhost:7070", "http", "localhost:7070", "http://localhost:7070"},
	}
	for _, c := range cases {
		n, tg, b, err := parseAddr(c.addr)
		if err != nil || n != c.network || tg != c.target || b != c.base {
			t.Errorf("%s: %s %s %s %v", c.addr, n, tg, b, err)
		}
	}
	for _, bad := range []string{"ftp://x", "unix://", "http://", "nohostport"} {
		if _, _, _, err := parseAddr(bad); !IsInvalid(err) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func TestNewDefaults(t *testing.T) {
	t.Setenv(EnvAddr, "")
	c, err := New("")
	if err != nil || c.Addr() != DefaultAddr || !c.IsUnix() {
		t.Fatalf("%v %v", c, err)
	}
	t.Setenv(EnvAddr, "http://127.0.0.1:1")
	c, err = New("")
	if err != nil || c.Addr() != "http://127.0.0.1:1" || c.IsUnix() {
		t.Fatalf("%v %v", c, err)
	}
	// Nothing listens there: the call fails as unavailable.
	_, err = c.Version(context.Background())
	if !IsUnavailable(err) {
		t.Fatalf("%v", err)
	}
}

func TestWrapErr(t *testing.T) {
	ce := connect.NewError(connect.CodeFailedPrecondition, errors.New("sandbox x is dead"))
	ce.Meta().Set(CategoryHeader, "conflict")
	err := wrapErr(ce)
	var e *Error
	if !errors.As(err, &e) || e.Category != CategoryConflict || e.Code != connect.CodeFailedPrecondition || e.Message != "sandbox x is dead" {
		t.Fatalf("%#v", err)
	}
	if !IsConflict(err) || IsAlreadyExists(err) || err.Error() != "conflict: sandbox x is dead" {
		t.Fatal(err)
	}
	// Without the header the code decides.
	if err := wrapErr(connect.NewError(connect.CodeAlreadyExists, errors.New("x"))); !IsConflict(err) || !IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// unsupported: the backend cannot do the call (Unimplemented), with
	// the header and without it (an older daemon, or connect itself for
	// a procedure the daemon does not serve).
	ue := connect.NewError(connect.CodeUnimplemented, errors.New("backend vm cannot commit sandboxes"))
	ue.Meta().Set(CategoryHeader, "unsupported")
	if err := wrapErr(ue); !IsUnsupported(err) || IsUnavailable(err) || IsInternal(err) {
		t.Fatal(err)
	}
	if err := wrapErr(connect.NewError(connect.CodeUnimplemented, errors.New("x"))); !IsUnsupported(err) {
		t.Fatal(err)
	}
	if err := wrapErr(connect.NewError(connect.CodeCanceled, context.Canceled)); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	// A connection reset mid-call (the daemon was killed) is unavailable.
	reset := &net.OpError{Op: "read", Net: "unix", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	cut := connect.NewError(connect.CodeInternal, fmt.Errorf("protocol error: incomplete envelope: %w", io.ErrUnexpectedEOF))
	if err := wrapErr(cut); !IsUnavailable(err) {
		t.Fatalf("cut short: %v (%s)", err, CategoryOf(err))
	}
	for _, err := range []error{reset, connect.NewError(connect.CodeCanceled, reset)} {
		if err := wrapErr(err); !IsUnavailable(err) || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("reset: %v (%s)", err, CategoryOf(err))
		}
	}
	if wrapErr(nil) != nil || CategoryOf(nil) != CategoryUnknown {
		t.Fatal("nil")
	}
}

func TestHTTPError(t *testing.T) {
	mk := func(status int, body string, h http.Header) *http.Response {
		if h == nil {
			h = http.Header{}
		}
		return &http.Response{StatusCode: status, Status: http.StatusText(status), Header: h, Body: io.NopCloser(strings.NewReader(body))}
	}
	err := httpError(mk(404, `{"code":"not_found","message":"no such file: /x","category":"not_found"}`, nil))
	var e *Error
	if !errors.As(err, &e) || e.Category != CategoryNotFound || e.Code != connect.CodeNotFound || e.Message != "no such file: /x" {
		t.Fatalf("%#v", err)
	}
	// A proxy's plain-text error.
	err = httpError(mk(502, "bad gateway\n", nil))
	if !IsUnavailable(err) || !strings.Contains(err.Error(), "bad gateway") {
		t.Fatal(err)
	}
	err = httpError(mk(501, `{"code":"unimplemented","message":"no files","category":"unsupported"}`, nil))
	if !IsUnsupported(err) {
		t.Fatal(err)
	}
	if err := httpError(mk(501, "not implemented", nil)); !IsUnsupported(err) {
		t.Fatal(err)
	}
	err = httpError(mk(409, `{"code":"already_exists","message":"dup"}`, nil))
	if !IsAlreadyExists(err) || !IsConflict(err) {
		t.Fatal(err)
	}
}

// createServer answers Create Unavailable until its fails run out, and
// records each request it got.
type createServer struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	mu    sync.Mutex
	fails int
	got   []*warrenv1.CreateRequest
}

func (s *createServer) Create(_ context.Context, req *connect.Request[warrenv1.CreateRequest]) (*connect.Response[warrenv1.Sandbox], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, req.Msg)
	if len(s.got) <= s.fails {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("restarting"))
	}
	return connect.NewResponse(&warrenv1.Sandbox{Id: "sb", IdempotencyKey: req.Msg.GetIdempotencyKey()}), nil
}

// Create sends an idempotency key, and after Unavailable answers sends the
// same request again with the same key, marked a retry, within the retry
// window; the caller's request is left as it was.
func TestCreateRetriesWithOneKey(t *testing.T) {
	srv := &createServer{fails: 2}
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(srv))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	c, err := New(hs.URL, WithHTTP1())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := &warrenv1.CreateRequest{Image: "img"}
	sb, err := c.Create(context.Background(), req)
	if err != nil || sb.GetId() != "sb" {
		t.Fatalf("create: %v %v", sb, err)
	}
	if req.GetIdempotencyKey() != "" || req.GetRetry() {
		t.Fatalf("Create changed the caller's request: %v", req)
	}
	if len(srv.got) != 3 {
		t.Fatalf("%d attempts, want 3", len(srv.got))
	}
	key := srv.got[0].GetIdempotencyKey()
	for i, r := range srv.got {
		if r.GetIdempotencyKey() != key || key == "" || r.GetRetry() != (i > 0) || r.GetImage() != "img" {
			t.Fatalf("attempt %d: %v (first key %q)", i, r, key)
		}
	}

	// No retry window: the first Unavailable is the answer.
	srv.got, srv.fails = nil, 1
	c2, err := New(hs.URL, WithHTTP1(), WithCreateRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Create(context.Background(), req); !IsUnavailable(err) || len(srv.got) != 1 {
		t.Fatalf("create without retries: %v after %d attempts", err, len(srv.got))
	}
}

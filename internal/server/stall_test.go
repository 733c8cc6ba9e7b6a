package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"

	"github.com/warrenrl/warren/internal/sandboxfs"
)

// stallManager is the fake with an endless archive ("/endless": writes
// until a write fails, then reports how that ended), an upload that
// reports how its body ended, and a slow Version (a long unary call).
type stallManager struct {
	*fakeManager
	outDone chan error
	inDone  chan error
	slow    time.Duration
}

func (m *stallManager) TarOut(ctx context.Context, id, path string, w io.Writer, o sandboxfs.TarOptions) error {
	if path != "/endless" {
		return m.fakeManager.TarOut(ctx, id, path, w, o)
	}
	chunk := bytes.Repeat([]byte{'x'}, 32<<10)
	for {
		if _, err := w.Write(chunk); err != nil {
			m.outDone <- err
			return err
		}
	}
}

func (m *stallManager) TarIn(_ context.Context, _, _ string, r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	m.inDone <- err
	return err
}

func (m *stallManager) Version(ctx context.Context, r *warrenv1.VersionRequest) (*warrenv1.VersionResponse, error) {
	time.Sleep(m.slow)
	return m.fakeManager.Version(ctx, r)
}

func startStallServer(t *testing.T, stall time.Duration) (*stallManager, string) {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "w.sock")
	s, err := New(Config{SocketPath: sock, Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: time.Second, StallTimeout: stall})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	m := &stallManager{fakeManager: newFake(), outDone: make(chan error, 1), inDone: make(chan error, 1), slow: 3 * stall}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx, m); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return m, sock
}

func unixClient(sock string, h2c bool) *http.Client {
	var protos http.Protocols
	if h2c {
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	return &http.Client{Transport: &http.Transport{
		Protocols:       &protos,
		MaxConnsPerHost: 1,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
}

func within(t *testing.T, ch chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s: still going after %v", what, d)
		return nil
	}
}

// A client that stops reading an archive download, or stops sending an
// upload, is cut after the stall timeout over HTTP/1.1 and h2c alike, so
// the walk or extraction behind it ends; a unary call longer than the
// stall timeout on a connection that served a download is not cut.
func TestStalledClientsAreCut(t *testing.T) {
	const stall = 300 * time.Millisecond
	for _, proto := range []string{"http1", "h2c"} {
		t.Run(proto, func(t *testing.T) {
			m, sock := startStallServer(t, stall)
			hc := unixClient(sock, proto == "h2c")
			defer hc.CloseIdleConnections()

			// Download: take the headers and a little, then stop reading.
			res, err := hc.Get("http://warren/v1/sandboxes/sb/archive?path=/endless")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(res.Body, make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = within(t, m.outDone, 20*stall, "archive walk behind a client that stopped reading")
			t.Logf("walk cut after %v: %v", time.Since(start), err)
			res.Body.Close()

			// Upload: send a little, then nothing.
			pr, pw := io.Pipe()
			defer pw.Close()
			go func() { _, _ = pw.Write(make([]byte, 4096)) }()
			req, _ := http.NewRequest(http.MethodPut, "http://warren/v1/sandboxes/sb/archive?path=/x", pr)
			req.Header.Set("Content-Type", "application/x-tar")
			go func() {
				if res, err := hc.Do(req); err == nil {
					res.Body.Close()
				}
			}()
			err = within(t, m.inDone, 20*stall, "extraction behind a client that stopped sending")
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("stalled upload ended with %v, want a deadline", err)
			}
			pw.Close()

			// A complete download, then a unary call three stall timeouts
			// long on the same connection (HTTP/1.1 keeps it alive).
			m.mu.Lock()
			m.files["sb:/small"] = []byte("hello")
			m.mu.Unlock()
			res, err = hc.Get("http://warren/v1/sandboxes/sb/archive?path=/small")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadAll(res.Body); err != nil || res.StatusCode != 200 {
				t.Fatalf("small download: %d %v", res.StatusCode, err)
			}
			res.Body.Close()
			res, err = hc.Post("http://warren/warren.v1.SystemService/Version", "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Fatalf("long unary call after a download: %v", err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || !strings.Contains(string(body), "test") {
				t.Fatalf("long unary call: %d %s", res.StatusCode, body)
			}
		})
	}
}

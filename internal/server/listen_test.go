package server

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

// TestUnixSocketHeldUnserved: a socket whose listener nobody serves (the
// copy a daemon's fork holds until it execs, after the daemon was killed)
// accepts connects until its holder lets go; the next daemon waits for
// that instead of refusing to start. One that accepts and stays silent is
// a server.
func TestUnixSocketHeldUnserved(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "w.sock")
	first, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	first.(*net.UnixListener).SetUnlinkOnClose(false)
	time.AfterFunc(300*time.Millisecond, func() { first.Close() })
	start := time.Now()
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("socket held by a listener that let go after 300 ms: %v", err)
	}
	ln.Close()
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("listened after %v, while the old listener was still open", took)
	}

	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // silent, never closed while the test runs
		}
	}()
	if _, err := ListenUnix(path); errdefs.CategoryOf(err) != errdefs.Conflict {
		t.Fatalf("a silent server: %v", err)
	}
}

// TestListenTCPWaitsForHolder: a TCP address held by a listener that
// lets go within the retry window is listened on once free.
func TestListenTCPWaitsForHolder(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { l.Close() })
	ln, err := ListenTCP(l.Addr().String())
	if err != nil {
		t.Fatalf("address held for 300 ms: %v", err)
	}
	ln.Close()
}

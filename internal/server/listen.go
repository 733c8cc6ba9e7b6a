package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

// ListenUnix listens on a unix socket at path with mode 0600. The parent
// directory is created with mode 0700 when missing. A stale socket left by a
// dead daemon is removed; if another process answers on the socket,
// ListenUnix fails with a Conflict error and leaves the socket alone.
//
// The socket is bound under a temporary name, restricted to 0600 and then
// renamed into place, so it is never reachable with a wider mode. Closing
// the listener removes the socket file if it is still this listener's.
func ListenUnix(path string) (net.Listener, error) {
	if path == "" {
		return nil, errdefs.Invalidf("empty socket path")
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".warren-%d.sock", os.Getpid()))
	_ = os.Remove(tmp)
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ul.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(fmt.Errorf("chmod socket: %w", err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("install socket %s: %w", path, err))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("stat socket: %w", err))
	}
	return &unixListener{UnixListener: ul, path: path, fi: fi}, nil
}

// removeStaleSocket removes path if it is a socket nobody listens on.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat socket: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return errdefs.Conflictf("%s exists and is not a socket; refusing to replace it", path)
	}
	if err := probeSocket(path); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// probeSocket returns nil if nobody serves on the socket at path and a
// Conflict error if a server answers there.
//
// A connect that succeeds does not prove a server: a daemon killed with
// SIGKILL in the middle of starting a sandbox leaves the clone, between
// fork and exec, holding a copy of its listening socket for a few
// milliseconds (measured: a restart on a loaded 2-core node refused in 1
// of ~20 kill -9s). Such a holder never answers and hangs up once it
// execs, so a connection that closes unanswered is probed again.
func probeSocket(path string) error {
	for range probeAttempts {
		conn, err := net.DialTimeout("unix", path, 2*time.Second)
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("probe socket %s: %w", path, err)
		}
		answered := answers(conn)
		conn.Close()
		if answered {
			break
		}
		time.Sleep(probeBackoff)
	}
	return errdefs.Conflictf("another daemon is listening on %s", path)
}

// probeAttempts and probeBackoff bound probeSocket's wait for a holder
// that hangs up to ~2 s, 20 times its measured lifetime under load.
const (
	probeAttempts = 40
	probeBackoff  = 50 * time.Millisecond
)

// answers sends an HTTP/1.1 request on conn and reports whether anything
// other than a hang-up came back within 2 s: any response (even an
// error status) or silence (a server too busy to answer is still a
// server).
func answers(conn net.Conn) bool {
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: warren\r\nConnection: close\r\n\r\n"); err != nil {
		return !hungUp(err)
	}
	var b [1]byte
	n, err := conn.Read(b[:])
	return n > 0 || !hungUp(err)
}

// hungUp reports whether err is the peer closing the connection.
func hungUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// ListenTCP listens on a TCP address. An address in use is tried again
// for up to ~2 s (probeAttempts): after a kill -9 the daemon's fork that
// had not yet exec'd (see probeSocket) still holds the old listener.
func ListenTCP(addr string) (net.Listener, error) {
	var err error
	for range probeAttempts {
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); !errors.Is(err, syscall.EADDRINUSE) {
			return ln, err
		}
		time.Sleep(probeBackoff)
	}
	return nil, err
}

type unixListener struct {
	*net.UnixListener
	path string
	fi   os.FileInfo
	once sync.Once
}

// Addr reports the socket's final path rather than the temporary name it
// was bound under.
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		// Only remove the socket if nobody replaced it meanwhile.
		if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.fi) {
			os.Remove(l.path)
		}
	})
	return err
}

package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Frame types and limits of the wire protocol (see the package doc).
const (
	frameExec    = 'E'
	frameSignal  = 'S'
	framePing    = 'P'
	frameStarted = 'R'
	frameFailed  = 'F'
	frameExited  = 'X'
	framePong    = 'p'

	hdrLen     = 5
	maxPayload = 4 << 20
)

// Info is what the agent reports about itself.
type Info struct {
	Version int // protocol version
	Running int // processes started by the agent that have not exited
}

// Client talks to one sandbox's agent over its unix socket. It holds no
// connection: every call dials, so a Client is safe for concurrent use.
type Client struct {
	path string
}

// NewClient returns a client for the agent listening on socketPath.
func NewClient(socketPath string) *Client { return &Client{path: socketPath} }

// Ping checks that the agent answers and reads its counters.
func (c *Client) Ping(ctx context.Context) (Info, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return Info{}, err
	}
	defer conn.Close()
	stop := interruptOn(ctx, conn)
	defer stop()

	if _, err := conn.Write(frame(framePing, nil)); err != nil {
		return Info{}, ioErr(ctx, err, "ping sandbox agent")
	}
	typ, body, err := readFrame(conn)
	if err != nil {
		return Info{}, ioErr(ctx, err, "ping sandbox agent")
	}
	if typ != framePong || len(body) != 8 {
		return Info{}, errdefs.Internalf("sandbox agent: unexpected reply %q to ping", typ)
	}
	return Info{
		Version: int(binary.LittleEndian.Uint32(body)),
		Running: int(binary.LittleEndian.Uint32(body[4:])),
	}, nil
}

// Start starts a process in the sandbox and returns once it runs (exec
// succeeded) or failed to start. Cancelling ctx during Start kills the
// process; after Start returns, ctx no longer matters: Close the Process.
func (c *Client) Start(ctx context.Context, p backend.ProcSpec) (backend.Process, error) {
	if p.PTY {
		return c.startPTY(ctx, p)
	}
	var flags uint32
	for i, on := range []bool{p.Stdin, p.Stdout, p.Stderr} {
		if on {
			flags |= 1 << i
		}
	}
	payload, err := encodeExec(flags, p)
	if err != nil {
		return nil, err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	proc := &process{conn: conn}
	ok := false
	defer func() {
		if !ok {
			proc.Close()
		}
	}()

	// The child ends go to the agent; we keep the other end, which the Go
	// runtime poller serves. os.Pipe sets both ends non-blocking, and Fd
	// puts the child end back in blocking mode as programs expect.
	var childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()
	pipe := func(ours **os.File, childReads bool) error {
		r, w, err := os.Pipe()
		if err != nil {
			return errdefs.Wrap(errdefs.Exhausted, err, "create stdio pipe")
		}
		if childReads {
			*ours, childEnds = w, append(childEnds, r)
		} else {
			*ours, childEnds = r, append(childEnds, w)
		}
		return nil
	}
	for _, s := range []struct {
		on         bool
		ours       **os.File
		childReads bool
	}{{p.Stdin, &proc.stdin, true}, {p.Stdout, &proc.stdout, false}, {p.Stderr, &proc.stderr, false}} {
		if s.on {
			if err := pipe(s.ours, s.childReads); err != nil {
				return nil, err
			}
		}
	}
	fds := make([]int, len(childEnds))
	for i, f := range childEnds {
		fds[i] = int(f.Fd())
	}

	stop := interruptOn(ctx, conn)
	defer stop()
	msg := frame(frameExec, payload)
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	// A large frame may go out in parts; the fds travel with the first.
	n, _, err := conn.WriteMsgUnix(msg, oob, nil)
	if err == nil && n < len(msg) {
		_, err = conn.Write(msg[n:])
	}
	if err != nil {
		return nil, ioErr(ctx, err, "send exec request to sandbox agent")
	}
	for _, f := range childEnds {
		f.Close()
	}
	childEnds = nil

	typ, body, err := readFrame(conn)
	if err != nil {
		return nil, ioErr(ctx, err, "start process")
	}
	switch {
	case typ == frameStarted && len(body) == 4:
		proc.pid = int(int32(binary.LittleEndian.Uint32(body)))
	case typ == frameFailed:
		return nil, failure(body, p)
	default:
		return nil, errdefs.Internalf("sandbox agent: unexpected reply %q to exec", typ)
	}
	if !stop() {
		// ctx ended while we were reading STARTED: honour it.
		return nil, ctxErr(ctx, "start process")
	}
	ok = true
	return proc, nil
}

// encodeExec builds the EXEC payload, rejecting what the agent could not
// represent.
func encodeExec(flags uint32, p backend.ProcSpec) ([]byte, error) {
	if len(p.Argv) == 0 || p.Argv[0] == "" {
		return nil, errdefs.Invalidf("empty command")
	}
	size := 20 + len(p.Cwd) + 1
	for _, list := range [][]string{p.Argv, p.Env} {
		for _, s := range list {
			if strings.IndexByte(s, 0) >= 0 {
				return nil, errdefs.Invalidf("argument or environment string contains a NUL byte: %q", s)
			}
			size += len(s) + 1
		}
	}
	if strings.IndexByte(p.Cwd, 0) >= 0 {
		return nil, errdefs.Invalidf("working directory contains a NUL byte: %q", p.Cwd)
	}
	if size > maxPayload {
		return nil, errdefs.Invalidf("command line and environment too large (%d bytes, limit %d)", size, maxPayload)
	}
	b := make([]byte, 20, size)
	le := binary.LittleEndian
	le.PutUint32(b[0:], flags)
	le.PutUint32(b[4:], p.UID)
	le.PutUint32(b[8:], p.GID)
	le.PutUint32(b[12:], uint32(len(p.Argv)))
	le.PutUint32(b[16:], uint32(len(p.Env)))
	b = append(append(b, p.Cwd...), 0)
	for _, list := range [][]string{p.Argv, p.Env} {
		for _, s := range list {
			b = append(append(b, s...), 0)
		}
	}
	return b, nil
}

// failure turns a FAILED reply into an error of the right category.
func failure(body []byte, p backend.ProcSpec) error {
	if len(body) < 5 {
		return errdefs.Internalf("sandbox agent: malformed failure reply")
	}
	errno := syscall.Errno(binary.LittleEndian.Uint32(body))
	step, _, _ := strings.Cut(string(body[4:]), "\x00")
	argv0 := p.Argv[0]
	switch step {
	case "exec":
		switch errno {
		case syscall.ENOENT:
			return errdefs.Wrap(errdefs.NotFound, errno, "executable file not found: "+argv0)
		case syscall.EACCES, syscall.ENOEXEC, syscall.EISDIR, syscall.ENOTDIR, syscall.ELOOP, syscall.ENAMETOOLONG:
			return errdefs.Wrap(errdefs.Invalid, errno, "cannot execute "+argv0)
		case syscall.E2BIG:
			return errdefs.Wrap(errdefs.Invalid, errno, "argument list and environment too long")
		case syscall.ENOMEM, syscall.EAGAIN, syscall.EMFILE, syscall.ENFILE:
			return errdefs.Wrap(errdefs.Exhausted, errno, "execute "+argv0)
		}
	case "chdir":
		switch errno {
		case syscall.ENOENT, syscall.ENOTDIR:
			return errdefs.Wrap(errdefs.Invalid, errno, fmt.Sprintf("working directory %q does not exist", p.Cwd))
		case syscall.EACCES, syscall.ELOOP, syscall.ENAMETOOLONG:
			return errdefs.Wrap(errdefs.Invalid, errno, fmt.Sprintf("working directory %q is not accessible", p.Cwd))
		}
	case "setuid", "setgid", "setgroups":
		if errno == syscall.EINVAL || errno == syscall.EPERM {
			return errdefs.Wrap(errdefs.Invalid, errno, fmt.Sprintf("cannot run as uid %d gid %d", p.UID, p.GID))
		}
	case "fork", "pipe", "memory", "epoll":
		if errno == syscall.EAGAIN || errno == syscall.ENOMEM || errno == syscall.EMFILE || errno == syscall.ENFILE {
			return errdefs.Wrap(errdefs.Exhausted, errno, "sandbox cannot start more processes")
		}
	case "proto":
		return errdefs.Wrap(errdefs.Internal, errno, "sandbox agent rejected the request")
	}
	return errdefs.Wrap(errdefs.Internal, errno, fmt.Sprintf("start %s: %s", argv0, step))
}

// dial connects to the agent. A full listen backlog (EAGAIN on a unix
// socket) is retried until ctx ends; every other failure means the agent
// is not there.
func (c *Client) dial(ctx context.Context) (*net.UnixConn, error) {
	var d net.Dialer
	backoff := time.Millisecond
	for {
		conn, err := d.DialContext(ctx, "unix", c.path)
		if err == nil {
			return conn.(*net.UnixConn), nil
		}
		if ctx.Err() != nil {
			return nil, ctxErr(ctx, "connect to sandbox agent")
		}
		if !errors.Is(err, syscall.EAGAIN) {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox agent not reachable")
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctxErr(ctx, "connect to sandbox agent")
		case <-t.C:
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// interruptOn makes blocked I/O on conn fail as soon as ctx ends. The
// returned stop reports false if ctx already ended.
func interruptOn(ctx context.Context, conn net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
}

func ctxErr(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errdefs.Wrap(errdefs.DeadlineExceeded, ctx.Err(), what)
	}
	return fmt.Errorf("%s: %w", what, ctx.Err())
}

// ioErr classifies a failed exchange with the agent: our context ended, or
// the agent went away (the sandbox died or is dying).
func ioErr(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return ctxErr(ctx, what)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = errors.New("sandbox agent closed the connection")
	}
	return errdefs.Wrap(errdefs.Unavailable, err, what)
}

func frame(typ byte, payload []byte) []byte {
	b := make([]byte, hdrLen, hdrLen+len(payload))
	binary.LittleEndian.PutUint32(b, uint32(len(payload)))
	b[4] = typ
	return append(b, payload...)
}

func readFrame(r io.Reader) (byte, []byte, error) {
	return readFrameMax(r, 4096) // replies are tiny
}

// readFrameMax reads a frame of at most max payload bytes.
func readFrameMax(r io.Reader, max uint32) (byte, []byte, error) {
	var hdr [hdrLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n > max {
		return 0, nil, errdefs.Internalf("sandbox agent: reply of %d bytes", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[4], body, nil
}

// process is a backend.Process served by the agent over one connection.
type process struct {
	conn                  *net.UnixConn
	pid                   int
	stdin, stdout, stderr *os.File
	ptyIn                 io.WriteCloser // with a pty: writes to stdout's master

	waitOnce sync.Once
	status   backend.ExitStatus
	waitErr  error
	exited   atomic.Bool

	closeOnce sync.Once
	closed    atomic.Bool
}

func (p *process) Pid() int { return p.pid }

// The stream accessors return untyped nil for streams not requested.

func (p *process) Stdin() io.WriteCloser {
	if p.ptyIn != nil {
		return p.ptyIn
	}
	if p.stdin == nil {
		return nil
	}
	return p.stdin
}

func (p *process) Stdout() io.ReadCloser {
	if p.stdout == nil {
		return nil
	}
	return p.stdout
}

func (p *process) Stderr() io.ReadCloser {
	if p.stderr == nil {
		return nil
	}
	return p.stderr
}

var errDone = errdefs.Wrap(errdefs.Conflict, os.ErrProcessDone, "signal")

// Signal sends sig to the process or its process group. Signalling a
// process that has exited returns an error that matches os.ErrProcessDone.
func (p *process) Signal(sig syscall.Signal, group bool) error {
	if p.closed.Load() {
		return errdefs.Wrap(errdefs.Conflict, net.ErrClosed, "signal: process handle closed")
	}
	if p.exited.Load() {
		return errDone
	}
	var b [5]byte
	binary.LittleEndian.PutUint32(b[:], uint32(int32(sig)))
	if group {
		b[4] = 1
	}
	// One small Write is atomic with respect to other writers on the conn.
	if _, err := p.conn.Write(frame(frameSignal, b[:])); err != nil {
		if p.closed.Load() {
			return errdefs.Wrap(errdefs.Conflict, net.ErrClosed, "signal: process handle closed")
		}
		// The agent closes the connection only after EXITED, after
		// killing the process, or by dying with the whole sandbox: in
		// every case the process is gone.
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
			return errDone
		}
		return errdefs.Wrap(errdefs.Unavailable, err, "signal")
	}
	return nil
}

// Wait blocks until the process exits. Every call returns the same result.
func (p *process) Wait() (backend.ExitStatus, error) {
	p.waitOnce.Do(func() {
		p.status, p.waitErr = p.readExit()
		if p.waitErr == nil {
			p.exited.Store(true)
		}
	})
	return p.status, p.waitErr
}

func (p *process) readExit() (backend.ExitStatus, error) {
	typ, body, err := readFrame(p.conn)
	switch {
	case err != nil && p.closed.Load():
		return backend.ExitStatus{}, errdefs.Wrap(errdefs.Conflict, net.ErrClosed, "wait: process handle closed")
	case err != nil:
		return backend.ExitStatus{}, ioErr(context.Background(), err, "wait: lost the sandbox agent before the process exited")
	case typ == frameExited && len(body) == 8:
		return backend.ExitStatus{
			Code:   int(int32(binary.LittleEndian.Uint32(body))),
			Signal: syscall.Signal(int32(binary.LittleEndian.Uint32(body[4:]))),
		}, nil
	case typ == frameFailed && len(body) >= 5:
		return backend.ExitStatus{}, errdefs.Wrap(errdefs.Internal,
			syscall.Errno(binary.LittleEndian.Uint32(body)), "wait: sandbox agent dropped the process")
	}
	return backend.ExitStatus{}, errdefs.Internalf("sandbox agent: unexpected frame %q while waiting", typ)
}

// Close releases the connection and the pipe ends. A process that is still
// running is killed together with its process group.
func (p *process) Close() error {
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		p.conn.Close()
		for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
			if f != nil {
				f.Close()
			}
		}
	})
	return nil
}

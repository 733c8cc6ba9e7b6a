package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Frames of background processes (protocol version 2, see the package doc).
const (
	flagDetach = 8
	flagPTY    = 16

	frameList    = 'L'
	frameAttach  = 'A'
	frameStdin   = 'I'
	frameCloseIn = 'C'
	frameKill    = 'K'
	frameResize  = 'W'
	frameForget  = 'D' // protocol version 3
	frameOutput  = 'O'
	frameRecord  = 'l'
	frameEnd     = 'e'
	frameOK      = 'k'

	// MaxOutputCap is the largest per-stream buffer the agent accepts.
	MaxOutputCap = 64 << 20
	maxChunk     = 32 << 10
	fromEnd      = ^uint64(0)
	// maxRecords is the agent's MAX_BPROCS (records held at once; 1,024
	// over the sandbox's life before protocol version 3).
	maxRecords = 2048
)

var (
	_ backend.Background = (*Client)(nil)
	_ backend.Forgetter  = (*Client)(nil)
)

// StartBackground starts a process the agent owns (backend.Background).
func (c *Client) StartBackground(ctx context.Context, p backend.ProcSpec, o backend.BackgroundOpts) (int, error) {
	if o.OutputCap <= 0 || o.OutputCap > MaxOutputCap {
		return 0, errdefs.Invalidf("output cap %d outside 1..%d bytes", o.OutputCap, MaxOutputCap)
	}
	if len(o.Tag) > backend.MaxTag {
		return 0, errdefs.Invalidf("process tag of %d bytes, limit %d", len(o.Tag), backend.MaxTag)
	}
	flags := uint32(flagDetach)
	if o.PTY {
		flags |= flagPTY
	}
	p.Stdin, p.Stdout, p.Stderr = false, false, false
	base, err := encodeExec(flags, p)
	if err != nil {
		return 0, err
	}
	payload, err := withExt(base, o.OutputCap, o.Rows, o.Cols, o.Tag)
	if err != nil {
		return 0, err
	}
	le := binary.LittleEndian

	conn, err := c.dial(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close() // after STARTED, closing no longer kills the process
	stop := interruptOn(ctx, conn)
	defer stop()
	if _, err := conn.Write(frame(frameExec, payload)); err != nil {
		return 0, ioErr(ctx, err, "send exec request to sandbox agent")
	}
	typ, body, err := readFrame(conn)
	if err != nil {
		return 0, ioErr(ctx, err, "start process")
	}
	switch {
	case typ == frameStarted && len(body) == 4:
		return int(int32(le.Uint32(body))), nil
	case typ == frameFailed:
		if len(body) > 4 && string(body[4:]) == "limit\x00" {
			return 0, errdefs.Exhaustedf("sandbox agent holds %d background process records, the maximum", maxRecords)
		}
		if len(body) > 4 && string(body[4:]) == "pty\x00" {
			return 0, errdefs.Wrap(errdefs.Unavailable, syscall.Errno(le.Uint32(body)), "allocate a pty in the sandbox")
		}
		return 0, failure(body, p)
	}
	return 0, errdefs.Internalf("sandbox agent: unexpected reply %q to exec", typ)
}

// ListBackground lists the agent's background processes.
func (c *Client) ListBackground(ctx context.Context) ([]backend.BackgroundInfo, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := interruptOn(ctx, conn)
	defer stop()
	if _, err := conn.Write(frame(frameList, nil)); err != nil {
		return nil, ioErr(ctx, err, "list background processes")
	}
	var out []backend.BackgroundInfo
	le := binary.LittleEndian
	for {
		typ, b, err := readFrame(conn)
		if err != nil {
			return nil, ioErr(ctx, err, "list background processes")
		}
		if typ == frameEnd {
			return out, nil
		}
		if typ != frameRecord || len(b) < 61 {
			return nil, errdefs.Internalf("sandbox agent: unexpected frame %q in a list", typ)
		}
		flags := b[8]
		info := backend.BackgroundInfo{
			Pid:       int(int32(le.Uint32(b))),
			Exited:    flags&1 != 0,
			PTY:       flags&2 != 0,
			StdinOpen: flags&4 != 0,
			Stdout:    backend.StreamRange{Start: int64(le.Uint64(b[17:])), Total: int64(le.Uint64(b[25:]))},
			Stderr:    backend.StreamRange{Start: int64(le.Uint64(b[33:])), Total: int64(le.Uint64(b[41:]))},
			OutputCap: int64(le.Uint32(b[49:])),
			Runtime:   time.Duration(le.Uint64(b[53:])) * time.Millisecond,
			Tag:       append([]byte(nil), b[61:]...),
		}
		if info.Exited {
			info.Status = backend.ExitStatus{Code: int(int32(le.Uint32(b[9:]))), Signal: syscall.Signal(int32(le.Uint32(b[13:])))}
		}
		out = append(out, info)
	}
}

// pidRequest sends one request about a background process and reads its
// reply: OK, or FAILED with the errno.
func (c *Client) pidRequest(ctx context.Context, typ byte, pid int, extra []byte, what string) error {
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := interruptOn(ctx, conn)
	defer stop()
	b := binary.LittleEndian.AppendUint32(nil, uint32(int32(pid)))
	if _, err := conn.Write(frame(typ, append(b, extra...))); err != nil {
		return ioErr(ctx, err, what)
	}
	rt, body, err := readFrame(conn)
	switch {
	case err != nil:
		return ioErr(ctx, err, what)
	case rt == frameOK:
		return nil
	case rt == frameFailed && len(body) >= 5:
		return pidFailure(body, pid, what)
	}
	return errdefs.Internalf("sandbox agent: unexpected reply %q to %s", rt, what)
}

func pidFailure(body []byte, pid int, what string) error {
	errno := syscall.Errno(binary.LittleEndian.Uint32(body))
	step := string(body[4 : len(body)-1])
	switch {
	case step == "exited":
		return errdefs.Wrap(errdefs.Conflict, os.ErrProcessDone, what)
	case errno == syscall.ESRCH:
		return errdefs.NotFoundf("%s: no background process %d in the sandbox", what, pid)
	case errno == syscall.ENOTTY:
		return errdefs.Invalidf("%s: process %d has no terminal (start it with a pty)", what, pid)
	case errno == syscall.EPIPE:
		return errdefs.Conflictf("%s: stdin of process %d is closed", what, pid)
	case step == "proto":
		return errdefs.Wrap(errdefs.Internal, errno, "sandbox agent rejected the request")
	}
	return errdefs.Wrap(errdefs.Internal, errno, what)
}

// SignalBackground signals a background process by pid.
func (c *Client) SignalBackground(ctx context.Context, pid int, sig syscall.Signal, group bool) error {
	b := binary.LittleEndian.AppendUint32(nil, uint32(int32(sig)))
	var g byte
	if group {
		g = 1
	}
	return c.pidRequest(ctx, frameKill, pid, append(b, g), "signal")
}

// ResizeBackground sets a PTY process's window size.
func (c *Client) ResizeBackground(ctx context.Context, pid int, rows, cols uint16) error {
	return c.pidRequest(ctx, frameResize, pid, binary.LittleEndian.AppendUint32(nil, uint32(rows)|uint32(cols)<<16), "resize terminal")
}

// ForgetBackground drops the record and kept output of an exited
// background process (backend.Forgetter). An agent older than protocol
// version 3 does not know the request (it fails it as "proto", EINVAL):
// Unsupported, and it keeps every record until the sandbox goes.
func (c *Client) ForgetBackground(ctx context.Context, pid int) error {
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := interruptOn(ctx, conn)
	defer stop()
	if _, err := conn.Write(frame(frameForget, binary.LittleEndian.AppendUint32(nil, uint32(int32(pid))))); err != nil {
		return ioErr(ctx, err, "forget process")
	}
	rt, body, err := readFrame(conn)
	switch {
	case err != nil:
		return ioErr(ctx, err, "forget process")
	case rt == frameOK:
		return nil
	case rt == frameFailed && len(body) >= 5 && string(body[4:]) == "proto\x00":
		return errdefs.Unsupportedf("sandbox agent predates forgetting processes (protocol version 3)")
	case rt == frameFailed && len(body) >= 5 && syscall.Errno(binary.LittleEndian.Uint32(body)) == syscall.EBUSY:
		return errdefs.Conflictf("forget process: process %d is still running", pid)
	case rt == frameFailed && len(body) >= 5:
		return pidFailure(body, pid, "forget process")
	}
	return errdefs.Internalf("sandbox agent: unexpected reply %q to forget", rt)
}

// CloseStdin ends a background process's input (EOF for a pipe, the
// terminal's EOF character for a pty).
func (c *Client) CloseStdin(ctx context.Context, pid int) error {
	return c.pidRequest(ctx, frameCloseIn, pid, nil, "close stdin")
}

// OpenStdin receives the agent's stdin end of a background process: the
// writes then go straight to the pipe (or pty), with deadlines, and never
// through the agent's memory.
func (c *Client) OpenStdin(ctx context.Context, pid int) (backend.StdinWriter, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := interruptOn(ctx, conn)
	defer stop()
	if _, err := conn.Write(frame(frameStdin, binary.LittleEndian.AppendUint32(nil, uint32(int32(pid))))); err != nil {
		return nil, ioErr(ctx, err, "open stdin")
	}
	buf := make([]byte, 64)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, ioErr(ctx, err, "open stdin")
	}
	var fds []int
	if msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if got, err := syscall.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}
	if n >= hdrLen && buf[4] == frameFailed && n >= hdrLen+5 {
		closeAll()
		return nil, pidFailure(buf[hdrLen:n], pid, "open stdin")
	}
	if n != hdrLen+4 || buf[4] != frameStarted || len(fds) != 1 {
		closeAll()
		return nil, errdefs.Internalf("sandbox agent: unexpected reply to a stdin request")
	}
	syscall.CloseOnExec(fds[0])
	// The agent's end is non-blocking, so the runtime poller serves it
	// and write deadlines work.
	return os.NewFile(uintptr(fds[0]), "stdin"), nil
}

// AttachBackground follows a background process's output.
func (c *Client) AttachBackground(ctx context.Context, pid int, stdoutOff, stderrOff int64) (backend.Attachment, error) {
	off := func(o int64) uint64 {
		if o < 0 {
			return fromEnd
		}
		return uint64(o)
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	b := le.AppendUint32(nil, uint32(int32(pid)))
	b = le.AppendUint64(le.AppendUint64(b, off(stdoutOff)), off(stderrOff))
	stop := interruptOn(ctx, conn)
	if _, err := conn.Write(frame(frameAttach, b)); err != nil {
		stop()
		conn.Close()
		return nil, ioErr(ctx, err, "attach")
	}
	return &attachment{ctx: ctx, conn: conn, stop: stop, pid: pid}, nil
}

type attachment struct {
	ctx  context.Context
	conn *net.UnixConn
	stop func() bool
	pid  int
	done bool
}

func (a *attachment) Next() (backend.Output, error) {
	if a.done {
		return backend.Output{}, io.EOF
	}
	typ, b, err := readFrameMax(a.conn, maxChunk+16)
	le := binary.LittleEndian
	switch {
	case err != nil:
		return backend.Output{}, ioErr(a.ctx, err, "follow process output")
	case typ == frameOutput && len(b) >= 9 && (b[0] == 1 || b[0] == 2):
		return backend.Output{Stderr: b[0] == 2, Offset: int64(le.Uint64(b[1:])), Data: b[9:]}, nil
	case typ == frameExited && len(b) == 8:
		a.done = true
		return backend.Output{Exit: &backend.ExitStatus{
			Code:   int(int32(le.Uint32(b))),
			Signal: syscall.Signal(int32(le.Uint32(b[4:]))),
		}}, nil
	case typ == frameFailed && len(b) >= 5:
		a.done = true
		return backend.Output{}, pidFailure(b, a.pid, "attach")
	}
	return backend.Output{}, errdefs.Internalf("sandbox agent: unexpected frame %q while attached", typ)
}

func (a *attachment) Close() error {
	a.stop()
	return a.conn.Close()
}

// IsDone reports an error of a signal to a process that has exited.
func IsDone(err error) bool { return errors.Is(err, os.ErrProcessDone) }

// withExt puts the header of DETACH or PTY (cap, rows, cols, tag) between
// an EXEC payload's fixed fields and its strings.
func withExt(base []byte, cap int64, rows, cols uint16, tag []byte) ([]byte, error) {
	ext := make([]byte, 16, 16+len(tag))
	le := binary.LittleEndian
	le.PutUint32(ext[0:], uint32(cap))
	le.PutUint32(ext[4:], uint32(rows))
	le.PutUint32(ext[8:], uint32(cols))
	le.PutUint32(ext[12:], uint32(len(tag)))
	ext = append(ext, tag...)
	payload := append(append(append(make([]byte, 0, len(base)+len(ext)), base[:20]...), ext...), base[20:]...)
	if len(payload) > maxPayload {
		return nil, errdefs.Invalidf("command line and environment too large (%d bytes, limit %d)", len(payload), maxPayload)
	}
	return payload, nil
}

// startPTY starts a connection's process on a pty the agent makes in the
// sandbox; STARTED brings the master, which the client reads and writes.
func (c *Client) startPTY(ctx context.Context, p backend.ProcSpec) (backend.Process, error) {
	p.Stdin, p.Stdout, p.Stderr = false, false, false
	base, err := encodeExec(flagPTY, p)
	if err != nil {
		return nil, err
	}
	payload, err := withExt(base, 0, p.Rows, p.Cols, nil)
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
	stop := interruptOn(ctx, conn)
	defer stop()
	if _, err := conn.Write(frame(frameExec, payload)); err != nil {
		return nil, ioErr(ctx, err, "send exec request to sandbox agent")
	}
	typ, body, fd, err := readFrameFD(conn)
	if err != nil {
		return nil, ioErr(ctx, err, "start process")
	}
	switch {
	case typ == frameStarted && len(body) == 4 && fd >= 0:
		proc.pid = int(int32(binary.LittleEndian.Uint32(body)))
	case typ == frameFailed && len(body) > 4 && string(body[4:]) == "pty\x00":
		return nil, errdefs.Wrap(errdefs.Unavailable, syscall.Errno(binary.LittleEndian.Uint32(body)), "allocate a pty in the sandbox")
	case typ == frameFailed:
		return nil, failure(body, p)
	default:
		if fd >= 0 {
			syscall.Close(fd)
		}
		return nil, errdefs.Internalf("sandbox agent: unexpected reply %q to exec", typ)
	}
	syscall.CloseOnExec(fd)
	// Non-blocking, so the runtime poller serves it.
	proc.stdout = os.NewFile(uintptr(fd), "pty")
	proc.ptyIn = ptyInput{proc.stdout}
	if !stop() {
		return nil, ctxErr(ctx, "start process")
	}
	ok = true
	return proc, nil
}

// Resize sets the window size of a PTY process's terminal: TIOCSWINSZ on
// the master the daemon holds, which makes the kernel send SIGWINCH to the
// terminal's foreground process group, as the agent's own resize does.
func (p *process) Resize(rows, cols uint16) error {
	if p.ptyIn == nil {
		return errdefs.Invalidf("resize terminal: process %d has no terminal (start it with a pty)", p.pid)
	}
	if p.closed.Load() || p.exited.Load() {
		return errdefs.Wrap(errdefs.Conflict, os.ErrProcessDone, "resize terminal")
	}
	rc, err := p.stdout.SyscallConn()
	if err != nil {
		return errdefs.Wrap(errdefs.Conflict, err, "resize terminal")
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return errdefs.Wrap(errdefs.Conflict, err, "resize terminal") // master closed
	}
	if ierr != nil {
		return errdefs.Wrap(errdefs.Internal, ierr, "resize terminal")
	}
	return nil
}

// ptyInput writes to a pty; Close ends the input with the terminal's EOF
// character and leaves the master open for output.
type ptyInput struct{ f *os.File }

func (w ptyInput) Write(b []byte) (int, error) { return w.f.Write(b) }
func (w ptyInput) Close() error {
	_, err := w.f.Write([]byte{4})
	return err
}

// readFrameFD reads a small frame and the one fd that may ride on it
// (-1 if none).
func readFrameFD(conn *net.UnixConn) (byte, []byte, int, error) {
	buf := make([]byte, 4096+hdrLen)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf[:hdrLen+4], oob)
	fd := -1
	if oobn > 0 {
		if msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if got, err := syscall.ParseUnixRights(&m); err == nil {
					for _, f := range got {
						if fd < 0 {
							fd = f
						} else {
							syscall.Close(f)
						}
					}
				}
			}
		}
	}
	fail := func(err error) (byte, []byte, int, error) {
		if fd >= 0 {
			syscall.Close(fd)
		}
		return 0, nil, -1, err
	}
	if err != nil {
		return fail(err)
	}
	if n < hdrLen {
		if _, err := io.ReadFull(conn, buf[n:hdrLen]); err != nil {
			return fail(err)
		}
		n = hdrLen
	}
	size := int(binary.LittleEndian.Uint32(buf))
	if size > 4096 {
		return fail(errdefs.Internalf("sandbox agent: reply of %d bytes", size))
	}
	if n < hdrLen+size {
		if _, err := io.ReadFull(conn, buf[n:hdrLen+size]); err != nil {
			return fail(err)
		}
	}
	return buf[4], buf[hdrLen : hdrLen+size], fd, nil
}

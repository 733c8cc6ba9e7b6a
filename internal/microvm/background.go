package microvm

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
)

// Background processes are the guest agent's (internal/guest's "bg_*"
// calls): it keeps their records and output in the guest, so a stream
// to it is needed only while the daemon follows or feeds one.
var (
	_ backend.Background = (*sandbox)(nil)
	_ backend.Forgetter  = (*sandbox)(nil)
)

func (s *sandbox) StartBackground(ctx context.Context, p backend.ProcSpec, o backend.BackgroundOpts) (int, error) {
	if o.OutputCap <= 0 || o.OutputCap > guest.MaxOutputCap {
		return 0, errdefs.Invalidf("output cap %d outside 1..%d bytes", o.OutputCap, guest.MaxOutputCap)
	}
	if len(o.Tag) > backend.MaxTag {
		return 0, errdefs.Invalidf("process tag of %d bytes, limit %d", len(o.Tag), backend.MaxTag)
	}
	if p.Cwd == "" {
		p.Cwd = s.cwd
	}
	req := guest.Request{Op: "bg_start", Argv: p.Argv, Env: p.Env, Dir: p.Cwd, UID: p.UID, GID: p.GID,
		PTY: o.PTY, Rows: o.Rows, Cols: o.Cols, Rlimits: s.rlimits, BG: &guest.BGOpts{Cap: o.OutputCap, Tag: o.Tag}}
	st, stop, err := s.vm.open(ctx, req)
	if err != nil {
		return 0, err
	}
	defer st.Close() // once started, the process is the guest's
	defer stop()
	kind, data, err := guest.ReadFrame(bufio.NewReader(st))
	switch {
	case err != nil:
		return 0, s.vm.streamErr(ctx, err, "start a background process in the VM")
	case kind == guest.KindFail:
		return 0, failure(data, "start "+p.Argv[0]+" in the VM")
	case kind != guest.KindStarted:
		return 0, errdefs.Internalf("guest agent: unexpected frame %q at start", kind)
	}
	var started guest.Started
	if err := json.Unmarshal(data, &started); err != nil {
		return 0, errdefs.Internalf("guest agent: bad start frame: %v", err)
	}
	return started.Pid, nil
}

func (s *sandbox) ListBackground(ctx context.Context) ([]backend.BackgroundInfo, error) {
	var infos []guest.BGInfo
	if err := s.vm.call(ctx, guest.Request{Op: "bg_list"}, nil, &infos); err != nil {
		return nil, err
	}
	out := make([]backend.BackgroundInfo, 0, len(infos))
	for _, i := range infos {
		bi := backend.BackgroundInfo{Pid: i.Pid, Exited: i.Exited, PTY: i.PTY, StdinOpen: i.StdinOpen,
			Stdout:    backend.StreamRange{Start: i.Stdout[0], Total: i.Stdout[1]},
			Stderr:    backend.StreamRange{Start: i.Stderr[0], Total: i.Stderr[1]},
			OutputCap: i.Cap, Runtime: time.Duration(i.RuntimeMs) * time.Millisecond, Tag: i.Tag}
		if i.Exited {
			bi.Status = exitStatus(i.Exit)
		}
		out = append(out, bi)
	}
	return out, nil
}

func exitStatus(e guest.Exit) backend.ExitStatus {
	return backend.ExitStatus{Code: e.Code, Signal: syscall.Signal(e.Signal)}
}

// pidCall is a request about one process answered by an empty 'x'.
func (s *sandbox) pidCall(ctx context.Context, req guest.Request) error {
	var none struct{}
	return s.vm.call(ctx, req, nil, &none)
}

func (s *sandbox) CloseStdin(ctx context.Context, pid int) error {
	return s.pidCall(ctx, guest.Request{Op: "bg_closein", Pid: pid})
}

func (s *sandbox) SignalBackground(ctx context.Context, pid int, sig syscall.Signal, group bool) error {
	return s.pidCall(ctx, guest.Request{Op: "bg_signal", Pid: pid, Signal: &guest.Signal{Signal: int(sig), Group: group}})
}

func (s *sandbox) ResizeBackground(ctx context.Context, pid int, rows, cols uint16) error {
	return s.pidCall(ctx, guest.Request{Op: "bg_resize", Pid: pid, Size: &guest.Winsize{Rows: rows, Cols: cols}})
}

func (s *sandbox) ForgetBackground(ctx context.Context, pid int) error {
	return s.pidCall(ctx, guest.Request{Op: "bg_forget", Pid: pid})
}

// OpenStdin opens a stream on which writes go to the process's stdin.
// Closing it closes the stream only.
func (s *sandbox) OpenStdin(ctx context.Context, pid int) (backend.StdinWriter, error) {
	st, stop, err := s.vm.open(ctx, guest.Request{Op: "bg_stdin", Pid: pid})
	if err != nil {
		return nil, err
	}
	defer stop()
	kind, data, err := guest.ReadFrame(bufio.NewReader(st))
	switch {
	case err != nil:
		st.Close()
		return nil, s.vm.streamErr(ctx, err, "open stdin")
	case kind == guest.KindFail:
		st.Close()
		return nil, failure(data, "open stdin")
	case kind != guest.KindStarted:
		st.Close()
		return nil, errdefs.Internalf("guest agent: unexpected frame %q to a stdin request", kind)
	}
	if !stop() {
		st.Close()
		return nil, ctx.Err()
	}
	return &bgStdin{st: st}, nil
}

// bgStdin writes 'i' frames; the agent stops reading them while the
// process does not read its stdin, so a write deadline bounds the wait.
type bgStdin struct{ st *yamux.Stream }

func (w *bgStdin) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		c := min(len(b), 32<<10)
		if err := guest.WriteFrame(w.st, guest.KindStdin, b[:c]); err != nil {
			return n, errdefs.Wrap(errdefs.Unavailable, err, "write to a process's stdin in the VM")
		}
		n += c
		b = b[c:]
	}
	return n, nil
}

// Close ends the stream and waits (bounded by stdinDrain) until the agent
// has written what was sent to the process's stdin and closed its end:
// the daemon's CloseStdin, on a stream of its own, must not overtake the
// data (a container's stdin handle is the pipe itself, so it cannot).
func (w *bgStdin) Close() error {
	err := w.st.Close()
	_ = w.st.SetReadDeadline(time.Now().Add(stdinDrain))
	_, _ = io.Copy(io.Discard, w.st)
	return err
}

// stdinDrain bounds how long closing a stdin handle waits for its data
// to reach a process that does not read it.
const stdinDrain = 5 * time.Second

func (w *bgStdin) SetWriteDeadline(t time.Time) error { return w.st.SetWriteDeadline(t) }

// AttachBackground follows a process's output through one stream.
func (s *sandbox) AttachBackground(ctx context.Context, pid int, stdoutOff, stderrOff int64) (backend.Attachment, error) {
	off := func(o int64) int64 {
		if o < 0 {
			return -1
		}
		return o
	}
	st, stop, err := s.vm.open(ctx, guest.Request{Op: "bg_attach", Pid: pid, Off: [2]int64{off(stdoutOff), off(stderrOff)}})
	if err != nil {
		return nil, err
	}
	return &attachment{ctx: ctx, v: s.vm, st: st, br: bufio.NewReader(st), stop: stop}, nil
}

type attachment struct {
	ctx  context.Context
	v    *VM
	st   *yamux.Stream
	br   *bufio.Reader
	stop func() bool
	done bool
}

func (a *attachment) Next() (backend.Output, error) {
	if a.done {
		return backend.Output{}, io.EOF
	}
	kind, data, err := guest.ReadFrame(a.br)
	switch {
	case err != nil:
		return backend.Output{}, a.v.streamErr(a.ctx, err, "follow process output")
	case (kind == guest.KindStdout || kind == guest.KindStderr) && len(data) >= 8:
		return backend.Output{Stderr: kind == guest.KindStderr, Offset: int64(binary.LittleEndian.Uint64(data)), Data: data[8:]}, nil
	case kind == guest.KindExit:
		a.done = true
		var ex guest.Exit
		if err := json.Unmarshal(data, &ex); err != nil {
			return backend.Output{}, errdefs.Internalf("guest agent: bad exit frame: %v", err)
		}
		st := exitStatus(ex)
		return backend.Output{Exit: &st}, nil
	case kind == guest.KindFail:
		a.done = true
		return backend.Output{}, failure(data, "attach")
	}
	return backend.Output{}, errdefs.Internalf("guest agent: unexpected frame %q while attached", kind)
}

func (a *attachment) Close() error {
	a.stop()
	return a.st.Close()
}

// streamErr is the error of a stream that failed: the context's, the
// VM's end, or the stream's.
func (v *VM) streamErr(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case <-v.done:
		return errdefs.Unavailablef("%s: the VM ended: %v", what, v.err)
	default:
	}
	return errdefs.Wrap(errdefs.Unavailable, err, what)
}

package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
)

var _ backend.Resizer = (*process)(nil)

// process is a process in the VM: one yamux stream, whose frames the
// demultiplexer turns into the streams backend.Process promises.
type process struct {
	st      net.Conn
	pid     int
	wmu     sync.Mutex // frames to the guest
	stdout  *io.PipeReader
	stderr  *io.PipeReader
	stdin   *stdinWriter
	pty     bool
	done    chan struct{}
	vm      *VM
	lost    int64 // the VM's AgentLosses at the start
	status  backend.ExitStatus
	err     error
	closeMu sync.Once
}

// Start starts p in the VM's root.
func (v *VM) Start(ctx context.Context, p backend.ProcSpec) (backend.Process, error) {
	return v.start(ctx, p, nil)
}

// start starts p with resource limits rl (none: the agent's).
func (v *VM) start(ctx context.Context, p backend.ProcSpec, rl []guest.Rlimit) (backend.Process, error) {
	if p.PTY {
		// One terminal, both ways: stdout reads it, stdin writes to it.
		p.Stdin, p.Stdout, p.Stderr = true, true, false
	}
	req := guest.Request{Op: "exec", Argv: p.Argv, Env: p.Env, Dir: p.Cwd, UID: p.UID, GID: p.GID,
		Stdin: p.Stdin, Stdout: p.Stdout, Stderr: p.Stderr, PTY: p.PTY, Rows: p.Rows, Cols: p.Cols, Rlimits: rl}
	lost := v.losses.Load()
	st, stop, err := v.open(ctx, req)
	if err != nil {
		return nil, err
	}
	defer stop()
	br := bufio.NewReader(st)
	kind, data, err := guest.ReadFrame(br)
	if err != nil {
		st.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "start a process in the VM")
	}
	switch kind {
	case guest.KindStarted:
	case guest.KindFail:
		st.Close()
		return nil, failure(data, "start "+p.Argv[0]+" in the VM")
	default:
		st.Close()
		return nil, errdefs.Internalf("guest agent: unexpected frame %q at start", kind)
	}
	var s guest.Started
	if err := json.Unmarshal(data, &s); err != nil {
		st.Close()
		return nil, errdefs.Internalf("guest agent: bad start frame: %v", err)
	}
	if !stop() {
		st.Close()
		return nil, ctx.Err()
	}
	_ = st.SetDeadline(time.Time{})
	pr := &process{st: st, pid: s.Pid, pty: p.PTY, done: make(chan struct{}), vm: v, lost: lost}
	var outW, errW *io.PipeWriter
	if p.Stdout {
		pr.stdout, outW = io.Pipe()
	}
	if p.Stderr {
		pr.stderr, errW = io.Pipe()
	}
	if p.Stdin {
		pr.stdin = &stdinWriter{p: pr}
	}
	go pr.demux(br, outW, errW, v.done)
	return pr, nil
}

// demux reads the guest's frames until the exit.
func (p *process) demux(br *bufio.Reader, outW, errW *io.PipeWriter, vmDone <-chan struct{}) {
	end := func(err error) {
		if outW != nil {
			outW.CloseWithError(err)
		}
		if errW != nil {
			errW.CloseWithError(err)
		}
	}
	for {
		kind, data, err := guest.ReadFrame(br)
		if err != nil {
			select {
			case <-vmDone:
				err = errdefs.Unavailablef("the VM stopped")
			default:
				err = p.vm.lostErr(err, p.lost, "follow a process in the VM")
			}
			p.err = err
			end(nil)
			close(p.done)
			return
		}
		switch kind {
		case guest.KindStdout:
			if outW != nil {
				_, _ = outW.Write(data)
			}
		case guest.KindStderr:
			if errW != nil {
				_, _ = errW.Write(data)
			}
		case guest.KindExit:
			var ex guest.Exit
			if err := json.Unmarshal(data, &ex); err != nil {
				p.err = errdefs.Internalf("guest agent: bad exit frame: %v", err)
			}
			p.status = backend.ExitStatus{Code: ex.Code, Signal: syscall.Signal(ex.Signal)}
			end(nil)
			close(p.done)
			return
		case guest.KindFail:
			p.err = failure(data, "process in the VM")
			end(nil)
			close(p.done)
			return
		}
	}
}

func (p *process) send(kind byte, b []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return guest.WriteFrame(p.st, kind, b)
}

func (p *process) Pid() int { return p.pid }

func (p *process) Stdin() io.WriteCloser {
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

func (p *process) Signal(sig syscall.Signal, group bool) error {
	select {
	case <-p.done:
		return errdefs.Conflictf("process %d has exited", p.pid)
	default:
	}
	b, _ := json.Marshal(guest.Signal{Signal: int(sig), Group: group})
	if err := p.send(guest.KindSignal, b); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "signal a process in the VM")
	}
	return nil
}

// Resize sets the size of a PTY process's terminal (backend.Resizer).
func (p *process) Resize(rows, cols uint16) error {
	if !p.pty {
		return errdefs.Invalidf("resize terminal: process %d has no terminal (start it with a pty)", p.pid)
	}
	select {
	case <-p.done:
		return errdefs.Wrap(errdefs.Conflict, os.ErrProcessDone, "resize terminal")
	default:
	}
	b, _ := json.Marshal(guest.Winsize{Rows: rows, Cols: cols})
	if err := p.send(guest.KindResize, b); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "resize a terminal in the VM")
	}
	return nil
}

func (p *process) Wait() (backend.ExitStatus, error) {
	<-p.done
	return p.status, p.err
}

// Close ends the stream: the guest kills a process still running, with
// its group.
func (p *process) Close() error {
	p.closeMu.Do(func() { _ = p.st.Close() })
	return nil
}

// stdinWriter sends stdin frames; Close sends its end.
type stdinWriter struct {
	p      *process
	closed sync.Once
}

func (w *stdinWriter) Write(b []byte) (int, error) {
	const chunk = 32 << 10
	n := 0
	for len(b) > 0 {
		c := min(len(b), chunk)
		if err := w.p.send(guest.KindStdin, b[:c]); err != nil {
			return n, err
		}
		n += c
		b = b[c:]
	}
	return n, nil
}

func (w *stdinWriter) Close() error {
	var err error
	w.closed.Do(func() { err = w.p.send(guest.KindCloseIn, nil) })
	return err
}

// failure is the error of an 'f' frame, in its category.
func failure(data []byte, what string) error {
	var f guest.Failure
	if err := json.Unmarshal(data, &f); err != nil {
		return errdefs.Internalf("guest agent: %s: %s", what, data)
	}
	if f.Exited {
		return errdefs.Wrap(errdefs.Conflict, os.ErrProcessDone, what)
	}
	return errdefs.New(categoryNamed(f.Category), "%s: %s", what, f.Error)
}

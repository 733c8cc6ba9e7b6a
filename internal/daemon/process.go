package daemon

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// process is a background process. Processes are kept, with their output
// (within the limits), until their sandbox is deleted. They do not survive
// a daemon restart: the agent kills a process whose connection drops.
type process struct {
	id      string
	seq     int
	sandbox string
	argv    []string
	pid     int
	started time.Time
	proc    backend.Process
	stdout  *capture
	stderr  *capture

	// stdinLock (one token) serialises writers of stdin: the initial
	// stdin of StartProcess and WriteStdin calls. A channel, not a mutex,
	// so that a WriteStdin waiting behind a write the process does not
	// read gives up when its call ends.
	stdinLock chan struct{}
	stdin     io.WriteCloser // nil once closed

	closeOnce sync.Once
	done      chan struct{}
	result    *warrenv1.ExecResult // written before done is closed
}

// kill closes the handle: a running process is killed with its group.
func (p *process) kill() {
	p.closeOnce.Do(func() { _ = p.proc.Close() })
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) info() *warrenv1.ProcessInfo {
	pi := &warrenv1.ProcessInfo{
		SandboxId:       p.sandbox,
		ProcessId:       p.id,
		Pid:             int32(p.pid),
		Argv:            slices.Clone(p.argv),
		Running:         !p.exited(),
		StartedAtUnixMs: p.started.UnixMilli(),
	}
	if !pi.Running {
		pi.Result = proto.Clone(p.result).(*warrenv1.ExecResult)
	}
	return pi
}

// StartProcess starts a background process and returns at once. Its stdin
// stays open for WriteStdin; its output is captured within the limits
// (output_limit_bytes per stream) for WaitProcess. timeout_ms, when set,
// kills its process group when it passes; 0 lets it run until the sandbox
// goes. At most 1,024 processes (running or exited) per sandbox.
func (m *Manager) StartProcess(ctx context.Context, req *warrenv1.ExecRequest) (_ *warrenv1.ProcessInfo, err error) {
	defer m.observe("StartProcess", &err)
	if req.GetIdempotencyKey() != "" {
		return nil, errdefs.Invalidf("idempotency_key is not supported by StartProcess")
	}
	s, v, err := m.live(opExec, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	limit, err := outputLimit(req.GetOutputLimitBytes())
	if err != nil {
		return nil, err
	}
	timeout, err := m.execTimeout(req.GetTimeoutMs(), 0)
	if err != nil {
		return nil, err
	}
	spec, err := m.procSpec(ctx, v, req)
	if err != nil {
		return nil, err
	}
	spec.Stdin = true

	s.mu.Lock()
	if len(s.procs)+s.procPending >= MaxProcessesPerSandbox {
		s.mu.Unlock()
		return nil, errdefs.Exhaustedf("sandbox %s has %d processes, the maximum", s.id, MaxProcessesPerSandbox)
	}
	s.procPending++
	s.mu.Unlock()

	// The process outlives this call.
	proc, err := v.sb.Start(context.WithoutCancel(ctx), spec)
	s.mu.Lock()
	s.procPending--
	if err != nil {
		s.mu.Unlock()
		return nil, m.explain(opExec, s, err, "start process")
	}
	if why := s.allowLocked(opExec); why != nil {
		s.mu.Unlock()
		_ = proc.Close()
		return nil, why
	}
	s.procSeq++
	p := &process{
		id:        fmt.Sprintf("p-%d", s.procSeq),
		seq:       s.procSeq,
		sandbox:   s.id,
		argv:      spec.Argv,
		pid:       proc.Pid(),
		started:   time.Now(),
		proc:      proc,
		stdout:    newCapture(limit, true, nil),
		stderr:    newCapture(limit, true, nil),
		stdin:     proc.Stdin(),
		stdinLock: make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	if s.procs == nil {
		s.procs = map[string]*process{}
	}
	s.procs[p.id] = p
	s.mu.Unlock()

	if data := req.GetStdin(); len(data) > 0 {
		p.stdinLock <- struct{}{}
		go func() {
			defer func() { <-p.stdinLock }()
			if p.stdin != nil {
				_, _ = p.stdin.Write(data)
			}
		}()
	}
	if !m.spawn(func() { m.collectProcess(p, timeout) }) {
		p.kill()
		return nil, errdefs.Unavailablef("daemon is shutting down")
	}
	return p.info(), nil
}

// collectProcess reads a background process's output and waits for it.
func (m *Manager) collectProcess(p *process, timeout time.Duration) {
	col := collect(nil, streamSource{p.proc.Stdout(), p.stdout}, streamSource{p.proc.Stderr(), p.stderr})
	waitCh := make(chan waitResult, 1)
	go func() {
		st, err := p.proc.Wait()
		waitCh <- waitResult{st, err}
	}()
	var timeoutC <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	var wr waitResult
	timedOut := false
	select {
	case wr = <-waitCh:
	case <-timeoutC:
		timedOut = true
		_ = p.proc.Signal(syscall.SIGKILL, true)
		wr = awaitExit(p.proc, waitCh)
	}
	dur := time.Since(p.started)
	col.drain(pipeGrace)
	if wr.err != nil {
		// Killed by Close (sandbox deleted, daemon closing) or lost.
		wr.st = backend.ExitStatus{Code: -1, Signal: syscall.SIGKILL}
		m.log.Debug("background process ended without an exit status", "sandbox", p.sandbox, "process", p.id, "err", wr.err)
	}
	p.result = buildResult(p.pid, dur, wr.st, timedOut, p.stdout, p.stderr)
	close(p.done)
	p.kill()
}

// process finds a background process of a sandbox in any state.
func (m *Manager) process(sandboxID, processID string) (*process, error) {
	s, err := m.lookup(sandboxID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allowLocked(opInspect); err != nil {
		return nil, err
	}
	p := s.procs[processID]
	if p == nil {
		return nil, errdefs.NotFoundf("process %s not found in sandbox %s", processID, sandboxID)
	}
	return p, nil
}

// ListProcesses lists a sandbox's background processes in start order.
func (m *Manager) ListProcesses(ctx context.Context, req *warrenv1.ListProcessesRequest) (_ *warrenv1.ListProcessesResponse, err error) {
	defer m.observe("ListProcesses", &err)
	s, err := m.lookup(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	slices.SortFunc(procs, func(a, b *process) int { return a.seq - b.seq })
	resp := &warrenv1.ListProcessesResponse{Processes: make([]*warrenv1.ProcessInfo, 0, len(procs))}
	for _, p := range procs {
		resp.Processes = append(resp.Processes, p.info())
	}
	return resp, nil
}

// WaitProcess waits for a background process to exit and returns its
// result. timeout_ms > 0 bounds the wait (DeadlineExceeded when it
// passes; the process keeps running).
func (m *Manager) WaitProcess(ctx context.Context, req *warrenv1.WaitProcessRequest) (_ *warrenv1.ExecResult, err error) {
	defer m.observe("WaitProcess", &err)
	p, err := m.process(req.GetSandboxId(), req.GetProcessId())
	if err != nil {
		return nil, err
	}
	if req.GetTimeoutMs() < 0 {
		return nil, errdefs.Invalidf("timeout_ms %d is negative", req.GetTimeoutMs())
	}
	var timeoutC <-chan time.Time
	if ms := req.GetTimeoutMs(); ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		timeoutC = t.C
	}
	select {
	case <-p.done:
		return proto.Clone(p.result).(*warrenv1.ExecResult), nil
	case <-timeoutC:
		return nil, errdefs.New(errdefs.DeadlineExceeded, "process %s of sandbox %s still running after %d ms", p.id, p.sandbox, req.GetTimeoutMs())
	case <-ctx.Done():
		return nil, ctxError(ctx, "wait for process "+p.id)
	}
}

// SignalProcess sends a signal (default SIGTERM) to a background process,
// or to its process group.
func (m *Manager) SignalProcess(ctx context.Context, req *warrenv1.SignalProcessRequest) (_ *warrenv1.SignalProcessResponse, err error) {
	defer m.observe("SignalProcess", &err)
	sig := syscall.Signal(req.GetSignal())
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	if sig < 1 || sig > 64 {
		return nil, errdefs.Invalidf("invalid signal %d", req.GetSignal())
	}
	p, err := m.process(req.GetSandboxId(), req.GetProcessId())
	if err != nil {
		return nil, err
	}
	if p.exited() {
		return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
	}
	if err := p.proc.Signal(sig, req.GetGroup()); err != nil {
		if p.exited() {
			return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
		}
		return nil, withCategory(err, errdefs.Internal, "signal process "+p.id)
	}
	return &warrenv1.SignalProcessResponse{}, nil
}

type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

// WriteStdin writes to a background process's stdin, and closes it when
// asked. Writes block while the process does not read (until the call is
// cancelled when the pipe supports deadlines).
func (m *Manager) WriteStdin(ctx context.Context, req *warrenv1.WriteStdinRequest) (_ *warrenv1.WriteStdinResponse, err error) {
	defer m.observe("WriteStdin", &err)
	p, err := m.process(req.GetSandboxId(), req.GetProcessId())
	if err != nil {
		return nil, err
	}
	if p.exited() {
		return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
	}
	select {
	case p.stdinLock <- struct{}{}:
	case <-ctx.Done():
		return nil, ctxError(ctx, "wait for an earlier stdin write of process "+p.id)
	}
	defer func() { <-p.stdinLock }()
	if p.stdin == nil {
		return nil, errdefs.Conflictf("stdin of process %s of sandbox %s is closed", p.id, p.sandbox)
	}
	if data := req.GetData(); len(data) > 0 {
		if wd, ok := p.stdin.(writeDeadliner); ok {
			stop := context.AfterFunc(ctx, func() { _ = wd.SetWriteDeadline(time.Now()) })
			defer func() {
				stop()
				_ = wd.SetWriteDeadline(time.Time{})
			}()
		}
		if _, err := p.stdin.Write(data); err != nil {
			switch {
			case ctx.Err() != nil:
				return nil, ctxError(ctx, "write stdin of process "+p.id)
			case p.exited():
				return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
			}
			return nil, errdefs.New(errdefs.Conflict, "write stdin of process %s: %w", p.id, err)
		}
	}
	if req.GetClose() {
		err := p.stdin.Close()
		p.stdin = nil
		if err != nil {
			return nil, errdefs.New(errdefs.Internal, "close stdin of process %s: %w", p.id, err)
		}
	}
	return &warrenv1.WriteStdinResponse{}, nil
}

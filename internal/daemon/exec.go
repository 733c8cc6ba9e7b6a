package daemon

import (
	"context"
	"io"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/trajectory"
)

const (
	maxIdempotencyKey = 256
	// passwdMax caps how much of /etc/passwd and /etc/group is read.
	passwdMax = 4 << 20
	// killWait is how long a process may take to die after SIGKILL or
	// Close before the call gives up on its exit status.
	killWait = 10 * time.Second
	// replayChunk is the largest output event when replaying a cached
	// result on a stream.
	replayChunk = 1 << 20
)

// Exec runs a command to completion and returns its captured output.
func (m *Manager) Exec(ctx context.Context, req *warrenv1.ExecRequest) (_ *warrenv1.ExecResult, err error) {
	defer m.observe("Exec", &err)
	out, err := m.execStep(ctx, req, nil)
	return out.res, err
}

// execStep runs an exec as a step of the sandbox's trajectory log: the
// recorded result when the log has the step, else live (the output is
// then kept, to be recorded, even when it is streamed).
func (m *Manager) execStep(ctx context.Context, req *warrenv1.ExecRequest, send func(*warrenv1.ExecEvent) error) (stepOutcome, error) {
	if req.GetSeq() == 0 && req.GetIdempotencyKey() != "" && m.idem.known(req.GetSandboxId(), req.GetIdempotencyKey()) {
		// A retry of an unnumbered call is that call, not a new step: it
		// gets the first run's result, step number included.
		res, _, err := m.exec(ctx, req, send, true, 0)
		return stepOutcome{res: res, seq: res.GetSeq()}, err
	}
	st := step{sandbox: req.GetSandboxId(), session: req.GetSessionId(), seq: req.GetSeq(), method: trajectory.MethodExec, req: req}
	out, err := m.recorded(ctx, st, func(seq uint64) (*warrenv1.ExecResult, bool, *trajectory.Late, error) {
		res, started, err := m.exec(ctx, req, send, !m.traj.off, seq)
		return res, !started, nil, err
	})
	if err == nil && out.replayed && send != nil {
		if err := replay(out.res, send); err != nil {
			return stepOutcome{}, withCategory(err, errdefs.Unavailable, "send exec output")
		}
	}
	return out, err
}

// ExecStream runs a command and sends its output as it comes; the last
// event carries the result, with empty stdout and stderr. The output
// limits apply to what is sent. A failed send or a cancelled ctx kills the
// command.
func (m *Manager) ExecStream(ctx context.Context, req *warrenv1.ExecRequest, send func(*warrenv1.ExecEvent) error) (err error) {
	defer m.observe("ExecStream", &err)
	ss := &serialSender{send: send}
	defer ss.close()
	out, err := m.execStep(ctx, req, ss.send1)
	if err != nil {
		return err
	}
	final := proto.Clone(out.res).(*warrenv1.ExecResult)
	final.Stdout, final.Stderr = nil, nil
	if err := ss.send1(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Result{Result: final}}); err != nil {
		return withCategory(err, errdefs.Unavailable, "send exec result")
	}
	return nil
}

// serialSender serialises sends from the two output readers and refuses
// sends once the call returned (a reader abandoned in drain must not touch
// a finished stream).
type serialSender struct {
	mu     sync.Mutex
	send   func(*warrenv1.ExecEvent) error
	closed bool
}

func (s *serialSender) send1(ev *warrenv1.ExecEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errdefs.Unavailablef("stream closed")
	}
	return s.send(ev)
}

func (s *serialSender) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// exec runs req once, or returns the cached outcome of an earlier run with
// the same idempotency key (waiting for it while it runs). keep keeps a
// streamed command's output too (to record it). seq is the trajectory
// step the run is recorded as, kept with the cached result. started
// reports whether the outcome is a command's that ran (this call's or the
// key's first).
func (m *Manager) exec(ctx context.Context, req *warrenv1.ExecRequest, send func(*warrenv1.ExecEvent) error, keep bool, seq uint64) (_ *warrenv1.ExecResult, started bool, _ error) {
	key := req.GetIdempotencyKey()
	if key == "" {
		return m.execOnce(ctx, req, send, keep || send == nil)
	}
	if len(key) > maxIdempotencyKey {
		return nil, false, errdefs.Invalidf("idempotency_key longer than %d bytes", maxIdempotencyKey)
	}
	if _, err := m.find(ctx, req.GetSandboxId()); err != nil {
		return nil, false, err
	}
	e, first := m.idem.begin(req.GetSandboxId(), key)
	if !first {
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, false, ctxError(ctx, "wait for the first run of idempotency key "+key)
		}
		res, err := e.outcome()
		if err == nil && send != nil {
			if err := replay(res, send); err != nil {
				return nil, true, withCategory(err, errdefs.Unavailable, "send exec output")
			}
		}
		return res, res != nil, err
	}
	// Output is kept even when streaming, for the retries.
	res, started, err := m.execOnce(ctx, req, send, true)
	if res != nil {
		res.Seq = seq
	}
	if started {
		m.idem.finish(e, res, err)
	} else {
		m.idem.abandon(e, err)
	}
	return res, started, err
}

// replay sends a cached result's output as stream events.
func replay(res *warrenv1.ExecResult, send func(*warrenv1.ExecEvent) error) error {
	for b := res.GetStdout(); len(b) > 0; {
		n := min(len(b), replayChunk)
		if err := send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Stdout{Stdout: b[:n]}}); err != nil {
			return err
		}
		b = b[n:]
	}
	for b := res.GetStderr(); len(b) > 0; {
		n := min(len(b), replayChunk)
		if err := send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Stderr{Stderr: b[:n]}}); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// execOnce validates and runs one exec. started reports whether the
// command was started (its outcome is then final for idempotency).
func (m *Manager) execOnce(ctx context.Context, req *warrenv1.ExecRequest, send func(*warrenv1.ExecEvent) error, keep bool) (*warrenv1.ExecResult, bool, error) {
	s, v, err := m.live(ctx, opExec, req.GetSandboxId())
	if err != nil {
		return nil, false, err
	}
	rows, cols, err := termSize(req)
	if err != nil {
		return nil, false, err
	}
	limit, err := outputLimit(req.GetOutputLimitBytes())
	if err != nil {
		return nil, false, err
	}
	timeout, err := m.execTimeout(req.GetTimeoutMs(), m.cfg.DefaultExecTimeout)
	if err != nil {
		return nil, false, err
	}
	spec, err := m.procSpec(ctx, v, req)
	if err != nil {
		return nil, false, err
	}
	spec.Stdin = len(req.GetStdin()) > 0
	// With a pty the output is the terminal's, on stdout.
	spec.PTY, spec.Rows, spec.Cols = req.GetPty(), rows, cols
	return m.run(ctx, s, v.sb, spec, runOpts{stdin: req.GetStdin(), timeout: timeout, limit: limit, keep: keep, send: send})
}

// execTimeout validates timeout_ms; 0 selects def (0: none).
func (m *Manager) execTimeout(ms int64, def time.Duration) (time.Duration, error) {
	switch {
	case ms < 0:
		return 0, errdefs.Invalidf("timeout_ms %d is negative", ms)
	case ms == 0:
		return def, nil
	case ms > m.cfg.MaxTimeout.Milliseconds():
		return 0, errdefs.Invalidf("timeout_ms %d exceeds the maximum of %d", ms, m.cfg.MaxTimeout.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// procSpec builds the process spec of an exec request: argv, merged env,
// cwd and the resolved user. Streams are left for the caller to set.
func (m *Manager) procSpec(ctx context.Context, v view, req *warrenv1.ExecRequest) (backend.ProcSpec, error) {
	argv, err := argvOf(req)
	if err != nil {
		return backend.ProcSpec{}, err
	}
	if err := validateEnv(req.GetEnv()); err != nil {
		return backend.ProcSpec{}, err
	}
	cwd := req.GetCwd()
	if cwd == "" {
		cwd = v.workdir
	}
	if cwd == "" {
		cwd = "/"
	}
	if err := validateAbsPath("cwd", cwd); err != nil {
		return backend.ProcSpec{}, err
	}
	var read fileReader
	if v.fs != nil {
		read = func(path string) ([]byte, error) {
			data, _, _, err := v.fs.ReadFile(ctx, path, 0, passwdMax)
			return data, err
		}
	}
	user := req.GetUser()
	if user == "" {
		user = v.user
	}
	id, err := resolveUser(user, read)
	if err != nil {
		return backend.ProcSpec{}, err
	}
	return backend.ProcSpec{
		Argv:   argv,
		Env:    mergeEnv(v.env, req.GetEnv(), id.Home),
		Cwd:    cwd,
		UID:    id.UID,
		GID:    id.GID,
		Stdout: true,
		Stderr: true,
	}, nil
}

type runOpts struct {
	stdin   []byte
	timeout time.Duration // 0: none
	limit   int64
	keep    bool
	send    func(*warrenv1.ExecEvent) error // stream output as it comes
}

type waitResult struct {
	st  backend.ExitStatus
	err error
}

// oomKills reads the sandbox's OOM-kill count, through the one-file
// OOMCounter where the backend has it.
func oomKills(sb backend.Sandbox) (uint64, bool) {
	if c, ok := sb.(backend.OOMCounter); ok {
		n, err := c.OOMKills()
		return n, err == nil
	}
	st, err := sb.Stats()
	return st.OOMKills, err == nil
}

// run starts a process, feeds its stdin, captures its output within the
// limits and waits for it: until it exits, its timeout passes (SIGKILL to
// its process group), or the call is cancelled (Close kills the group).
func (m *Manager) run(ctx context.Context, s *sandbox, sb backend.Sandbox, spec backend.ProcSpec, o runOpts) (*warrenv1.ExecResult, bool, error) {
	oomBefore, _ := oomKills(sb)
	start := time.Now()
	proc, err := sb.Start(ctx, spec)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, ctxError(ctx, "start process")
		}
		return nil, false, m.explain(opExec, s, err, "start process")
	}
	defer proc.Close()
	var oomCheck func() bool
	if t, ok := sb.(backend.OOMTracker); ok {
		oomCheck = t.TrackOOM(proc)
	}

	sendFailed := make(chan struct{})
	var sendErr error
	var failOnce sync.Once
	onSendErr := func(err error) {
		failOnce.Do(func() {
			sendErr = err
			close(sendFailed)
		})
	}
	var sendOut, sendErrOut func([]byte) error
	if o.send != nil {
		sendOut = func(b []byte) error {
			return o.send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Stdout{Stdout: b}})
		}
		sendErrOut = func(b []byte) error {
			return o.send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Stderr{Stderr: b}})
		}
	}
	if spec.PTY && o.send != nil {
		if r, ok := proc.(backend.Resizer); ok {
			id, unregister := s.registerPTYExec(r)
			defer unregister()
			// First, so the caller has the id before any output.
			if err := o.send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Started{Started: &warrenv1.ExecStarted{ProcessId: id, Pid: int32(proc.Pid())}}}); err != nil {
				onSendErr(err)
			}
		}
	}
	stdout := newCapture(o.limit, o.keep, sendOut)
	stderr := newCapture(o.limit, o.keep, sendErrOut)
	col := collect(onSendErr, streamSource{proc.Stdout(), stdout}, streamSource{proc.Stderr(), stderr})
	if spec.Stdin {
		if w := proc.Stdin(); w != nil {
			go feedStdin(w, o.stdin)
		}
	}
	waitCh := make(chan waitResult, 1)
	go func() {
		st, err := proc.Wait()
		waitCh <- waitResult{st, err}
	}()

	// The timeout counts running time: a pause of the sandbox pushes it
	// back (pause.go).
	rt := newRunTimer(s, time.Now(), o.timeout, s.pausedTotal())
	defer rt.stop()
	var (
		wr       waitResult
		timedOut bool
		stopErr  error
	)
wait:
	select {
	case wr = <-waitCh:
	case <-rt.C():
		if !rt.expired() {
			goto wait
		}
		timedOut = true
		_ = proc.Signal(syscall.SIGKILL, true)
		wr = awaitExit(proc, waitCh)
	case <-ctx.Done():
		stopErr = ctxError(ctx, "exec cancelled")
		_ = proc.Close()
		wr = awaitExit(proc, waitCh)
	case <-sendFailed:
		stopErr = withCategory(sendErr, errdefs.Unavailable, "send exec output")
		_ = proc.Close()
		wr = awaitExit(proc, waitCh)
	case <-m.closing:
		stopErr = errdefs.Unavailablef("daemon is shutting down")
		_ = proc.Close()
		wr = awaitExit(proc, waitCh)
	}
	dur := time.Since(start)
	col.drain(pipeGrace)
	res := buildResult(proc.Pid(), dur, wr.st, timedOut, stdout, stderr)
	if wr.err != nil {
		if stopErr != nil {
			return res, true, stopErr
		}
		return nil, true, m.explain(opExec, s, wr.err, "wait for process")
	}
	res.OomKilled = !timedOut && oomKilled(sb, wr.st, oomBefore, oomCheck)
	m.execEvents(s, sb, spec.Argv, res, o.limit, o.timeout)
	m.metrics.ObserveExec(dur.Seconds())
	return res, true, stopErr
}

// oomKilled reports whether the exec's own process was OOM-killed: it
// died of SIGKILL while the sandbox's OOM counter rose, and, where the
// backend can tell (backend.OOMTracker), the kernel chose it rather than
// another process of the sandbox (a kill -9 from inside is SIGKILL too).
// An exit code of 137 is not an OOM kill: the process exited with it
// (`exit 137`), or a shell reports a child's kill, which the kernel log
// does not tie to the exec; both are reported as the code they are.
func oomKilled(sb backend.Sandbox, st backend.ExitStatus, before uint64, check func() bool) bool {
	if st.Signal != syscall.SIGKILL {
		return false
	}
	if n, ok := oomKills(sb); !ok || n <= before {
		return false
	}
	if check != nil {
		return check()
	}
	return true // sandbox-wide only: the backend cannot tell whose kill
}

// awaitExit waits for a killed process's exit status, closing the handle
// if SIGKILL was not enough, and gives up after killWait.
func awaitExit(proc backend.Process, waitCh <-chan waitResult) waitResult {
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case wr := <-waitCh:
		return wr
	case <-t.C:
	}
	_ = proc.Close()
	t.Reset(killWait)
	select {
	case wr := <-waitCh:
		return wr
	case <-t.C:
		return waitResult{err: errdefs.Internalf("process %d did not exit after being killed", proc.Pid())}
	}
}

// feedStdin writes data and closes the pipe; a process that exits without
// reading it breaks the pipe, which is fine.
func feedStdin(w io.WriteCloser, data []byte) {
	_, _ = w.Write(data)
	_ = w.Close()
}

// buildResult assembles an ExecResult; the captures are frozen.
func buildResult(pid int, dur time.Duration, st backend.ExitStatus, timedOut bool, stdout, stderr *capture) *warrenv1.ExecResult {
	res := &warrenv1.ExecResult{
		ExitCode:   int32(st.Code),
		Signal:     int32(st.Signal),
		TimedOut:   timedOut,
		DurationMs: dur.Milliseconds(),
		Pid:        int32(pid),
	}
	if st.Signal != 0 {
		res.ExitCode = -1
	}
	res.Stdout, res.StdoutTruncated, res.StdoutDroppedBytes = stdout.result()
	res.Stderr, res.StderrTruncated, res.StderrDroppedBytes = stderr.result()
	return res
}

package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Terminal sizes of PTY processes.
const (
	defaultRows, defaultCols = 24, 80
	maxTermSize              = 4096
)

// process is a background process. The sandbox's agent owns it
// (backend.Background): its stdio, its output buffers (the latest
// output_limit_bytes of each stream) and its record, which the agent keeps
// until the daemon forgets it (retire) or the sandbox goes. This record is
// the daemon's view, rebuilt from the agent's list after a restart
// (adoptProcesses): nothing of it lives only here except the watcher that
// notices the exit and enforces the timeout.
type process struct {
	id      string
	seq     int
	sandbox string
	argv    []string
	pid     int
	started time.Time
	timeout time.Duration // 0: none
	// paused0 is how long its sandbox had been paused when it started
	// (runTimer); 0 for a process adopted after a restart.
	paused0 time.Duration
	pty     bool
	host    backend.Background

	// stdinLock (one token) serialises writers of stdin: the initial
	// stdin of StartProcess and WriteStdin calls. A channel, not a mutex,
	// so that a WriteStdin waiting behind a write the process does not
	// read gives up when its call ends.
	stdinLock   chan struct{}
	stdin       backend.StdinWriter // opened on first use
	stdinClosed bool

	mu       sync.Mutex
	watch    backend.Attachment // the watcher's, while it waits
	detached bool               // the daemon let go (Close): the watcher stops
	timedOut bool
	done     chan struct{} // closed once the exit is known
	status   backend.ExitStatus
	lost     bool // the sandbox went before the exit was seen
	// capChecked: the guard looked at its output for an output_cap event
	// (events.go; the guard's alone).
	capChecked bool
	runtime    time.Duration
	// shadowed: its pid was given to a younger process before the daemon
	// saw its exit (shadowedLocked); its sandbox's mu guards it.
	shadowed bool
}

// procTag is what the daemon keeps about a process in the agent's record
// (at most backend.MaxTag bytes), to rebuild its view after a restart.
type procTag struct {
	ID        string   `json:"id"`
	Seq       int      `json:"seq"`
	Argv      []string `json:"argv"`
	StartedMs int64    `json:"started_ms"`
	TimeoutMs int64    `json:"timeout_ms,omitempty"`
}

// encode marshals t within backend.MaxTag bytes: arguments longer than
// 256 bytes are cut, and trailing arguments that do not fit are dropped,
// with "..." marking the cut (the list shows that after a restart).
func (t procTag) encode() []byte {
	argv := make([]string, len(t.Argv))
	for i, a := range t.Argv {
		if len(a) > 256 {
			a = a[:256] + "..."
		}
		argv[i] = a
	}
	for cut := false; ; cut = true {
		t.Argv = argv
		if cut {
			t.Argv = append(slices.Clone(argv), "...")
		}
		b, _ := json.Marshal(t)
		if len(b) <= backend.MaxTag || len(argv) == 0 {
			return b
		}
		argv = argv[:len(argv)-1]
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// finish records the exit, once.
func (p *process) finish(st backend.ExitStatus, lost bool, runtime time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited() {
		return
	}
	p.status, p.lost, p.runtime = st, lost, runtime
	close(p.done)
}

// detach lets go of the process without touching it: the daemon closes
// or the sandbox goes. The watcher stops; the process runs on in the
// agent (or dies with the sandbox).
func (p *process) detach() {
	p.mu.Lock()
	p.detached = true
	w := p.watch
	p.mu.Unlock()
	if w != nil {
		w.Close()
	}
	select {
	case p.stdinLock <- struct{}{}:
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		<-p.stdinLock
	default: // a write in progress: it ends with its call
	}
}

// gone marks a process whose sandbox went away as killed.
func (p *process) gone() {
	p.detach()
	p.finish(backend.ExitStatus{Code: -1, Signal: syscall.SIGKILL}, true, time.Since(p.started))
}

// result is an exit status as an ExecResult without output.
func (p *process) result() *warrenv1.ExecResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	res := &warrenv1.ExecResult{
		ExitCode:   int32(p.status.Code),
		Signal:     int32(p.status.Signal),
		TimedOut:   p.timedOut,
		DurationMs: p.runtime.Milliseconds(),
		Pid:        int32(p.pid),
	}
	if p.status.Signal != 0 {
		res.ExitCode = -1
	}
	return res
}

func (p *process) info(rec *backend.BackgroundInfo) *warrenv1.ProcessInfo {
	pi := &warrenv1.ProcessInfo{
		SandboxId:       p.sandbox,
		ProcessId:       p.id,
		Pid:             int32(p.pid),
		Argv:            slices.Clone(p.argv),
		Running:         !p.exited(),
		StartedAtUnixMs: p.started.UnixMilli(),
		Pty:             p.pty,
	}
	if rec != nil {
		pi.StdoutBytes, pi.StderrBytes = rec.Stdout.Total, rec.Stderr.Total
	}
	if !pi.Running {
		pi.Result = p.result()
	}
	return pi
}

// background is the sandbox's process host, or Unsupported.
func background(sb backend.Sandbox) (backend.Background, error) {
	h, ok := sb.(backend.Background)
	if !ok {
		return nil, errdefs.Unsupportedf("this sandbox's backend cannot run background processes")
	}
	return h, nil
}

// termSize validates the pty fields of a request.
func termSize(req *warrenv1.ExecRequest) (rows, cols uint16, err error) {
	if !req.GetPty() {
		if req.GetRows() != 0 || req.GetCols() != 0 {
			return 0, 0, errdefs.Invalidf("rows and cols need pty")
		}
		return 0, 0, nil
	}
	r, c := req.GetRows(), req.GetCols()
	if r == 0 {
		r = defaultRows
	}
	if c == 0 {
		c = defaultCols
	}
	if r > maxTermSize || c > maxTermSize {
		return 0, 0, errdefs.Invalidf("terminal size %dx%d exceeds %d", r, c, maxTermSize)
	}
	return uint16(r), uint16(c), nil
}

// StartProcess starts a background process and returns at once. Its stdin
// stays open for WriteStdin; the agent keeps the latest
// output_limit_bytes of each stream for WaitProcess and AttachProcess.
// timeout_ms, when set, kills its process group when it passes; 0 lets it
// run until the sandbox goes. With pty it runs on a terminal. At most
// MaxProcessesPerSandbox run at once per sandbox; of the exited ones the
// latest MaxExitedProcesses are kept (retire). Processes survive a daemon
// restart.
func (m *Manager) StartProcess(ctx context.Context, req *warrenv1.ExecRequest) (_ *warrenv1.ProcessInfo, err error) {
	defer m.observe("StartProcess", &err)
	if req.GetIdempotencyKey() != "" {
		return nil, errdefs.Invalidf("idempotency_key is not supported by StartProcess")
	}
	s, v, err := m.live(ctx, opExec, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	host, err := background(v.sb)
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
	rows, cols, err := termSize(req)
	if err != nil {
		return nil, err
	}
	spec, err := m.procSpec(ctx, v, req)
	if err != nil {
		return nil, err
	}
	// The adopted processes' sequence numbers come first: a new one must
	// not reuse a handle.
	if err := m.awaitProcs(ctx, s); err != nil {
		return nil, err
	}

	s.mu.Lock()
	if s.runningProcsLocked()+s.procPending >= MaxProcessesPerSandbox {
		s.mu.Unlock()
		return nil, errdefs.Exhaustedf("sandbox %s has %d running processes, the maximum", s.id, MaxProcessesPerSandbox)
	}
	s.procPending++
	s.procSeq++
	seq := s.procSeq
	s.mu.Unlock()

	started := time.Now()
	tag := procTag{ID: fmt.Sprintf("p-%d", seq), Seq: seq, Argv: spec.Argv, StartedMs: started.UnixMilli(), TimeoutMs: timeout.Milliseconds()}
	// The process outlives this call.
	pid, err := host.StartBackground(context.WithoutCancel(ctx), spec, backend.BackgroundOpts{
		OutputCap: limit, PTY: req.GetPty(), Rows: rows, Cols: cols, Tag: tag.encode(),
	})
	s.mu.Lock()
	s.procPending--
	if err != nil {
		s.mu.Unlock()
		return nil, m.explain(opExec, s, err, "start process")
	}
	if why := s.allowLocked(opExec); why != nil {
		s.mu.Unlock()
		_ = host.SignalBackground(context.Background(), pid, syscall.SIGKILL, true)
		return nil, why
	}
	p := newProcess(s.id, host, tag, pid, req.GetPty())
	p.paused0 = s.pausedTotalLocked()
	if s.procs == nil {
		s.procs = map[string]*process{}
	}
	s.procs[p.id] = p
	shadowed := s.shadowedLocked(p)
	s.mu.Unlock()
	for _, q := range shadowed {
		m.forgetShadowed(s, q.host, q.pid)
	}

	if data := req.GetStdin(); len(data) > 0 {
		p.stdinLock <- struct{}{}
		go func() {
			defer func() { <-p.stdinLock }()
			if w, err := p.openStdin(context.Background()); err == nil {
				_, _ = w.Write(data)
			}
		}()
	}
	if !m.spawn(func() { m.watchProcess(p) }) {
		return nil, errdefs.Unavailablef("daemon is shutting down")
	}
	return p.info(nil), nil
}

// runningProcsLocked counts the processes whose exit the daemon has not
// seen: the ones MaxProcessesPerSandbox bounds.
func (s *sandbox) runningProcsLocked() int {
	n := 0
	for _, p := range s.procs {
		if !p.exited() {
			n++
		}
	}
	return n
}

// retire keeps p, which exited, among the sandbox's latest
// MaxExitedProcesses exits and lets go of the oldest beyond them: the
// daemon drops its record and the agent its record and output
// (backend.Forgetter). Without that, the agent's records would fill up
// after its limit of processes started over the sandbox's life, which an
// agent loop (every E2B command is a background process) reaches within
// the hour. A forget that fails leaves the record in the agent (it holds
// far more than the daemon keeps); a restarted daemon adopts it as exited
// and retires it again. An agent too old to forget makes the daemon keep
// every record, as before.
func (m *Manager) retire(s *sandbox, p *process) {
	s.mu.Lock()
	if s.procs[p.id] != p { // let go of meanwhile (hibernated), or shadowed
		shadowed := p.shadowed
		s.mu.Unlock()
		if shadowed {
			m.forgetShadowed(s, p.host, p.pid)
		}
		return
	}
	s.exited = append(s.exited, p)
	var old []*process
	for !s.keepExited && len(s.exited) > MaxExitedProcesses {
		old = append(old, s.exited[0])
		s.exited[0] = nil
		s.exited = s.exited[1:]
	}
	s.mu.Unlock()
	for _, q := range old {
		// The agent first: until it answers, the record is still good.
		err := forget(q)
		unsupported := errdefs.CategoryOf(err) == errdefs.Unsupported
		if err != nil && !unsupported && errdefs.CategoryOf(err) != errdefs.NotFound {
			m.log.Debug("forget exited process", "sandbox", s.id, "process", q.id, "err", err)
		}
		s.mu.Lock()
		if unsupported {
			s.keepExited = true
		} else if s.procs[q.id] == q {
			delete(s.procs, q.id)
		}
		s.mu.Unlock()
	}
}

// shadowedLocked lets go of the records whose pid p now has: the agent
// reaped them and the pid namespace gave the pid out again (at once after
// a CRIU restore, which hands out pids from the bottom; after a wrap
// otherwise). Requests by pid now reach p, so an older record could only
// show p's output and exit as its own. The ones whose exit the daemon has
// seen are returned, for the agent to forget; one whose exit is still on
// its way is forgotten when its watcher retires it.
func (s *sandbox) shadowedLocked(p *process) []*process {
	var out []*process
	for id, q := range s.procs {
		if q == p || q.pid != p.pid {
			continue
		}
		delete(s.procs, id)
		if i := slices.Index(s.exited, q); i >= 0 {
			s.exited = slices.Delete(s.exited, i, i+1)
		}
		if q.exited() {
			out = append(out, q)
		} else {
			q.shadowed = true
		}
	}
	return out
}

// forgetShadowed drops the agent's oldest exited record of pid, which is
// the shadowed one's: the process that has the pid now is younger.
func (m *Manager) forgetShadowed(s *sandbox, host backend.Background, pid int) {
	s.mu.Lock()
	keep := s.keepExited
	s.mu.Unlock()
	if keep {
		return
	}
	if err := forgetPid(host, pid); err != nil && errdefs.CategoryOf(err) != errdefs.NotFound {
		m.log.Debug("forget a process whose pid was reused", "sandbox", s.id, "pid", pid, "err", err)
	}
}

// forget asks the agent to drop an exited process's record.
func forget(p *process) error {
	if err := forgetPid(p.host, p.pid); err != nil {
		return fmt.Errorf("forget process %s: %w", p.id, err)
	}
	return nil
}

// forgetPid asks the agent to drop its oldest exited record of pid.
func forgetPid(host backend.Background, pid int) error {
	f, ok := host.(backend.Forgetter)
	if !ok {
		return errdefs.Unsupportedf("this sandbox's backend keeps every background process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f.ForgetBackground(ctx, pid)
}

func newProcess(sandbox string, host backend.Background, t procTag, pid int, pty bool) *process {
	return &process{
		id:        t.ID,
		seq:       t.Seq,
		sandbox:   sandbox,
		argv:      t.Argv,
		pid:       pid,
		started:   time.UnixMilli(t.StartedMs),
		timeout:   time.Duration(t.TimeoutMs) * time.Millisecond,
		pty:       pty,
		host:      host,
		stdinLock: make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
}

// openStdin returns the process's stdin handle, opening it on first use.
// The caller holds stdinLock.
func (p *process) openStdin(ctx context.Context) (backend.StdinWriter, error) {
	if p.stdin == nil {
		w, err := p.host.OpenStdin(ctx, p.pid)
		if err != nil {
			return nil, err
		}
		p.stdin = w
	}
	return p.stdin, nil
}

// awaitProcs waits until the background processes of an adopted sandbox
// are rebuilt, so that no call sees a partial list. When adoptAllProcesses
// has not reached the sandbox yet, the call adopts them itself: one agent
// round trip rather than a wait for the pool's turn.
func (m *Manager) awaitProcs(ctx context.Context, s *sandbox) error {
	if s.procsAdopted == nil {
		return nil
	}
	if s.procsClaimed.CompareAndSwap(false, true) {
		m.adoptProcessesOf(s)
		return nil
	}
	select {
	case <-s.procsAdopted:
		return nil
	case <-ctx.Done():
		return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "sandbox "+s.id+": its background processes are still being adopted after the daemon restart")
	}
}

// adoptProcessesOf adopts the processes of a sandbox adoptAll adopted
// (its caller claimed it: procsClaimed),
// unless it stopped or was deleted meanwhile or the daemon is closing (the
// next daemon adopts them), and opens its gate.
func (m *Manager) adoptProcessesOf(s *sandbox) {
	defer close(s.procsAdopted)
	s.mu.Lock()
	sb, st := s.sb, s.st
	s.mu.Unlock()
	if sb != nil && st == stateRunning && !isDone(m.closing) {
		m.adoptProcesses(s, sb)
	}
}

// adoptProcesses rebuilds the records of the background processes an
// earlier daemon started, from the agent's list, and watches the running
// ones again. Records without a tag of ours are not listed. A sandbox
// that left RUNNING meanwhile (its records were collected by remove or
// died) gets none.
func (m *Manager) adoptProcesses(s *sandbox, sb backend.Sandbox) {
	host, ok := sb.(backend.Background)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := host.ListBackground(ctx)
	if err != nil {
		m.log.Warn("list background processes of adopted sandbox", "sandbox", s.id, "err", err)
		return
	}
	// A pid listed twice was reused (shadowedLocked): its newest record
	// is the process that has it; the older ones are forgotten.
	newest := map[int]int{}
	for i, r := range recs {
		newest[r.Pid] = i
	}
	var watch, exited []*process
	var shadowed []int // pids of the older records
	s.mu.Lock()
	if s.sb != sb || s.st != stateRunning {
		s.mu.Unlock()
		return
	}
	for i, r := range recs {
		if newest[r.Pid] != i {
			if r.Exited {
				shadowed = append(shadowed, r.Pid)
			}
			continue
		}
		var t procTag
		if json.Unmarshal(r.Tag, &t) != nil || t.ID == "" || t.Seq <= 0 {
			continue
		}
		if s.procs == nil {
			s.procs = map[string]*process{}
		}
		if s.procs[t.ID] != nil {
			continue
		}
		p := newProcess(s.id, host, t, r.Pid, r.PTY)
		p.stdinClosed = !r.StdinOpen && !r.Exited
		if r.Exited {
			p.finish(r.Status, false, r.Runtime)
			// Looked at before the restart, or while no daemon ran:
			// either way not an event of this daemon's.
			p.capChecked = true
			exited = append(exited, p)
		} else {
			watch = append(watch, p)
		}
		s.procs[p.id] = p
		s.procSeq = max(s.procSeq, t.Seq)
	}
	s.mu.Unlock()
	for _, pid := range shadowed { // in start order, as the agent forgets
		m.forgetShadowed(s, host, pid)
	}
	for _, p := range exited { // in start order: the oldest go first
		m.retire(s, p)
	}
	for _, p := range watch {
		m.spawn(func() { m.watchProcess(p) })
	}
}

// watchProcess waits for a background process's exit, kills its group
// when its timeout passes, and records the exit. It returns without one
// when the daemon lets go (detach): the process runs on in the agent.
func (m *Manager) watchProcess(p *process) {
	var rt *runTimer
	if s, err := m.lookup(p.sandbox); err == nil {
		rt = newRunTimer(s, p.started, p.timeout, p.paused0)
		defer rt.stop()
	}
	for !p.isDetached() {
		st, err := p.awaitExit(rt)
		if st != nil {
			p.finish(*st, false, time.Since(p.started))
			m.processExited(p)
			if s, err := m.lookup(p.sandbox); err == nil {
				m.retire(s, p)
			}
			return
		}
		if p.isDetached() {
			return
		}
		// Lost the agent: the sandbox is going, or gone, or the agent is
		// slow to accept (a full backlog): try again while it answers.
		m.log.Debug("background process: lost the agent", "sandbox", p.sandbox, "process", p.id, "err", err)
		if errdefs.CategoryOf(err) != errdefs.Unavailable {
			p.gone()
			return
		}
		select {
		case <-m.closing:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := p.host.ListBackground(context.Background()); err != nil {
			p.gone()
			return
		}
	}
}

func (p *process) isDetached() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.detached
}

// awaitExit attaches as a waiter (no output) and returns the exit status,
// or the error that ended the attach. When the timeout passes first (rt:
// running time, pauses not counted), the process group is killed.
func (p *process) awaitExit(rt *runTimer) (*backend.ExitStatus, error) {
	a, err := p.host.AttachBackground(context.Background(), p.pid, backend.FromEnd, backend.FromEnd)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	p.mu.Lock()
	if p.detached {
		p.mu.Unlock()
		return nil, errdefs.Unavailablef("detached")
	}
	p.watch = a // detach closes it, which ends Next
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.watch = nil
		p.mu.Unlock()
	}()
	type next struct {
		st  *backend.ExitStatus
		err error
	}
	ch := make(chan next, 1)
	go func() {
		for {
			o, err := a.Next()
			if err != nil || o.Exit != nil {
				ch <- next{o.Exit, err}
				return
			}
		}
	}()
	for {
		select {
		case n := <-ch:
			return n.st, n.err
		case <-rt.C():
		}
		if rt.expired() {
			break
		}
	}
	p.mu.Lock()
	p.timedOut = true
	p.mu.Unlock()
	_ = p.host.SignalBackground(context.Background(), p.pid, syscall.SIGKILL, true)
	n := <-ch
	return n.st, n.err
}

// process finds a background process of a sandbox in a state that permits
// o (opInspect: any).
func (m *Manager) process(ctx context.Context, o op, sandboxID, processID string) (*process, error) {
	s, err := m.find(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	if err := m.awaitProcs(ctx, s); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allowLocked(o); err != nil {
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
	s, err := m.find(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if err := m.awaitProcs(ctx, s); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.st == stateHibernated {
		s.mu.Unlock()
		return m.hibernatedProcesses(s.id)
	}
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	slices.SortFunc(procs, func(a, b *process) int { return a.seq - b.seq })
	// The byte counts come from the agent, in one call; not while the
	// sandbox is paused (its agent is frozen): the records then carry
	// what the daemon knows.
	recs := map[int]*backend.BackgroundInfo{}
	s.mu.Lock()
	paused := s.st == statePaused
	s.mu.Unlock()
	if len(procs) > 0 && !paused && !procs[0].exitedAll(procs) {
		if list, err := procs[0].host.ListBackground(ctx); err == nil {
			for i := range list {
				recs[list[i].Pid] = &list[i]
			}
		}
	}
	resp := &warrenv1.ListProcessesResponse{Processes: make([]*warrenv1.ProcessInfo, 0, len(procs))}
	for _, p := range procs {
		resp.Processes = append(resp.Processes, p.info(recs[p.pid]))
	}
	return resp, nil
}

// exitedAll reports whether every process of the list is lost with its
// sandbox (the agent is then not asked).
func (p *process) exitedAll(procs []*process) bool {
	for _, q := range procs {
		q.mu.Lock()
		lost := q.lost
		q.mu.Unlock()
		if !lost {
			return false
		}
	}
	return true
}

// WaitProcess waits for a background process to exit and returns its
// result, with the output the agent kept: the latest output_limit_bytes
// of each stream (truncated and dropped_bytes say what was lost from the
// start). timeout_ms > 0 bounds the wait (DeadlineExceeded when it
// passes; the process keeps running).
func (m *Manager) WaitProcess(ctx context.Context, req *warrenv1.WaitProcessRequest) (_ *warrenv1.ExecResult, err error) {
	defer m.observe("WaitProcess", &err)
	p, err := m.process(ctx, opInspect, req.GetSandboxId(), req.GetProcessId())
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
	case <-timeoutC:
		return nil, errdefs.New(errdefs.DeadlineExceeded, "process %s of sandbox %s still running after %d ms", p.id, p.sandbox, req.GetTimeoutMs())
	case <-ctx.Done():
		return nil, ctxError(ctx, "wait for process "+p.id)
	}
	res := p.result()
	p.mu.Lock()
	lost := p.lost
	p.mu.Unlock()
	if lost {
		return res, nil // the output went with the sandbox
	}
	if err := p.collect(ctx, res); err != nil {
		if ctx.Err() != nil {
			return nil, ctxError(ctx, "read output of process "+p.id)
		}
		// The sandbox went meanwhile: the exit status is all there is.
		m.log.Debug("read output of exited process", "sandbox", p.sandbox, "process", p.id, "err", err)
	}
	return res, nil
}

// collect reads the kept output of an exited process into res.
func (p *process) collect(ctx context.Context, res *warrenv1.ExecResult) error {
	a, err := p.host.AttachBackground(ctx, p.pid, 0, 0)
	if err != nil {
		return err
	}
	defer a.Close()
	var out, errb streamBuf
	for {
		o, err := a.Next()
		if err != nil {
			return err
		}
		if o.Exit != nil {
			break
		}
		if o.Stderr {
			errb.add(o)
		} else {
			out.add(o)
		}
	}
	res.Stdout, res.StdoutTruncated, res.StdoutDroppedBytes = out.data, out.dropped > 0, out.dropped
	res.Stderr, res.StderrTruncated, res.StderrDroppedBytes = errb.data, errb.dropped > 0, errb.dropped
	return nil
}

// streamBuf collects chunks of one stream from offset 0. A jump in the
// offsets means the agent's buffer wrapped: what came before is dropped.
type streamBuf struct {
	data    []byte
	dropped int64
}

func (b *streamBuf) add(o backend.Output) {
	if next := b.dropped + int64(len(b.data)); o.Offset != next {
		b.data, b.dropped = b.data[:0], o.Offset
	}
	b.data = append(b.data, o.Data...)
}

// AttachProcess sends a background process's output from the requested
// offsets, live, and its exit as the last event. Cancelling the call
// detaches; the process runs on.
func (m *Manager) AttachProcess(ctx context.Context, req *warrenv1.AttachProcessRequest, send func(*warrenv1.ProcessEvent) error) (err error) {
	defer m.observe("AttachProcess", &err)
	p, err := m.process(ctx, opInspect, req.GetSandboxId(), req.GetProcessId())
	if err != nil {
		return err
	}
	off := func(o int64, name string) (int64, error) {
		if o < -1 {
			return 0, errdefs.Invalidf("%s %d: want an offset, or -1 to skip the stream", name, o)
		}
		return o, nil
	}
	outOff, err := off(req.GetStdoutOffset(), "stdout_offset")
	if err != nil {
		return err
	}
	errOff, err := off(req.GetStderrOffset(), "stderr_offset")
	if err != nil {
		return err
	}
	p.mu.Lock()
	lost := p.lost
	p.mu.Unlock()
	if lost {
		return sendExit(p, send)
	}
	a, err := p.host.AttachBackground(ctx, p.pid, outOff, errOff)
	if err != nil {
		return withCategory(err, errdefs.Unavailable, "attach to process "+p.id)
	}
	defer a.Close()
	for {
		o, err := a.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctxError(ctx, "attach to process "+p.id)
			}
			if p.exited() {
				return sendExit(p, send)
			}
			return withCategory(err, errdefs.Unavailable, "attach to process "+p.id)
		}
		var ev *warrenv1.ProcessEvent
		chunk := &warrenv1.OutputChunk{Offset: o.Offset, Data: o.Data}
		switch {
		case o.Exit != nil:
			// The watcher may not have recorded it yet.
			select {
			case <-p.done:
			case <-time.After(killWait):
			case <-ctx.Done():
				return ctxError(ctx, "attach to process "+p.id)
			}
			return sendExit(p, send)
		case o.Stderr:
			ev = &warrenv1.ProcessEvent{Event: &warrenv1.ProcessEvent_Stderr{Stderr: chunk}}
		default:
			ev = &warrenv1.ProcessEvent{Event: &warrenv1.ProcessEvent_Stdout{Stdout: chunk}}
		}
		if err := send(ev); err != nil {
			return withCategory(err, errdefs.Unavailable, "send process output")
		}
	}
}

func sendExit(p *process, send func(*warrenv1.ProcessEvent) error) error {
	if err := send(&warrenv1.ProcessEvent{Event: &warrenv1.ProcessEvent_Exit{Exit: p.result()}}); err != nil {
		return withCategory(err, errdefs.Unavailable, "send process exit")
	}
	return nil
}

// ResizeProcess sets the terminal size of a PTY process.
func (m *Manager) ResizeProcess(ctx context.Context, req *warrenv1.ResizeProcessRequest) (_ *warrenv1.ResizeProcessResponse, err error) {
	defer m.observe("ResizeProcess", &err)
	r, c := req.GetRows(), req.GetCols()
	if r == 0 || c == 0 || r > maxTermSize || c > maxTermSize {
		return nil, errdefs.Invalidf("terminal size %dx%d: rows and cols must be 1..%d", r, c, maxTermSize)
	}
	if ok, err := m.resizePTYExec(ctx, req.GetSandboxId(), req.GetProcessId(), uint16(r), uint16(c)); ok {
		if err != nil {
			return nil, err
		}
		return &warrenv1.ResizeProcessResponse{}, nil
	}
	p, err := m.process(ctx, opProcess, req.GetSandboxId(), req.GetProcessId())
	if err != nil {
		return nil, err
	}
	if !p.pty {
		return nil, errdefs.Invalidf("process %s of sandbox %s has no terminal (start it with pty)", p.id, p.sandbox)
	}
	if p.exited() {
		return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
	}
	if err := p.host.ResizeBackground(ctx, p.pid, uint16(r), uint16(c)); err != nil {
		if p.exited() || errdefs.CategoryOf(err) == errdefs.NotFound {
			return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
		}
		return nil, withCategory(err, errdefs.Internal, "resize terminal of process "+p.id)
	}
	return &warrenv1.ResizeProcessResponse{}, nil
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
	p, err := m.process(ctx, opProcess, req.GetSandboxId(), req.GetProcessId())
	if err != nil {
		return nil, err
	}
	if p.exited() {
		return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
	}
	if err := p.host.SignalBackground(ctx, p.pid, sig, req.GetGroup()); err != nil {
		if p.exited() || errors.Is(err, os.ErrProcessDone) {
			return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
		}
		return nil, withCategory(err, errdefs.Internal, "signal process "+p.id)
	}
	return &warrenv1.SignalProcessResponse{}, nil
}

// WriteStdin writes to a background process's stdin, and closes it when
// asked. Writes block while the process does not read, until the call
// is cancelled.
func (m *Manager) WriteStdin(ctx context.Context, req *warrenv1.WriteStdinRequest) (_ *warrenv1.WriteStdinResponse, err error) {
	defer m.observe("WriteStdin", &err)
	p, err := m.process(ctx, opProcess, req.GetSandboxId(), req.GetProcessId())
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
	if p.stdinClosed {
		return nil, errdefs.Conflictf("stdin of process %s of sandbox %s is closed", p.id, p.sandbox)
	}
	if data := req.GetData(); len(data) > 0 {
		w, err := p.openStdin(ctx)
		if err != nil {
			if p.exited() {
				return nil, errdefs.Conflictf("process %s of sandbox %s has exited", p.id, p.sandbox)
			}
			return nil, withCategory(err, errdefs.Internal, "open stdin of process "+p.id)
		}
		stop := context.AfterFunc(ctx, func() { _ = w.SetWriteDeadline(time.Now()) })
		_, err = w.Write(data)
		stop()
		_ = w.SetWriteDeadline(time.Time{})
		if err != nil {
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
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		if !p.pty {
			p.stdinClosed = true
		}
		if err := p.host.CloseStdin(ctx, p.pid); err != nil && !p.exited() {
			return nil, withCategory(err, errdefs.Internal, "close stdin of process "+p.id)
		}
	}
	return &warrenv1.WriteStdinResponse{}, nil
}

package daemon

import (
	"context"
	"slices"
	"sync"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Pausing in place (Pause, Resume and their by-label forms).
//
// PAUSED is persisted before the backend freezes the sandbox and RUNNING
// after it thaws it, so that a crash in between leaves a record that is
// PAUSED while the sandbox may run: Resume then thaws a sandbox that runs,
// which does nothing. The other order would leave a RUNNING record of a
// frozen sandbox, whose every call would hang.
//
// While a sandbox is PAUSED:
//   - its lifetime keeps counting: the lifecycle permits ExtendTimeout and
//     Delete in PAUSED, and a paused sandbox still holds the node's disk,
//     swap and the memory it could not give back, which is what the
//     lifetime bounds. Expiry deletes it as it would a running one; a
//     trainer that pauses for longer extends first. The exception is a
//     sandbox created with keep_while_paused (E2B's pause, which keeps a
//     paused sandbox until it is resumed): its lifetime stops when it
//     pauses or hibernates (stopLifetimeLocked: no deadline, the time it
//     had left kept) and counts again from Resume (restartLifetimeLocked).
//     Whoever sets it accepts that a frozen one holds the node until then.
//   - exec and process timeouts do not count: they bound how long a
//     command may run, and a frozen command does not run, so each is
//     pushed back by the time the sandbox spent paused (runTimer). A
//     command is never killed for time it spent frozen.
//   - the guards skip it: the containment poll and the disk guard look at
//     RUNNING sandboxes only, and a frozen sandbox can neither fill its
//     disk nor grow.
//   - calls that would reach its agent (exec, files, signals, stdin,
//     resize, the process list's byte counts) are refused or answered
//     without it: the agent is frozen too.

// Defaults and bounds of the by-label calls' parallelism. Each pause
// mostly waits on the kernel (freezer transitions, reclaim), so a few
// per core keep it busy without letting one batch starve other calls.
const (
	defaultByLabelParallelism = 8
	maxByLabelParallelism     = 64
)

// Pause freezes a RUNNING sandbox and, with reclaim, gives back its memory.
func (m *Manager) Pause(ctx context.Context, req *warrenv1.PauseRequest) (_ *warrenv1.PauseResponse, err error) {
	defer m.observe("Pause", &err)
	start := time.Now()
	s, v, err := m.live(ctx, opPause, req.GetId())
	if err != nil {
		return nil, err
	}
	p, ok := v.sb.(backend.Pauser)
	if !ok {
		return nil, errdefs.Unsupportedf("backend %s cannot pause sandboxes", v.backend)
	}
	s.mu.Lock()
	if err := s.mayStartLocked(opPause); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	now := time.Now()
	if err := m.setState(s, statePaused); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.info.PausedAtUnixMs = now.UnixMilli()
	restart := m.stopLifetimeLocked(s)
	if err := m.persist(s); err != nil {
		_ = m.setState(s, stateRunning)
		s.info.PausedAtUnixMs = 0
		restart()
		s.mu.Unlock()
		return nil, err
	}
	done := s.startPausingLocked()
	s.mu.Unlock()

	st, perr := p.Pause(ctx, req.GetReclaim())

	s.mu.Lock()
	defer s.mu.Unlock()
	s.endPausingLocked(done)
	if s.st != statePaused {
		// Deleted (or died) meanwhile: the deletion has it now.
		return nil, s.allowLocked(opPause)
	}
	if perr != nil {
		// The backend left it running: back to RUNNING.
		m.unpauseLocked(s)
		if err := m.persist(s); err != nil {
			m.log.Warn("persist running state after a failed pause", "sandbox", s.id, "err", err)
		}
		return nil, withCategory(perr, errdefs.Internal, "pause sandbox "+s.id)
	}
	total := time.Since(start)
	m.metrics.ObservePause(req.GetReclaim(), total, st.Before.Bytes-min(st.Before.Bytes, st.After.Bytes))
	m.log.Debug("sandbox paused", "sandbox", s.id, "reclaim", req.GetReclaim(), "before", st.Before.Bytes, "after", st.After.Bytes,
		"freeze", st.Freeze, "reclaim_took", st.Reclaim, "took", total)
	return &warrenv1.PauseResponse{
		Sandbox:   cloneSandbox(s.info),
		Before:    memoryProto(st.Before),
		After:     memoryProto(st.After),
		FreezeUs:  st.Freeze.Microseconds(),
		ReclaimUs: st.Reclaim.Microseconds(),
		TotalUs:   total.Microseconds(),
	}, nil
}

// Resume thaws a PAUSED sandbox.
func (m *Manager) Resume(ctx context.Context, req *warrenv1.ResumeRequest) (_ *warrenv1.ResumeResponse, err error) {
	defer m.observe("Resume", &err)
	start := time.Now()
	s, v, err := m.live(ctx, opResume, req.GetId())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	hibernated := s.st == stateHibernated
	s.mu.Unlock()
	if hibernated {
		return m.restoreHibernated(ctx, s, start, m.lazyPages(req.LazyPages))
	}
	p, ok := v.sb.(backend.Pauser)
	if !ok {
		// A LOST sandbox adopted back as PAUSED has a handle; one
		// without is not reachable now.
		if v.sb == nil {
			return nil, errdefs.Unavailablef("sandbox %s cannot be reached to resume it; retry later", req.GetId())
		}
		return nil, errdefs.Unsupportedf("backend %s cannot resume sandboxes", v.backend)
	}
	s.mu.Lock()
	if err := s.mayStartLocked(opResume); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	done := s.startPausingLocked()
	var limit *int64
	if mem := s.info.GetResources().GetMemoryBytes(); mem > 0 {
		limit = &mem
	}
	s.mu.Unlock()

	t0 := time.Now()
	rerr := p.Resume(ctx, backend.ResumeOptions{MemoryBytes: limit})
	thaw := time.Since(t0)

	s.mu.Lock()
	s.endPausingLocked(done)
	if s.st != statePaused {
		err := s.allowLocked(opResume)
		s.mu.Unlock()
		return nil, err
	}
	if rerr != nil {
		s.mu.Unlock()
		return nil, m.explain(opResume, s, rerr, "resume sandbox "+s.id)
	}
	paused := time.Since(time.UnixMilli(s.info.GetPausedAtUnixMs()))
	m.unpauseLocked(s)
	if err := m.persist(s); err != nil {
		// The sandbox runs: say so, and let the next change write it.
		m.log.Warn("persist running state after resume", "sandbox", s.id, "err", err)
	}
	adoptProcs := s.procsOnResume
	s.procsOnResume = false
	sb := s.sb
	out := &warrenv1.ResumeResponse{Sandbox: cloneSandbox(s.info), ThawUs: thaw.Microseconds(), PausedMs: paused.Milliseconds()}
	s.mu.Unlock()
	if adoptProcs {
		// Adopted while paused: its agent answers only now.
		m.adoptProcesses(s, sb)
	}
	m.metrics.ObserveResume(time.Since(start))
	m.log.Debug("sandbox resumed", "sandbox", s.id, "paused", paused, "thaw", thaw)
	return out, nil
}

// mayStartLocked is what a pause, resume, hibernation or fork checks before
// it starts: the lifecycle table permits o, and no other such call,
// commit or update holds the sandbox; s.mu held.
func (s *sandbox) mayStartLocked(o op) error {
	if err := s.allowLocked(o); err != nil {
		return err
	}
	return s.busyLocked()
}

// busyLocked refuses a pause or resume while another call holds the
// sandbox in a state it must not be frozen or thawed in: a commit (which
// thaws when it ends), an update (which may lower the memory limit the
// reclaim lowers too), or another pause or resume. s.mu held.
func (s *sandbox) busyLocked() error {
	switch {
	case s.pausing != nil:
		return errdefs.Conflictf("sandbox %s is being paused or resumed: retry once that call returned", s.id)
	case s.commit != nil:
		return errdefs.Conflictf("sandbox %s is being committed: retry once the commit returned", s.id)
	case s.updating:
		return errdefs.Conflictf("sandbox %s is being updated: retry once that call returned", s.id)
	}
	return nil
}

// startPausingLocked marks a Pause or Resume in progress; s.mu held.
func (s *sandbox) startPausingLocked() chan struct{} {
	s.pausing = make(chan struct{})
	return s.pausing
}

// endPausingLocked ends it and wakes a delete waiting for it; s.mu held.
func (s *sandbox) endPausingLocked(done chan struct{}) {
	s.pausing = nil
	close(done)
}

// unpauseLocked moves a PAUSED sandbox to RUNNING and adds the pause to
// its paused time; s.mu held.
func (m *Manager) unpauseLocked(s *sandbox) {
	s.info.PausedTotalMs = s.pausedTotalLocked().Milliseconds()
	s.info.PausedAtUnixMs = 0
	_ = m.setState(s, stateRunning)
	m.restartLifetimeLocked(s)
}

// lifetimeStoppedLocked: s is a keep_while_paused sandbox whose lifetime
// is stopped (it is PAUSED or HIBERNATED, or LOST while it was); s.mu
// held.
func (s *sandbox) lifetimeStoppedLocked() bool {
	return s.info.GetKeepWhilePaused() && s.info.GetExpiresAtUnixMs() == 0 &&
		(s.st == statePaused || s.st == stateHibernated || s.st == stateLost)
}

// stopLifetimeLocked stops the lifetime of a keep_while_paused sandbox
// that is pausing or hibernating: no deadline (expires_at 0, no timer),
// the time it had left kept in lifetime_left_ms. It returns what undoes
// it. s.mu held.
func (m *Manager) stopLifetimeLocked(s *sandbox) (undo func()) {
	exp := s.info.GetExpiresAtUnixMs()
	if !s.info.GetKeepWhilePaused() || exp == 0 {
		return func() {}
	}
	// At least a second back: a sandbox paused as its deadline came
	// must still answer the call that resumes it.
	left := max(time.Until(time.UnixMilli(exp)), time.Second)
	s.info.LifetimeLeftMs, s.info.ExpiresAtUnixMs = left.Milliseconds(), 0
	if s.timer != nil {
		s.timer.Stop()
	}
	return func() {
		s.info.LifetimeLeftMs, s.info.ExpiresAtUnixMs = 0, exp
		m.armTimerLocked(s, time.UnixMilli(exp))
	}
}

// restartLifetimeLocked lets the lifetime of a keep_while_paused sandbox
// count again as it runs again: the deadline is now plus the time it had
// left (or what ExtendTimeout set meanwhile). s.mu held.
func (m *Manager) restartLifetimeLocked(s *sandbox) {
	if !s.info.GetKeepWhilePaused() || s.info.GetExpiresAtUnixMs() != 0 {
		return
	}
	expires := time.Now().Add(time.Duration(s.info.GetLifetimeLeftMs()) * time.Millisecond)
	s.info.ExpiresAtUnixMs, s.info.LifetimeLeftMs = expires.UnixMilli(), 0
	m.armTimerLocked(s, expires)
}

// pausedTotalLocked is how long the sandbox has been paused in all, the
// current pause included; s.mu held.
func (s *sandbox) pausedTotalLocked() time.Duration {
	d := time.Duration(s.info.GetPausedTotalMs()) * time.Millisecond
	if (s.st == statePaused || s.st == stateHibernated) && s.info.GetPausedAtUnixMs() != 0 {
		d += time.Since(time.UnixMilli(s.info.GetPausedAtUnixMs()))
	}
	return d
}

func (s *sandbox) pausedTotal() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pausedTotalLocked()
}

// runTimer fires once the sandbox has run, not counting its pauses, for d
// from when it was made: the timeouts of execs and processes. Its channel
// may fire early (during or after a pause); expired says whether the time
// is really up, and re-arms it if not.
type runTimer struct {
	s       *sandbox
	start   time.Time
	d       time.Duration
	paused0 time.Duration
	t       *time.Timer
}

// newRunTimer starts a runTimer of d from start, nil for d <= 0. An
// adopted process passes paused0 = 0: pauses before it started then push
// its deadline back too, which errs on the side of not killing it.
func newRunTimer(s *sandbox, start time.Time, d, paused0 time.Duration) *runTimer {
	if d <= 0 {
		return nil
	}
	return &runTimer{s: s, start: start, d: d, paused0: paused0, t: time.NewTimer(time.Until(start.Add(d)))}
}

// C is nil for a nil timer: a select never picks it.
func (r *runTimer) C() <-chan time.Time {
	if r == nil {
		return nil
	}
	return r.t.C
}

func (r *runTimer) stop() {
	if r != nil {
		r.t.Stop()
	}
}

// expired reports whether d of running time has passed; if not, it
// re-arms the timer for what is left (from now, as if the rest ran).
func (r *runTimer) expired() bool {
	left := r.d - (time.Since(r.start) - (r.s.pausedTotal() - r.paused0))
	if left <= 0 {
		return true
	}
	r.t.Reset(left)
	return false
}

func memoryProto(u backend.MemoryUse) *warrenv1.Memory {
	return &warrenv1.Memory{Bytes: u.Bytes, File: u.File, Anon: u.Anon, Swap: u.Swap}
}

// PauseByLabel pauses the RUNNING sandboxes matching the labels.
func (m *Manager) PauseByLabel(ctx context.Context, req *warrenv1.PauseByLabelRequest, send func(*warrenv1.ByLabelEvent) error) (err error) {
	defer m.observe("PauseByLabel", &err)
	return m.byLabel(ctx, req.GetLabels(), req.GetParallelism(), []state{stateRunning}, send, func(ctx context.Context, id string, ev *warrenv1.ByLabelEvent) error {
		res, err := m.Pause(ctx, &warrenv1.PauseRequest{Id: id, Reclaim: req.GetReclaim()})
		ev.Paused = res
		return err
	})
}

// ResumeByLabel resumes the PAUSED and HIBERNATED sandboxes matching the
// labels.
func (m *Manager) ResumeByLabel(ctx context.Context, req *warrenv1.ResumeByLabelRequest, send func(*warrenv1.ByLabelEvent) error) (err error) {
	defer m.observe("ResumeByLabel", &err)
	return m.byLabel(ctx, req.GetLabels(), req.GetParallelism(), []state{statePaused, stateHibernated}, send, func(ctx context.Context, id string, ev *warrenv1.ByLabelEvent) error {
		res, err := m.Resume(ctx, &warrenv1.ResumeRequest{Id: id})
		ev.Resumed = res
		return err
	})
}

// byLabel runs do on every sandbox in one of the states sts whose labels include
// labels, parallelism at a time, and sends one event per sandbox as it
// finishes (in completion order) and a last one with the totals. The
// stream is the progress: a batch of hundreds of reclaiming pauses takes
// seconds, and a trainer wants to see (and act on) each outcome rather
// than wait blind for a list. A failed sandbox is an event, not the
// call's error; the call fails only on a bad request, a failed send or
// its context's end (sandboxes not started by then are not touched).
func (m *Manager) byLabel(ctx context.Context, labels map[string]string, parallelism int32, sts []state,
	send func(*warrenv1.ByLabelEvent) error, do func(context.Context, string, *warrenv1.ByLabelEvent) error) error {
	if len(labels) == 0 {
		return errdefs.Invalidf("labels are required: a call without would match every sandbox of the node")
	}
	if err := checkLabels(labels); err != nil {
		return err
	}
	switch {
	case parallelism < 0 || parallelism > maxByLabelParallelism:
		return errdefs.Invalidf("parallelism %d is out of range [0, %d]", parallelism, maxByLabelParallelism)
	case parallelism == 0:
		parallelism = defaultByLabelParallelism
	}
	var ids []string
	for _, s := range m.snapshot() {
		s.mu.Lock()
		if slices.Contains(sts, s.st) && labelsMatch(s.info.GetLabels(), labels) {
			ids = append(ids, s.id)
		}
		s.mu.Unlock()
	}
	total := int32(len(ids))
	work := make(chan string)
	results := make(chan *warrenv1.ByLabelEvent)
	var wg sync.WaitGroup
	for range min(int(parallelism), max(1, len(ids))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				ev := &warrenv1.ByLabelEvent{SandboxId: id}
				if err := do(ctx, id, ev); err != nil {
					ev.Error, ev.ErrorCode = err.Error(), errdefs.CategoryOf(err).String()
				}
				results <- ev
			}
		}()
	}
	go func() {
		defer close(work)
		for _, id := range ids {
			select {
			case work <- id:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		wg.Wait()
		close(results)
	}()
	var completed, failed int32
	var sendErr error
	for ev := range results {
		completed++
		if ev.Error != "" {
			failed++
		}
		ev.Completed, ev.Total = completed, total
		if sendErr == nil {
			sendErr = send(ev)
		}
	}
	if sendErr != nil {
		return withCategory(sendErr, errdefs.Unavailable, "send progress")
	}
	if err := ctx.Err(); err != nil && completed < total {
		return ctxError(ctx, "by-label call")
	}
	return send(&warrenv1.ByLabelEvent{Completed: completed, Total: total, Done: true, Failed: failed})
}

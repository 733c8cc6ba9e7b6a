package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/trajectory"
)

// DefaultTrajectoryMaxBytes caps one sandbox's trajectory log unless
// Config.TrajectoryMaxBytes says otherwise: 64 MiB holds ~1,000 execs that
// each print 64 KiB, or ~100,000 short ones.
const DefaultTrajectoryMaxBytes = 64 << 20

// trajDirName is the directory of the logs inside the state directory:
// <state>/trajectory/<sandbox id>.log.
const trajDirName = "trajectory"

// maxSessionID bounds a session id (it is in every entry).
const maxSessionID = 256

// trajLogs opens the sandboxes' logs lazily (on a sandbox's first
// recorded call after a start), so that adopting thousands of sandboxes
// reads none of them.
type trajLogs struct {
	dir      string
	maxBytes int64
	noSync   bool
	off      bool

	mu     sync.Mutex
	logs   map[string]*trajectory.Log
	closed bool
	// live counts the recorded calls in flight, so that closeAll lets
	// them record their outcomes (a daemon stopping kills its execs
	// promptly) instead of leaving their steps interrupted.
	live sync.WaitGroup
}

func newTrajLogs(cfg Config) (*trajLogs, error) {
	t := &trajLogs{dir: filepath.Join(cfg.StateDir, trajDirName), maxBytes: cfg.TrajectoryMaxBytes, noSync: cfg.TrajectoryNoSync, off: cfg.NoTrajectory, logs: map[string]*trajectory.Log{}}
	if t.maxBytes == 0 {
		t.maxBytes = DefaultTrajectoryMaxBytes
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "make trajectory log directory")
	}
	return t, nil
}

func (t *trajLogs) path(id string) string { return filepath.Join(t.dir, id+".log") }

// get returns the open log of s, opening it. A sandbox deleted meanwhile
// gets NotFound and leaves no file: remove runs after forget, and both
// hold t.mu.
func (t *trajLogs) get(s *sandbox) (*trajectory.Log, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.logs[s.id]; l != nil {
		return l, nil
	}
	l, err := trajectory.Open(t.path(s.id), trajectory.Options{MaxBytes: t.maxBytes, NoSync: t.noSync})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	gone := s.st == stateGone
	s.mu.Unlock()
	if gone {
		_ = l.Remove()
		return nil, errdefs.NotFoundf("sandbox %s not found", s.id)
	}
	t.logs[s.id] = l
	return l, nil
}

// sync makes a sandbox's recorded outcomes durable. With
// Config.TrajectoryNoSync, whatever saves a sandbox's state to disk
// (checkpoint, hibernate) must call it first, so that its log is as
// durable as the state it describes. A log not open has nothing unsynced
// from this daemon.
func (t *trajLogs) sync(id string) error {
	t.mu.Lock()
	l := t.logs[id]
	t.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Sync()
}

// remove deletes a sandbox's log, open or not.
func (t *trajLogs) remove(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.logs[id]
	delete(t.logs, id)
	if l != nil {
		return l.Remove()
	}
	if err := os.Remove(t.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errdefs.Wrap(errdefs.Internal, err, "remove trajectory log")
	}
	return nil
}

// sweep removes the logs of sandboxes that have no record (deleted while
// the daemon crashed between dropping the record and the log).
func (t *trajLogs) sweep(known func(id string) bool) error {
	ents, err := os.ReadDir(t.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".log")
		if ok && known(id) {
			continue
		}
		if err := os.Remove(filepath.Join(t.dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// bytes is the size of every log on disk, opened or not.
func (t *trajLogs) bytes() int64 {
	ents, err := os.ReadDir(t.dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// enter counts a recorded call in flight; false once closing.
func (t *trajLogs) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.live.Add(1)
	return true
}

// closeAll waits (a bounded time) for the recorded calls in flight, then
// closes every log.
func (t *trajLogs) closeAll() error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	done := make(chan struct{})
	go func() {
		t.live.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(killWait + 5*time.Second):
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for id, l := range t.logs {
		errs = append(errs, l.Close())
		delete(t.logs, id)
	}
	return errors.Join(errs...)
}

// step is a mutating call as the trajectory log sees it.
type step struct {
	sandbox string
	session string
	seq     uint64
	method  string
	req     proto.Message // hashed and recorded (payload as digest)
	// hash and hashNow: see trajectory.Call (uploads hash their body).
	hash    string
	hashNow func() (*trajectory.Late, error)
}

// stepOutcome is what a recorded call returns to its caller.
type stepOutcome struct {
	res      *warrenv1.ExecResult // exec: the result (a copy when replayed)
	seq      uint64               // 0: not recorded
	replayed bool
}

// runFunc runs a call live as step seq (0: unrecorded): its exec result
// (nil for others), whether it was refused before it changed anything,
// its error, and for uploads the request hash known only now.
type runFunc func(seq uint64) (res *warrenv1.ExecResult, notRun bool, late *trajectory.Late, err error)

// recorded runs a mutating call through its sandbox's trajectory log:
// the recorded outcome of its step when the log has it (the call does not
// run), else live, with the outcome on disk before it is returned.
func (m *Manager) recorded(ctx context.Context, st step, run runFunc) (stepOutcome, error) {
	if st.sandbox == "" {
		return stepOutcome{}, errdefs.Invalidf("sandbox id is required")
	}
	if len(st.session) > maxSessionID {
		return stepOutcome{}, errdefs.Invalidf("session_id longer than %d bytes", maxSessionID)
	}
	live := func() (stepOutcome, error) {
		res, _, _, err := run(0)
		return stepOutcome{res: res}, err
	}
	s, err := m.lookup(st.sandbox)
	if err != nil {
		return stepOutcome{}, err
	}
	s.mu.Lock()
	err = s.allowLocked(opInspect)
	off := m.traj.off || s.info.GetNoTrajectory()
	s.mu.Unlock()
	if err != nil {
		return stepOutcome{}, err
	}
	if off {
		if st.seq != 0 || st.session != "" {
			return stepOutcome{}, errdefs.Unsupportedf("sandbox %s records no trajectory log (node --no-trajectory or its no_trajectory): seq and session_id cannot be honoured", st.sandbox)
		}
		return live()
	}
	if !m.traj.enter() {
		return stepOutcome{}, errdefs.Unavailablef("daemon is shutting down")
	}
	defer m.traj.live.Done()
	log, err := m.traj.get(s)
	if err != nil {
		return stepOutcome{}, err
	}
	call := trajectory.Call{Session: st.session, Seq: st.seq, Hash: st.hash, HashNow: st.hashNow, Entry: trajectory.NewEntry(st.method, st.req)}
	if call.Hash == "" && call.HashNow == nil {
		call.Hash = trajectory.RequestHash(st.method, st.req)
	}
	out, err := log.Begin(ctx, call)
	if err != nil {
		if _, ok := errors.AsType[*trajectory.MismatchError](err); ok {
			m.metrics.TrajectoryMismatch()
		}
		return stepOutcome{}, err
	}
	switch {
	case out.Replay != nil:
		m.metrics.TrajectoryCall("replayed")
		e := out.Replay
		if err := trajectory.Err(e); err != nil {
			switch errdefs.CategoryOf(err) {
			case errdefs.Unavailable, errdefs.DeadlineExceeded, errdefs.Unknown:
				// Cut short after it started (cancelled, daemon stopping):
				// a retry would not make it run again, so say so rather
				// than invite one.
				return stepOutcome{}, errdefs.Conflictf("trajectory step %d of session %q was cut short after it started and is not run again (recorded: %v)", e.GetSeq(), e.GetSessionId(), err)
			}
			return stepOutcome{}, err
		}
		var res *warrenv1.ExecResult
		if e.GetExecResult() != nil {
			res = proto.Clone(e.GetExecResult()).(*warrenv1.ExecResult)
			res.Seq, res.Replayed = e.GetSeq(), true
		}
		return stepOutcome{res: res, seq: e.GetSeq(), replayed: true}, nil
	case out.Live == nil:
		m.metrics.TrajectoryCall("unrecorded")
		return live()
	}
	m.metrics.TrajectoryCall("live")
	res, notRun, late, err := run(out.Live.Seq())
	rec := res
	if res != nil {
		// A result already numbered is another step's (an idempotent
		// duplicate that waited for the first run): it keeps its number.
		if res.Seq == 0 {
			res.Seq = out.Live.Seq()
		}
		rec = proto.Clone(res).(*warrenv1.ExecResult)
	}
	if ferr := out.Live.Finish(rec, err, notRun, late); ferr != nil {
		if err != nil {
			return stepOutcome{}, err // the call's own failure says more
		}
		return stepOutcome{}, errdefs.Wrap(errdefs.Internal, ferr, "the call ran (step "+strconv.FormatUint(out.Live.Seq(), 10)+") but its outcome could not be recorded")
	}
	return stepOutcome{res: res, seq: out.Live.Seq()}, err
}

// ReadTrajectory returns a page of a sandbox's trajectory log.
func (m *Manager) ReadTrajectory(ctx context.Context, req *warrenv1.ReadTrajectoryRequest) (_ *warrenv1.ReadTrajectoryResponse, err error) {
	defer m.observe("ReadTrajectory", &err)
	size := int(req.GetPageSize())
	switch {
	case size < 0 || size > 1000:
		return nil, errdefs.Invalidf("page_size %d out of range (0-1000)", size)
	case size == 0:
		size = 100
	}
	var off int64
	if tok := req.GetPageToken(); tok != "" {
		off, err = strconv.ParseInt(tok, 10, 64)
		if err != nil || off < 0 {
			return nil, errdefs.Invalidf("bad page_token %q", tok)
		}
	}
	s, err := m.find(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	res := &warrenv1.ReadTrajectoryResponse{}
	if m.traj.off {
		return res, nil
	}
	log, err := m.traj.get(s)
	if err != nil {
		return nil, err
	}
	st := log.Stats()
	res.LogBytes, res.MaxBytes, res.Unrecorded = st.Bytes, st.MaxBytes, st.Unrecorded
	ents, next, err := log.Read(off, req.GetSessionId(), req.GetSessionId() == "", size)
	if err != nil {
		return nil, err
	}
	res.Entries = ents
	if next > 0 {
		res.NextPageToken = strconv.FormatInt(next, 10)
	}
	return res, nil
}

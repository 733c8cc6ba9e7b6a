// Package trajectory keeps a sandbox's trajectory log: every mutating call
// (exec, file write, mkdir, remove, upload) as a numbered step with its
// request, outcome and timing, so that a client resuming a rollout can
// re-send its calls and get the recorded outcomes back instead of running
// them again.
//
// # File format
//
// One append-only file per sandbox. Each record is a frame:
//
//	u32 little-endian length of body | u32 CRC-32C of body | body
//	body = kind byte ('B' begin, 'E' end) | TrajectoryEntry (protobuf)
//
// A live call writes a begin frame before it runs (no fsync: it survives a
// daemon crash in the page cache, and a machine crash takes the running
// sandbox along anyway) and an end frame with its outcome after it ran,
// which is on disk (fdatasync) before the outcome is returned. Concurrent
// end frames share one fdatasync (group commit). A step whose begin frame
// has no end frame was interrupted: the daemon stopped during the call,
// which may have had its effect, so it is neither replayed nor run again.
// A torn frame at the tail (a crash mid-write) is cut off at open.
//
// # Steps and sessions
//
// A step is (session id, seq). Calls without a seq take the next seq of
// their session (the highest recorded one plus one). A seq the log has is
// a replay: the request's canonical hash must equal the recorded one.
// Sequence numbers need not arrive in order: two calls with different
// seqs may run concurrently, and a call that arrives with the seq of one
// still running waits for its outcome and then replays it.
package trajectory

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

const (
	frameHeader = 8
	kindBegin   = 'B'
	kindEnd     = 'E'
	// maxFrame bounds one frame read back: a corrupt length must not make
	// the scan allocate gigabytes. An entry holds at most the two output
	// streams of an exec (each capped by the exec's output limit) plus a
	// request without its payload.
	maxFrame = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type stepState int

const (
	stepRunning     stepState = iota // begun, outcome not yet recorded
	stepDone                         // outcome recorded: replayed
	stepNotRun                       // refused before it ran: runs again
	stepInterrupted                  // begun by an earlier daemon, no outcome
)

type step struct {
	index    uint64
	hash     string
	state    stepState
	beginOff int64
	endOff   int64 // of the end frame (stepDone, stepNotRun)
	endLen   int
	done     chan struct{} // closed when a running step ends
}

type session struct {
	steps map[uint64]*step
	max   uint64
}

// Log is one sandbox's trajectory log. It is safe for concurrent use.
type Log struct {
	path     string
	maxBytes int64
	noSync   bool

	mu         sync.Mutex
	f          *os.File
	size       int64
	index      uint64 // of the last begin frame
	sessions   map[string]*session
	unrecorded uint64
	closed     bool

	sync groupSync
}

// Options configure a Log.
type Options struct {
	// MaxBytes caps the file (0: no cap): a call that would start past it
	// is refused (with a seq) or runs unrecorded (without one).
	MaxBytes int64
	// NoSync leaves outcomes in the page cache when Finish returns
	// (written, not fdatasync'ed): they survive a daemon crash, not a
	// machine crash. Sync makes them durable (before a checkpoint).
	NoSync bool
}

// Open opens (creating when needed) the log at path.
func Open(path string, o Options) (*Log, error) {
	maxBytes := o.MaxBytes
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "open trajectory log")
	}
	l := &Log{path: path, maxBytes: maxBytes, noSync: o.NoSync, f: f, sessions: map[string]*session{}}
	l.sync.f = f
	if err := l.load(); err != nil {
		_ = f.Close()
		return nil, err
	}
	return l, nil
}

// load scans the file and rebuilds the index; a torn tail is cut off.
func (l *Log) load() error {
	var off int64
	for {
		kind, e, n, err := readFrame(l.f, off)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			// A torn or corrupt frame ends the log: everything after it
			// was written after the last completed write.
			if terr := l.f.Truncate(off); terr != nil {
				return errdefs.Wrap(errdefs.Internal, terr, "cut torn trajectory log tail")
			}
			break
		}
		s := l.session(e.GetSessionId())
		st := s.steps[e.GetSeq()]
		switch kind {
		case kindBegin:
			if st == nil {
				st = &step{}
				s.steps[e.GetSeq()] = st
			}
			st.index, st.hash, st.state, st.beginOff = e.GetIndex(), e.GetRequestSha256(), stepInterrupted, off
			l.index = max(l.index, e.GetIndex())
		case kindEnd:
			if st == nil {
				st = &step{index: e.GetIndex()}
				s.steps[e.GetSeq()] = st
			}
			st.hash, st.endOff, st.endLen = e.GetRequestSha256(), off, n
			st.state = stepDone
			if e.GetNotRun() {
				st.state = stepNotRun
			}
		}
		s.max = max(s.max, e.GetSeq())
		off += int64(n)
	}
	l.size = off
	return nil
}

func (l *Log) session(id string) *session {
	s := l.sessions[id]
	if s == nil {
		s = &session{steps: map[uint64]*step{}}
		l.sessions[id] = s
	}
	return s
}

// readFrame reads the frame at off: its kind, entry and total length.
func readFrame(r io.ReaderAt, off int64) (byte, *warrenv1.TrajectoryEntry, int, error) {
	var hdr [frameHeader]byte
	if n, err := r.ReadAt(hdr[:], off); n < frameHeader {
		if n == 0 && errors.Is(err, io.EOF) {
			return 0, nil, 0, io.EOF
		}
		return 0, nil, 0, fmt.Errorf("short frame header at %d", off)
	}
	size := binary.LittleEndian.Uint32(hdr[0:4])
	if size < 1 || size > maxFrame {
		return 0, nil, 0, fmt.Errorf("bad frame length %d at %d", size, off)
	}
	body := make([]byte, size)
	if n, _ := r.ReadAt(body, off+frameHeader); n < int(size) {
		return 0, nil, 0, fmt.Errorf("short frame at %d", off)
	}
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
		return 0, nil, 0, fmt.Errorf("bad frame checksum at %d", off)
	}
	e := &warrenv1.TrajectoryEntry{}
	if err := proto.Unmarshal(body[1:], e); err != nil {
		return 0, nil, 0, fmt.Errorf("frame at %d: %w", off, err)
	}
	return body[0], e, frameHeader + int(size), nil
}

// appendLocked writes one frame and returns its offset and length.
func (l *Log) appendLocked(kind byte, e *warrenv1.TrajectoryEntry) (int64, int, error) {
	if l.closed {
		return 0, 0, errdefs.Unavailablef("trajectory log is closed")
	}
	body, err := proto.MarshalOptions{}.MarshalAppend([]byte{kind}, e)
	if err != nil {
		return 0, 0, errdefs.Wrap(errdefs.Internal, err, "encode trajectory entry")
	}
	buf := make([]byte, frameHeader, frameHeader+len(body))
	binary.LittleEndian.PutUint32(buf[0:4], uint32(len(body)))
	binary.LittleEndian.PutUint32(buf[4:8], crc32.Checksum(body, castagnoli))
	buf = append(buf, body...)
	off := l.size
	if _, err := l.f.WriteAt(buf, off); err != nil {
		// A partial frame is cut off at the next open; later frames
		// must not follow it.
		_ = l.f.Truncate(off)
		return 0, 0, errdefs.Wrap(errdefs.Internal, err, "write trajectory log")
	}
	l.size += int64(len(buf))
	return off, len(buf), nil
}

// Call describes a call to record or replay.
type Call struct {
	Session string
	Seq     uint64 // 0: the next of its session
	// Hash is the request's canonical hash (RequestHash). Empty when it is
	// known only once the call ran (an upload hashes its body while
	// extracting it): HashNow computes it for a replay instead.
	Hash    string
	HashNow func() (*Late, error)
	// Entry holds the request part (method, request, payload fields).
	Entry *warrenv1.TrajectoryEntry
}

// Outcome is what Begin decided.
type Outcome struct {
	// Replay is the recorded entry of the step (the call must not run).
	Replay *warrenv1.TrajectoryEntry
	// Live is set when the call must run: finish it with Finish. Nil with
	// Replay nil means the call runs unrecorded (the log is full and the
	// call has no seq).
	Live *Ticket
}

// Ticket is a live step being run.
type Ticket struct {
	l     *Log
	st    *step
	entry *warrenv1.TrajectoryEntry
	start time.Time
}

// Seq is the step's sequence number.
func (t *Ticket) Seq() uint64 { return t.entry.GetSeq() }

// Begin looks the call's step up: a recorded one is replayed (or a
// mismatch, or interrupted: FailedPrecondition); a new one is begun. A
// step still running is waited for (until ctx ends).
func (l *Log) Begin(ctx context.Context, c Call) (Outcome, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return Outcome{}, errdefs.Unavailablef("trajectory log is closed")
		}
		s := l.session(c.Session)
		seq := c.Seq
		if seq == 0 {
			seq = s.max + 1
		}
		st := s.steps[seq]
		if st == nil {
			out, err := l.beginLocked(c, s, seq)
			l.mu.Unlock()
			return out, err
		}
		switch st.state {
		case stepRunning:
			done := st.done
			l.mu.Unlock()
			select {
			case <-done:
			case <-ctx.Done():
				return Outcome{}, errdefs.Wrap(errdefs.DeadlineExceeded, ctx.Err(), fmt.Sprintf("wait for trajectory step %d of session %q, still running", seq, c.Session))
			}
			continue // look again: replay what it recorded
		case stepInterrupted:
			l.mu.Unlock()
			return Outcome{}, errdefs.Conflictf("trajectory step %d of session %q was started but its outcome was never recorded (the daemon stopped during the call): it may have run, so it is neither replayed nor run again", seq, c.Session)
		case stepNotRun:
			// Nothing ran: run it now, whatever the request.
			out, err := l.beginLocked(c, s, seq)
			l.mu.Unlock()
			return out, err
		}
		off, n, recHash := st.endOff, st.endLen, st.hash
		l.mu.Unlock()
		return l.replay(c, seq, off, n, recHash)
	}
}

// replay reads the recorded step and compares the request with it.
func (l *Log) replay(c Call, seq uint64, off int64, n int, recHash string) (Outcome, error) {
	_, rec, _, err := readFrame(l.f, off)
	if err != nil {
		return Outcome{}, errdefs.Wrap(errdefs.Internal, err, "read trajectory log")
	}
	h, entry := c.Hash, c.Entry
	if h == "" && c.HashNow != nil {
		late, err := c.HashNow()
		if err != nil {
			return Outcome{}, err
		}
		entry = proto.Clone(entry).(*warrenv1.TrajectoryEntry)
		h, entry.PayloadBytes, entry.PayloadSha256 = late.Hash, late.PayloadBytes, late.PayloadSha256
	}
	if h != recHash {
		return Outcome{}, errdefs.Wrap(errdefs.Conflict, &MismatchError{Session: c.Session, Seq: seq, Diff: Diff(rec, entry)}, "")
	}
	return Outcome{Replay: rec}, nil
}

// MismatchError is a replayed call whose request differs from the one
// its step recorded.
type MismatchError struct {
	Session string
	Seq     uint64
	Diff    string // what differs, field by field
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("trajectory step %d of session %q does not match the recorded request: %s", e.Seq, e.Session, e.Diff)
}

// beginLocked starts a live step.
func (l *Log) beginLocked(c Call, s *session, seq uint64) (Outcome, error) {
	if l.maxBytes > 0 && l.size >= l.maxBytes {
		if c.Seq == 0 {
			l.unrecorded++
			return Outcome{}, nil
		}
		return Outcome{}, errdefs.Exhaustedf("the sandbox's trajectory log is full (%d bytes, cap %d): step %d of session %q cannot be recorded, so it is not run", l.size, l.maxBytes, seq, c.Session)
	}
	e := proto.Clone(c.Entry).(*warrenv1.TrajectoryEntry)
	l.index++
	now := time.Now()
	e.Index, e.SessionId, e.Seq, e.RequestSha256, e.StartedUnixMs = l.index, c.Session, seq, c.Hash, now.UnixMilli()
	off, _, err := l.appendLocked(kindBegin, e)
	if err != nil {
		l.index--
		return Outcome{}, err
	}
	// A not-run step is superseded: its entry stays in the file, the index
	// points at the new one.
	st := &step{index: e.Index, hash: c.Hash, state: stepRunning, beginOff: off, done: make(chan struct{})}
	s.steps[seq] = st
	s.max = max(s.max, seq)
	return Outcome{Live: &Ticket{l: l, st: st, entry: e, start: now}}, nil
}

// Late is what a call learns of its own request only as it runs: an
// upload's hash and payload digest, read while its body is extracted.
type Late struct {
	Hash          string
	PayloadBytes  int64
	PayloadSha256 string
}

// Finish records the live step's outcome and returns once it is on disk.
// res is the exec result (nil for other calls); callErr the call's error;
// notRun tells the call was refused before it changed anything. late
// completes the request when Begin had no hash (nil otherwise).
func (t *Ticket) Finish(res *warrenv1.ExecResult, callErr error, notRun bool, late *Late) error {
	e := t.entry
	if late != nil {
		e.RequestSha256, e.PayloadBytes, e.PayloadSha256 = late.Hash, late.PayloadBytes, late.PayloadSha256
	}
	e.ExecResult = res
	e.NotRun = notRun
	e.DurationUs = time.Since(t.start).Microseconds()
	if callErr != nil {
		e.ErrorCategory, e.Error = categoryName(callErr), callErr.Error()
	}
	l := t.l
	l.mu.Lock()
	off, n, err := l.appendLocked(kindEnd, e)
	st := t.st
	if err == nil {
		st.hash, st.endOff, st.endLen = e.RequestSha256, off, n
		st.state = stepDone
		if notRun {
			st.state = stepNotRun
		}
	} else {
		// Nothing recorded: a later call with this seq must not guess.
		st.state = stepInterrupted
	}
	close(st.done)
	l.mu.Unlock()
	if err != nil || l.noSync {
		return err
	}
	return l.sync.sync()
}

// Sync makes every outcome recorded so far durable.
func (l *Log) Sync() error { return l.sync.sync() }

// Abandon ends a live step that never started and must leave no trace in
// the outcome (used when the call failed before it reached the sandbox):
// it is recorded as not run.
func (t *Ticket) Abandon(callErr error) error { return t.Finish(nil, callErr, true, nil) }

// Stats are a log's size and counts.
type Stats struct {
	Bytes, MaxBytes int64
	Unrecorded      uint64
}

// Stats returns the log's size, cap and unrecorded calls.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Bytes: l.size, MaxBytes: l.maxBytes, Unrecorded: l.unrecorded}
}

// Read returns up to limit entries from file offset off, of session (""
// every session), and the offset to continue from (0 at the end): end
// frames as recorded, and begin frames of interrupted steps where they
// were begun.
func (l *Log) Read(off int64, session string, all bool, limit int) ([]*warrenv1.TrajectoryEntry, int64, error) {
	l.mu.Lock()
	size := l.size
	// Begin frames are listed only for interrupted steps; the others are
	// skipped unread.
	interrupted := map[int64]bool{}
	for _, sess := range l.sessions {
		for _, st := range sess.steps {
			if st.state == stepInterrupted {
				interrupted[st.beginOff] = true
			}
		}
	}
	l.mu.Unlock()
	// One sequential buffered read instead of a pread per frame.
	r := bufio.NewReaderSize(io.NewSectionReader(l.f, off, size-off), 256<<10)
	var out []*warrenv1.TrajectoryEntry
	var hdr [frameHeader + 1]byte
	for off < size {
		if len(out) >= limit {
			return out, off, nil
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, 0, errdefs.Wrap(errdefs.Internal, err, "read trajectory log")
		}
		n := binary.LittleEndian.Uint32(hdr[0:4])
		if n < 1 || n > maxFrame {
			return nil, 0, errdefs.Internalf("read trajectory log: bad frame length %d at %d", n, off)
		}
		frame := int64(frameHeader) + int64(n)
		if hdr[frameHeader] == kindBegin && !interrupted[off] {
			if _, err := r.Discard(int(n) - 1); err != nil {
				return nil, 0, errdefs.Wrap(errdefs.Internal, err, "read trajectory log")
			}
			off += frame
			continue
		}
		body := make([]byte, n)
		body[0] = hdr[frameHeader]
		if _, err := io.ReadFull(r, body[1:]); err != nil {
			return nil, 0, errdefs.Wrap(errdefs.Internal, err, "read trajectory log")
		}
		if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
			return nil, 0, errdefs.Internalf("read trajectory log: bad frame checksum at %d", off)
		}
		e := &warrenv1.TrajectoryEntry{}
		if err := proto.Unmarshal(body[1:], e); err != nil {
			return nil, 0, errdefs.Wrap(errdefs.Internal, err, "read trajectory log")
		}
		if body[0] == kindBegin {
			e.Interrupted = true
		}
		if all || e.GetSessionId() == session {
			out = append(out, e)
		}
		off += frame
	}
	return out, 0, nil
}

// Close closes the file; calls in flight fail to record.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	return l.f.Close()
}

// Remove closes and deletes the log.
func (l *Log) Remove() error {
	_ = l.Close()
	if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errdefs.Wrap(errdefs.Internal, err, "remove trajectory log")
	}
	return nil
}

// groupSync coalesces the fdatasyncs of concurrent appends: a caller
// whose write an fdatasync that started after it covers waits for that
// one instead of issuing its own.
type groupSync struct {
	f       *os.File
	mu      sync.Mutex
	cond    *sync.Cond
	gen     uint64 // writes asked to be synced
	synced  uint64
	syncing bool
	// errGen is the gen up to which the last failed fdatasync was meant
	// to sync: its waiters get err.
	errGen uint64
	err    error
}

func (g *groupSync) sync() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cond == nil {
		g.cond = sync.NewCond(&g.mu)
	}
	g.gen++
	mine := g.gen
	for g.synced < mine {
		if g.err != nil && mine <= g.errGen {
			return errdefs.Wrap(errdefs.Internal, g.err, "sync trajectory log")
		}
		if g.syncing {
			g.cond.Wait()
			continue
		}
		g.syncing = true
		target := g.gen
		g.mu.Unlock()
		err := fdatasync(g.f)
		g.mu.Lock()
		g.syncing = false
		if err != nil {
			g.err, g.errGen = err, target
		} else {
			g.synced = target
		}
		g.cond.Broadcast()
	}
	return nil
}

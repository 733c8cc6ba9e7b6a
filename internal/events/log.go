package events

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unicode/utf8"
)

// Defaults of Options.
const (
	// DefaultMaxFileBytes caps the audit file; with its one rotated
	// predecessor the log takes at most twice that. At ~250 bytes an
	// event, 16 MiB is ~65,000 events, and reading both files back at
	// start takes well under a second.
	DefaultMaxFileBytes = 16 << 20
	// DefaultPerSandbox bounds each sandbox's ring: 3,200 sandboxes that
	// all filled theirs hold ~800,000 events (~200 MB at most, with
	// details at their cap; ~60 MB typically).
	DefaultPerSandbox = 256
	// DefaultRate and DefaultBurst bound how fast one sandbox's events
	// enter the ring and the file: an agent that hits its output cap in
	// a loop must not rotate its neighbours' events out of the audit
	// file. Events over the rate are counted (metrics, Suppressed).
	DefaultRate  = 20.0
	DefaultBurst = 200
)

// File names in Options.Dir.
const (
	FileName    = "events.log"
	OldFileName = "events.log.1"
)

// Options configure a Log.
type Options struct {
	// Dir holds the audit file; "" keeps events in memory only.
	Dir          string
	MaxFileBytes int64
	PerSandbox   int
	Rate         float64 // events per second per sandbox
	Burst        int
	// Count is called for every event recorded, suppressed ones too,
	// with the occurrences it stands for (the node's metric by kind).
	// Nil: not counted.
	Count  func(k Kind, n uint64)
	Logger *slog.Logger
	Now    func() time.Time // tests
}

func (o *Options) setDefaults() {
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.PerSandbox <= 0 {
		o.PerSandbox = DefaultPerSandbox
	}
	if o.Rate <= 0 {
		o.Rate = DefaultRate
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Log is the node's event log. It is safe for concurrent use.
type Log struct {
	opts Options

	mu       sync.Mutex
	rings    map[string]*ring
	f        *os.File // nil: no file, or it failed
	size     int64
	failures int // file errors so far (logged the first time)
}

// record is one line of the audit file: an event, or a marker that the
// sandbox was deleted (so that a later sandbox of the same id does not
// inherit its events when the file is read back).
type record struct {
	Event
	Deleted bool `json:"deleted,omitempty"`
}

// Open reads back the audit files in opts.Dir (the rotated one first)
// into the rings, and opens the current one to append to. Lines it cannot
// parse (a line torn by a crash) are skipped.
func Open(opts Options) (*Log, error) {
	opts.setDefaults()
	l := &Log{opts: opts, rings: map[string]*ring{}}
	if opts.Dir == "" {
		return l, nil
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	for _, name := range []string{OldFileName, FileName} {
		if err := l.load(filepath.Join(opts.Dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	if err := l.openFile(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) load(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r record
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.Sandbox == "" {
			continue
		}
		if r.Deleted {
			delete(l.rings, r.Sandbox)
			continue
		}
		rg := l.ringOf(r.Sandbox)
		rg.push(r.Event)
		rg.seq = max(rg.seq, r.Seq)
	}
	return sc.Err()
}

// openFile opens the current file for appending; a last line torn by a
// crash gets its newline, so the next event starts a line of its own.
func (l *Log) openFile() error {
	f, err := os.OpenFile(filepath.Join(l.opts.Dir, FileName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, fi.Size()
	if l.size > 0 && !endsWithNewline(f.Name(), l.size) {
		n, _ := f.Write([]byte{'\n'})
		l.size += int64(n)
	}
	return nil
}

func endsWithNewline(path string, size int64) bool {
	f, err := os.Open(path)
	if err != nil {
		return true
	}
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, size-1)
	return err != nil || b[0] == '\n'
}

// Close closes the audit file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Record adds e to its sandbox's ring and the audit file, unless the
// sandbox is over its rate, and counts it either way.
func (l *Log) Record(e Event) {
	if e.Sandbox == "" || e.Kind == "" {
		return
	}
	if e.Count == 0 {
		e.Count = 1
	}
	if l.opts.Count != nil {
		l.opts.Count(e.Kind, e.Count)
	}
	if e.Time.IsZero() {
		e.Time = l.opts.Now()
	}
	e.Detail = truncate(e.Detail, MaxDetail)
	l.mu.Lock()
	defer l.mu.Unlock()
	rg := l.ringOf(e.Sandbox)
	if !rg.allow(e.Time, l.opts.Rate, float64(l.opts.Burst)) {
		rg.suppressed++
		return
	}
	rg.seq++
	e.Seq = rg.seq
	e.Suppressed, rg.suppressed = rg.suppressed, 0
	rg.push(e)
	l.appendLocked(record{Event: e})
}

// Forget drops a deleted sandbox's ring. Its events stay in the audit
// file, followed by a marker, so that a sandbox created later with the
// same id starts with none.
func (l *Log) Forget(sandbox string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.rings[sandbox]; !ok {
		return
	}
	delete(l.rings, sandbox)
	l.appendLocked(record{Event: Event{Time: l.opts.Now(), Sandbox: sandbox}, Deleted: true})
}

// Retain drops the rings of sandboxes keep does not name (read back from
// the file for sandboxes that went while no daemon ran).
func (l *Log) Retain(keep func(id string) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.rings {
		if !keep(id) {
			delete(l.rings, id)
		}
	}
}

// Page is one page of a sandbox's events, oldest first.
type Page struct {
	Events []Event
	// Next is the Seq to pass as after for the next page; 0 when this
	// page reached the newest event.
	Next uint64
	// Suppressed counts the sandbox's events the rate limit left out.
	Suppressed uint64
}

// List returns up to limit events of sandbox with Seq > after.
func (l *Log) List(sandbox string, after uint64, limit int) Page {
	l.mu.Lock()
	defer l.mu.Unlock()
	rg := l.rings[sandbox]
	if rg == nil {
		return Page{}
	}
	p := Page{Suppressed: rg.totalSuppressed + rg.suppressed}
	for i := 0; i < rg.n; i++ {
		e := rg.at(i)
		if e.Seq <= after {
			continue
		}
		if len(p.Events) == limit {
			p.Next = p.Events[len(p.Events)-1].Seq
			break
		}
		p.Events = append(p.Events, e)
	}
	return p
}

// appendLocked writes one line, rotating the file first when the line
// would take it past the cap. A failing file is logged once and skipped:
// the events stay in the rings and the metrics.
func (l *Log) appendLocked(r record) {
	if l.f == nil {
		return
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	b = append(b, '\n')
	if l.size > 0 && l.size+int64(len(b)) > l.opts.MaxFileBytes {
		if err := l.rotateLocked(); err != nil {
			l.fail(err)
			return
		}
	}
	n, err := l.f.Write(b)
	l.size += int64(n)
	if err != nil {
		l.fail(err)
	}
}

func (l *Log) rotateLocked() error {
	cur := filepath.Join(l.opts.Dir, FileName)
	if err := l.f.Close(); err != nil {
		l.f = nil
		return err
	}
	l.f = nil
	if err := os.Rename(cur, filepath.Join(l.opts.Dir, OldFileName)); err != nil {
		return err
	}
	return l.openFile()
}

func (l *Log) fail(err error) {
	l.failures++
	if l.failures == 1 {
		l.opts.Logger.Error("security event audit file", "dir", l.opts.Dir, "err", err)
	}
}

func (l *Log) ringOf(sandbox string) *ring {
	rg := l.rings[sandbox]
	if rg == nil {
		rg = &ring{cap: l.opts.PerSandbox, tokens: float64(l.opts.Burst)}
		l.rings[sandbox] = rg
	}
	return rg
}

// ring keeps one sandbox's latest events and its rate limiter (a token
// bucket).
type ring struct {
	buf        []Event // grows to cap, then wraps
	cap        int
	start, n   int
	seq        uint64 // the last Seq given
	tokens     float64
	last       time.Time
	suppressed uint64 // since the last event kept
	// totalSuppressed counts those already reported in an event.
	totalSuppressed uint64
}

func (r *ring) push(e Event) {
	r.totalSuppressed += e.Suppressed
	if len(r.buf) < r.cap {
		r.buf = append(r.buf, e)
		r.n++
		return
	}
	r.buf[r.start] = e
	r.start = (r.start + 1) % r.cap
}

func (r *ring) at(i int) Event { return r.buf[(r.start+i)%len(r.buf)] }

func (r *ring) allow(now time.Time, rate, burst float64) bool {
	if now.After(r.last) {
		if !r.last.IsZero() {
			r.tokens = min(burst, r.tokens+now.Sub(r.last).Seconds()*rate)
		}
		r.last = now
	}
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	return true
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-3]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

var _ Recorder = (*Log)(nil)
var _ io.Closer = (*Log)(nil)

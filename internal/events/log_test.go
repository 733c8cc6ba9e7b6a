package events

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// clock is a settable time for the rate limiter.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func open(t *testing.T, o Options) *Log {
	t.Helper()
	l, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// The ring keeps the latest PerSandbox events of each sandbox, numbered
// from 1, and pages through them after a given Seq.
func TestRingAndPages(t *testing.T) {
	l := open(t, Options{PerSandbox: 4})
	for i := 0; i < 6; i++ {
		l.Record(Event{Sandbox: "a", Kind: OOMKill, Detail: "x"})
	}
	l.Record(Event{Sandbox: "b", Kind: PidsLimit})
	p := l.List("a", 0, 3)
	if len(p.Events) != 3 || p.Events[0].Seq != 3 || p.Next != 5 {
		t.Fatalf("first page: %+v", p)
	}
	p = l.List("a", p.Next, 3)
	if len(p.Events) != 1 || p.Events[0].Seq != 6 || p.Next != 0 {
		t.Fatalf("second page: %+v", p)
	}
	if p := l.List("b", 0, 10); len(p.Events) != 1 || p.Events[0].Count != 1 || p.Events[0].Time.IsZero() {
		t.Fatalf("b: %+v", p)
	}
	if p := l.List("c", 0, 10); len(p.Events) != 0 {
		t.Fatalf("c: %+v", p)
	}
}

// One sandbox over its rate cannot push events into the file and the
// ring: the excess is counted, reported on its next kept event, and the
// metric still counts every one.
func TestRateLimit(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	counted := 0
	l := open(t, Options{Rate: 1, Burst: 2, Now: c.now, Count: func(_ Kind, n uint64) { counted += int(n) }})
	for i := 0; i < 5; i++ {
		l.Record(Event{Sandbox: "a", Kind: OutputCap})
	}
	c.t = c.t.Add(time.Second)
	l.Record(Event{Sandbox: "a", Kind: OutputCap})
	p := l.List("a", 0, 10)
	if len(p.Events) != 3 || p.Events[2].Suppressed != 3 || p.Suppressed != 3 || counted != 6 {
		t.Fatalf("events %+v suppressed %d counted %d", p.Events, p.Suppressed, counted)
	}
}

// The audit file survives a restart: a new Log lists what the old one
// recorded and numbers on from there; a deleted sandbox's events are not
// inherited by a later one of the same id; a torn last line is skipped.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	l := open(t, Options{Dir: dir})
	l.Record(Event{Sandbox: "a", Kind: OOMKill, Detail: "first"})
	l.Record(Event{Sandbox: "gone", Kind: DiskFull})
	l.Forget("gone")
	l.Close()
	f, _ := os.OpenFile(filepath.Join(dir, FileName), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":9,"sandbox":"a","ki`)
	f.Close()

	l2 := open(t, Options{Dir: dir})
	l2.Record(Event{Sandbox: "a", Kind: Timeout})
	l2.Record(Event{Sandbox: "gone", Kind: PidsLimit})
	p := l2.List("a", 0, 10)
	if len(p.Events) != 2 || p.Events[0].Detail != "first" || p.Events[1].Seq != 2 {
		t.Fatalf("a after reopen: %+v", p.Events)
	}
	if p := l2.List("gone", 0, 10); len(p.Events) != 1 || p.Events[0].Seq != 1 {
		t.Fatalf("a new sandbox of a deleted id: %+v", p.Events)
	}
	l2.Close()
	b, _ := os.ReadFile(filepath.Join(dir, FileName))
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n")[4:] {
		if !strings.HasPrefix(line, `{"seq":`) {
			t.Fatalf("line after the torn one: %q", line)
		}
	}
}

// The file rotates at its cap: at most two files, the newest events
// kept, the older file read back first.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	l := open(t, Options{Dir: dir, MaxFileBytes: 1000, Rate: 1e9, Burst: 1e9})
	for i := 0; i < 40; i++ {
		l.Record(Event{Sandbox: "a", Kind: OutputCap, Detail: strings.Repeat("d", 50)})
	}
	l.Close()
	for _, n := range []string{FileName, OldFileName} {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil || fi.Size() > 1000 {
			t.Fatalf("%s: %v %v", n, fi, err)
		}
	}
	l2 := open(t, Options{Dir: dir})
	p := l2.List("a", 0, 100)
	if len(p.Events) == 0 || p.Events[len(p.Events)-1].Seq != 40 || len(p.Events) > 20 {
		t.Fatalf("after rotation: %d events, last %+v", len(p.Events), p.Events[len(p.Events)-1])
	}
	for i := 1; i < len(p.Events); i++ {
		if p.Events[i].Seq != p.Events[i-1].Seq+1 {
			t.Fatalf("out of order: %d after %d", p.Events[i].Seq, p.Events[i-1].Seq)
		}
	}
}

func TestDetailCut(t *testing.T) {
	l := open(t, Options{})
	l.Record(Event{Sandbox: "a", Kind: Timeout, Detail: strings.Repeat("é", MaxDetail)})
	d := l.List("a", 0, 1).Events[0].Detail
	if len(d) > MaxDetail || !strings.HasSuffix(d, "...") {
		t.Fatalf("detail of %d bytes", len(d))
	}
}

package daemon

import (
	"strconv"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/events"
)

// eventsOf lists every event of a sandbox, page by page.
func (e *env) eventsOf(id string) []*warrenv1.SecurityEvent {
	e.t.Helper()
	var out []*warrenv1.SecurityEvent
	token := ""
	for {
		res, err := e.m.ListSandboxEvents(ctxT(e.t), &warrenv1.ListSandboxEventsRequest{SandboxId: id, PageSize: 2, PageToken: token})
		if err != nil {
			e.t.Fatalf("list events of %s: %v", id, err)
		}
		out = append(out, res.GetEvents()...)
		if token = res.GetNextPageToken(); token == "" {
			return out
		}
	}
}

// eventOf returns the first event of kind, or nil.
func eventOf(evs []*warrenv1.SecurityEvent, kind events.Kind) *warrenv1.SecurityEvent {
	for _, ev := range evs {
		if ev.GetKind() == string(kind) {
			return ev
		}
	}
	return nil
}

// TestExecEventsAreListedWhenTheExecReturns: an exec's output past its
// cap, its timeout kill and its OOM kill are events of its sandbox by the
// time the exec returns, naming the exec's pid; the node's metric counts
// them by kind.
func TestExecEventsAreListedWhenTheExecReturns(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "ev", Resources: &warrenv1.Resources{MemoryBytes: 32 << 20}})
	if evs := e.eventsOf("ev"); len(evs) != 0 {
		t.Fatalf("a new sandbox has events: %v", evs)
	}
	out := e.exec(&warrenv1.ExecRequest{SandboxId: "ev", Shell: "head -c 5000 /dev/zero", OutputLimitBytes: 1000})
	slow := e.exec(&warrenv1.ExecRequest{SandboxId: "ev", Argv: []string{"sleep", "10"}, TimeoutMs: 100})
	oom := e.sh("ev", "dd if=/dev/zero of=/dev/null bs=256M count=1")
	if !oom.GetOomKilled() || !slow.GetTimedOut() || out.GetStdoutDroppedBytes() != 4000 {
		t.Fatalf("setup: %v / %v / %v", oom, slow, out)
	}
	evs := e.eventsOf("ev")
	for _, c := range []struct {
		kind   events.Kind
		pid    int32
		detail string
	}{
		{events.OutputCap, out.GetPid(), "wrote 4000 bytes to stdout past its output limit of 1000 bytes"},
		{events.Timeout, slow.GetPid(), `"sleep 10" killed after its timeout of 100ms`},
		{events.OOMKill, oom.GetPid(), "killed by the OOM killer at the memory limit of 32 MiB"},
	} {
		ev := eventOf(evs, c.kind)
		if ev == nil || !strings.Contains(ev.GetDetail(), c.detail) || ev.GetProcess() != "pid "+strconv.Itoa(int(c.pid)) || ev.GetTimeUnixMs() == 0 {
			t.Errorf("%s event: %v (all: %v)", c.kind, ev, evs)
		}
	}
	for i, ev := range evs {
		if ev.GetSeq() != uint64(i+1) {
			t.Errorf("event %d has seq %d", i, ev.GetSeq())
		}
	}
	for _, k := range []events.Kind{events.OutputCap, events.Timeout, events.OOMKill} {
		if v := metricValue(t, e.metrics.SecurityEvents.WithLabelValues(string(k))); v < 1 {
			t.Errorf("warren_security_events_total{kind=%q} = %v", k, v)
		}
	}
}

// TestKernelContainmentIsPolled: what the kernel contains outside any
// exec (a background process's forks refused at the pids limit) and a
// background process's timeout and output past its cap become events
// without anyone asking; they survive a daemon restart, which numbers on
// from them; a deleted sandbox's events are gone with it (not_found),
// and a new sandbox of the same id starts with none.
func TestKernelContainmentIsPolled(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.GuardInterval = 50 * time.Millisecond })
	e.create(&warrenv1.CreateRequest{Id: "bg", Resources: &warrenv1.Resources{PidsMax: 10}})
	ctx := ctxT(t)
	start := func(req *warrenv1.ExecRequest) *warrenv1.ProcessInfo {
		req.SandboxId = "bg"
		p, err := e.m.StartProcess(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	loud := start(&warrenv1.ExecRequest{Shell: "head -c 300000 /dev/zero", OutputLimitBytes: 100000})
	slow := start(&warrenv1.ExecRequest{Argv: []string{"sleep", "10"}, TimeoutMs: 100})
	// Last, and it kills what it forked: at the limit, nothing else starts.
	start(&warrenv1.ExecRequest{Shell: "for i in $(seq 20); do sleep 5 & done 2>/dev/null; kill $(jobs -p); exit 0"})
	eventually(t, 10*time.Second, "the three events", func() bool {
		evs := e.eventsOf("bg")
		return eventOf(evs, events.PidsLimit) != nil && eventOf(evs, events.OutputCap) != nil && eventOf(evs, events.Timeout) != nil
	})
	evs := e.eventsOf("bg")
	if ev := eventOf(evs, events.PidsLimit); !strings.Contains(ev.GetDetail(), "refused at the pids limit of 10") {
		t.Errorf("pids event: %v", ev)
	}
	if ev := eventOf(evs, events.OutputCap); ev.GetProcess() != loud.GetProcessId() || !strings.Contains(ev.GetDetail(), "the oldest 200000") {
		t.Errorf("output event: %v", ev)
	}
	if ev := eventOf(evs, events.Timeout); ev.GetProcess() != slow.GetProcessId() {
		t.Errorf("timeout event: %v", ev)
	}

	e.stop()
	e.start()
	again := e.eventsOf("bg")
	if len(again) != len(evs) {
		t.Fatalf("after a restart: %d events, before %d", len(again), len(evs))
	}
	e.exec(&warrenv1.ExecRequest{SandboxId: "bg", Shell: "head -c 10 /dev/zero", OutputLimitBytes: 1})
	if after := e.eventsOf("bg"); len(after) != len(evs)+1 || after[len(after)-1].GetSeq() != uint64(len(evs)+1) {
		t.Fatalf("numbering after a restart: %v", after)
	}

	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "bg"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.ListSandboxEvents(ctx, &warrenv1.ListSandboxEventsRequest{SandboxId: "bg"})
	wantCat(t, err, errdefs.NotFound, "bg")
	e.create(&warrenv1.CreateRequest{Id: "bg"})
	if evs := e.eventsOf("bg"); len(evs) != 0 {
		t.Fatalf("a new sandbox of a deleted one's id inherits its events: %v", evs)
	}
	_, err = e.m.ListSandboxEvents(ctx, &warrenv1.ListSandboxEventsRequest{SandboxId: "bg", PageToken: "x"})
	wantCat(t, err, errdefs.Invalid, "page_token")
}

// A counter's rise is one delta with the rise; a disk is full once below
// 1% or 2 MiB free and full again only after it had twice that free.
func TestContainDelta(t *testing.T) {
	var c containSeen
	disk := func(free uint64) *backend.DiskUse {
		return &backend.DiskUse{Bytes: 100 << 20, FreeBytes: free, Inodes: 1000, FreeInodes: 500}
	}
	steps := []struct {
		now  backend.Contained
		want containDelta
	}{
		{backend.Contained{OOMKills: 2, PidsRefused: 5, Disk: disk(50 << 20)}, containDelta{oom: 2, pids: 5}},
		{backend.Contained{OOMKills: 2, PidsRefused: 9, Disk: disk(1 << 20)}, containDelta{pids: 4, diskFull: true}},
		{backend.Contained{OOMKills: 2, PidsRefused: 9, Disk: disk(3 << 20)}, containDelta{}}, // still full: under 4 MiB
		{backend.Contained{OOMKills: 2, PidsRefused: 9, Disk: disk(1 << 20)}, containDelta{}},
		{backend.Contained{OOMKills: 2, PidsRefused: 9, Disk: disk(5 << 20)}, containDelta{}}, // rearmed
		{backend.Contained{OOMKills: 3, PidsRefused: 9, Disk: disk(0)}, containDelta{oom: 1, diskFull: true}},
		{backend.Contained{OOMKills: 1, PidsRefused: 0, Disk: disk(0)}, containDelta{}}, // counters reset
	}
	for i, s := range steps {
		if got := c.update(s.now); got != s.want {
			t.Errorf("step %d: %+v, want %+v", i, got, s.want)
		}
	}
	c = containSeen{}
	inodes := func(free uint64) backend.Contained {
		return backend.Contained{Disk: &backend.DiskUse{Bytes: 100 << 20, FreeBytes: 50 << 20, Inodes: 1000, FreeInodes: free}}
	}
	for i, s := range []struct {
		free uint64
		want bool
	}{{10, false}, {0, true}, {5, false}, {0, false}, {20, false}, {0, true}} {
		if got := c.update(inodes(s.free)).inodesFull; got != s.want {
			t.Errorf("inodes step %d (%d free): %v", i, s.free, got)
		}
	}
}

// The guard refuses creates below either reserve and stops a sandbox
// below half of one: bytes first.
func TestNodeDiskThresholds(t *testing.T) {
	for _, c := range []struct {
		d     nodeDisk
		low   bool
		short string
	}{
		{nodeDisk{free: 100, reserve: 50, freeInodes: 100, inodeReserve: 50}, false, ""},
		{nodeDisk{free: 40, reserve: 50, freeInodes: 100, inodeReserve: 50}, true, ""},
		{nodeDisk{free: 20, reserve: 50, freeInodes: 100, inodeReserve: 50}, true, "bytes"},
		{nodeDisk{free: 100, reserve: 50, freeInodes: 40, inodeReserve: 50}, true, ""},
		{nodeDisk{free: 100, reserve: 50, freeInodes: 20, inodeReserve: 50}, true, "inodes"},
		{nodeDisk{free: 20, reserve: 50, freeInodes: 20, inodeReserve: 50}, true, "bytes"},
		{nodeDisk{free: 100, reserve: 50, freeInodes: 0, inodeReserve: 0}, false, ""}, // no inode count
	} {
		if c.d.low() != c.low || c.d.short() != c.short {
			t.Errorf("%+v: low %v short %q, want %v %q", c.d, c.d.low(), c.d.short(), c.low, c.short)
		}
	}
}

// TestIdleLooksBackOff: the guard's looks at a sandbox whose CPU time
// does not move back off to one every maxLookBackoff intervals (so an
// idle fleet costs the daemon one small read per sandbox every half
// minute), a call on it brings them back to every interval, and what it
// then does on its own while backed off (forks refused at its pids limit,
// from a process that waited out the backoff) still becomes an event.
func TestIdleLooksBackOff(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.GuardInterval = 50 * time.Millisecond })
	e.create(&warrenv1.CreateRequest{Id: "idle", Resources: &warrenv1.Resources{PidsMax: 10}})
	s, err := e.m.lookup("idle")
	if err != nil {
		t.Fatal(err)
	}
	backoff := func() int {
		s.seen.mu.Lock()
		defer s.seen.mu.Unlock()
		return s.seen.backoff
	}
	eventually(t, 20*time.Second, "the looks at the idle sandbox to back off", func() bool { return backoff() == maxLookBackoff })

	// The call resets it; the process forks past the limit 3 s later,
	// once the looks have backed off again (16 x 50 ms = 0.8 s).
	if _, err := e.m.StartProcess(ctxT(t), &warrenv1.ExecRequest{SandboxId: "idle",
		Shell: "sleep 3; for i in $(seq 20); do sleep 5 & done 2>/dev/null; kill $(jobs -p); exit 0"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a full look after the call", func() bool { return backoff() < maxLookBackoff })
	eventually(t, 20*time.Second, "the looks to back off again while the process sleeps", func() bool { return backoff() == maxLookBackoff })
	eventually(t, 20*time.Second, "the refused forks' event", func() bool {
		return eventOf(e.eventsOf("idle"), events.PidsLimit) != nil
	})
}

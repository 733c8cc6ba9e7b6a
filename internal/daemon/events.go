package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/events"
)

// Security events: the daemon records every action it contained or saw
// the kernel contain (internal/events). Exec and background-process
// timeouts and output caps are recorded where the daemon enforces them;
// the kernel's own containment (OOM kills, forks refused at the pids
// limit, a full disk) is read from the backend's counters
// (backend.Containment): by a poller every GuardInterval for every
// running sandbox, and right after an exec that failed, so that the
// event is listed by the time the exec returns.

const (
	// DefaultGuardInterval is how often the counters of every running
	// sandbox are read: two small cgroup files and, with a disk limit, a
	// statfs each. One look took 7.7 µs here (10 µs with a disk), so
	// 3,200 sandboxes every 2 s cost about 1.2% of a core.
	DefaultGuardInterval = 2 * time.Second
	defaultEventsPage    = 100
	maxEventsPage        = 1000
	// A disk is full below 1% or 2 MiB free, whichever is more: ext4
	// refuses writes (ENOSPC) while it still shows some free blocks (a
	// 32 MiB disk filled by dd showed 591 KiB), reserved for the
	// metadata of data not yet written back. It is full again only once
	// it had twice that free: a sandbox hovering at its limit is one
	// event, not one per poll. Inodes: full at none free, again after
	// 1% were free.
	diskFullMinBytes = 2 << 20
)

// containSeen is what the last look at a sandbox's counters saw.
type containSeen struct {
	mu         sync.Mutex
	known      bool // a look was taken (or the sandbox is new: all zero)
	oom, pids  uint64
	diskFull   bool
	inodesFull bool
	cpu        cpuSeen // for the node's utilisation statistics (workload.go)
	// The periodic looks' backoff (periodicLook): the next is due at
	// next, backoff guard intervals after the last.
	next    time.Time
	backoff int
}

func openEvents(cfg Config) (*events.Log, error) {
	cfg.Metrics.InitEventKinds(kindNames()...)
	l, err := events.Open(events.Options{
		Dir:          filepath.Join(cfg.StateDir, "events"),
		MaxFileBytes: cfg.EventFileBytes,
		Count:        func(k events.Kind, n uint64) { cfg.Metrics.SecurityEvent(string(k), n) },
		Logger:       cfg.Logger,
	})
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "open the security event log")
	}
	return l, nil
}

func kindNames() []string {
	out := make([]string, len(events.Kinds))
	for i, k := range events.Kinds {
		out[i] = string(k)
	}
	return out
}

// ListSandboxEvents returns a page of a sandbox's security events.
func (m *Manager) ListSandboxEvents(ctx context.Context, req *warrenv1.ListSandboxEventsRequest) (_ *warrenv1.ListSandboxEventsResponse, err error) {
	defer m.observe("ListSandboxEvents", &err)
	if req.GetSandboxId() == "" {
		return nil, errdefs.Invalidf("sandbox_id is required")
	}
	if _, err := m.find(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = defaultEventsPage
	case size < 0 || size > maxEventsPage:
		return nil, errdefs.Invalidf("page_size %d is not within 0..%d", size, maxEventsPage)
	}
	var after uint64
	if t := req.GetPageToken(); t != "" {
		if after, err = strconv.ParseUint(t, 10, 64); err != nil {
			return nil, errdefs.Invalidf("bad page_token %q", t)
		}
	}
	p := m.events.List(req.GetSandboxId(), after, size)
	res := &warrenv1.ListSandboxEventsResponse{Suppressed: p.Suppressed}
	if p.Next != 0 {
		res.NextPageToken = strconv.FormatUint(p.Next, 10)
	}
	for _, e := range p.Events {
		res.Events = append(res.Events, &warrenv1.SecurityEvent{
			Seq: e.Seq, TimeUnixMs: e.Time.UnixMilli(), Kind: string(e.Kind), Detail: e.Detail,
			Count: e.Count, Process: e.Process, Suppressed: e.Suppressed,
		})
	}
	return res, nil
}

// runSource runs a node-wide event source until the daemon closes.
func (m *Manager) runSource(src events.Source) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := src.Run(ctx, knownSandboxes{m}); err != nil {
		m.log.Error("security event source stopped", "err", err)
	}
}

// knownSandboxes records the events of sandboxes this daemon keeps and
// drops others (one deleted meanwhile would leave a ring no delete
// forgets).
type knownSandboxes struct{ m *Manager }

func (k knownSandboxes) Record(e events.Event) {
	if _, err := k.m.lookup(e.Sandbox); err == nil {
		k.m.events.Record(e)
	}
}

// guard reads the containment counters of every running sandbox and the
// node's free disk every GuardInterval until the daemon closes.
func (m *Manager) guard() {
	t := time.NewTicker(m.cfg.GuardInterval)
	defer t.Stop()
	m.checkNodeDisk() // a restart on a low disk refuses creates at once
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		now := time.Now()
		for _, s := range m.snapshot() {
			s.mu.Lock()
			sb, running := s.sb, s.st == stateRunning
			s.mu.Unlock()
			if !running || sb == nil {
				continue
			}
			m.periodicLook(s, sb, now)
			if host, ok := sb.(backend.Background); ok && s.exitsUnchecked.Swap(false) {
				m.outputCaps(s, host)
			}
		}
		m.checkNodeDisk()
	}
}

// maxLookBackoff bounds how far apart, in guard intervals, the looks at
// an idle sandbox get (periodicLook).
const maxLookBackoff = 16

// periodicLook is the guard's look at one running sandbox. Looks at idle
// sandboxes back off: one whose CPU time did not move since the last look
// (backend.CPUReader, one small read) cannot have changed its other
// counters (an OOM kill, a refused fork, its disk take its processes'
// CPU), so nothing else is read, and its next look comes twice as late,
// up to maxLookBackoff intervals. Any call on it (live sets touched) or
// any CPU it used brings it back to every interval. At 10,000 idle
// sandboxes that is one read per sandbox every half minute instead of
// four every 2 s (docs/ARCHITECTURE.md, "Workload statistics"). What a
// sandbox idle for long does on its own, without a call, is seen within
// maxLookBackoff intervals.
func (m *Manager) periodicLook(s *sandbox, sb backend.Sandbox, now time.Time) {
	touched := s.touched.Swap(false)
	s.seen.mu.Lock()
	if !touched && now.Before(s.seen.next) {
		s.seen.mu.Unlock()
		return
	}
	if cr, ok := sb.(backend.CPUReader); ok && !touched && s.seen.known && s.seen.cpu.usage > 0 {
		if usage, err := cr.CPUUsage(); err == nil && usage == s.seen.cpu.usage {
			if cpus, ok := m.observeCPU(&s.seen.cpu, usage, now); ok {
				m.idleCheck(s, sb, cpus, now)
			}
			s.seen.backoff = min(max(2*s.seen.backoff, 2), maxLookBackoff)
			// Half an interval early: the ticks that follow fall after it.
			s.seen.next = now.Add(time.Duration(s.seen.backoff)*m.cfg.GuardInterval - m.cfg.GuardInterval/2)
			s.seen.mu.Unlock()
			return
		}
	}
	s.seen.backoff, s.seen.next = 1, time.Time{}
	s.seen.mu.Unlock()
	m.checkContained(s, sb, "", true)
}

// checkContained turns what rose since the last look at the sandbox's
// counters into events. The counters are sandbox-wide, so only an OOM
// kill known to be an exec's own (ExecResult.oom_killed) names it
// (oomVictim); the others name no process. The first look at an adopted
// sandbox only takes the baseline: what happened while no daemon
// watched is not known.
// containDelta is what changed between two looks: counters' rises, and
// whether the disk or its inodes became full.
type containDelta struct {
	oom, pids            uint64
	diskFull, inodesFull bool
}

// update takes a new look and returns what changed since the last.
// A counter that went down (one cgroup's cannot) is the new baseline.
func (c *containSeen) update(now backend.Contained) containDelta {
	d := containDelta{oom: now.OOMKills - min(c.oom, now.OOMKills), pids: now.PidsRefused - min(c.pids, now.PidsRefused)}
	c.known, c.oom, c.pids = true, now.OOMKills, now.PidsRefused
	if disk := now.Disk; disk != nil {
		low := max(disk.Bytes/100, diskFullMinBytes)
		full := disk.FreeBytes < low || (c.diskFull && disk.FreeBytes < 2*low)
		noInodes := disk.FreeInodes == 0 || (c.inodesFull && disk.FreeInodes < max(disk.Inodes/100, 1))
		d.diskFull, d.inodesFull = full && !c.diskFull, noInodes && !c.inodesFull
		c.diskFull, c.inodesFull = full, noInodes
	}
	return d
}

func (m *Manager) checkContained(s *sandbox, sb backend.Sandbox, oomVictim string, periodic bool) {
	c, ok := sb.(backend.Containment)
	if !ok {
		return
	}
	s.seen.mu.Lock()
	defer s.seen.mu.Unlock()
	now, err := c.Contained()
	if err != nil {
		return // going or gone: its end is a state, not an event
	}
	if periodic { // the guard's looks, at even intervals; not an exec's
		t := time.Now()
		if cpus, ok := m.observeCPU(&s.seen.cpu, now.CPUUsage, t); ok {
			m.idleCheck(s, sb, cpus, t)
		}
	}
	known := s.seen.known
	d := s.seen.update(now)
	if !known {
		return
	}
	res := s.resources()
	oomUp, pidsUp := d.oom, d.pids
	if oomUp > 0 {
		m.record(s.id, events.OOMKill, oomUp, oomVictim, "%d process(es) killed by the OOM killer at the memory limit of %s", oomUp, bytesText(res.GetMemoryBytes()))
	}
	if pidsUp > 0 {
		m.record(s.id, events.PidsLimit, pidsUp, "", "%d fork(s) refused at the pids limit of %d", pidsUp, res.GetPidsMax())
	}
	if d.diskFull {
		m.record(s.id, events.DiskFull, 1, "", "the sandbox's disk of %s is full (%s free): writes fail with ENOSPC", bytesText(int64(now.Disk.Bytes)), bytesText(int64(now.Disk.FreeBytes)))
	}
	if d.inodesFull {
		m.record(s.id, events.InodesFull, 1, "", "the sandbox's disk has no free inode left of %d: creating files fails with ENOSPC", now.Disk.Inodes)
	}
}

// resources reads the sandbox's limits as its record has them.
func (s *sandbox) resources() *warrenv1.Resources {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info.GetResources()
}

// record adds a security event of a sandbox.
func (m *Manager) record(sandbox string, k events.Kind, count uint64, process, format string, args ...any) {
	m.events.Record(events.Event{Sandbox: sandbox, Kind: k, Count: count, Process: process, Detail: fmt.Sprintf(format, args...)})
}

// execEvents records what the daemon contained of one exec: its timeout
// and its output past the limit; for an exec that failed it looks at the
// kernel's counters at once (an OOM kill, refused forks, a full disk
// likely made it fail).
func (m *Manager) execEvents(s *sandbox, sb backend.Sandbox, argv []string, res *warrenv1.ExecResult, limit int64, timeout time.Duration) {
	failed := res.GetExitCode() != 0 || res.GetSignal() != 0
	if !failed && !res.GetTimedOut() && res.GetStdoutDroppedBytes() == 0 && res.GetStderrDroppedBytes() == 0 {
		return // the common exec: nothing to look at, nothing allocated
	}
	who := "pid " + strconv.Itoa(int(res.GetPid()))
	cmd := argvText(argv)
	if res.GetTimedOut() {
		m.record(s.id, events.Timeout, 1, who, "exec %s killed after its timeout of %v", cmd, timeout)
	}
	for _, st := range []struct {
		name    string
		dropped int64
	}{{"stdout", res.GetStdoutDroppedBytes()}, {"stderr", res.GetStderrDroppedBytes()}} {
		if st.dropped > 0 {
			m.record(s.id, events.OutputCap, 1, who, "exec %s wrote %d bytes to %s past its output limit of %s: dropped", cmd, st.dropped, st.name, bytesText(limit))
		}
	}
	if failed {
		victim := ""
		if res.GetOomKilled() {
			victim = who
		}
		m.checkContained(s, sb, victim, false)
	}
}

// processExited records a background process's timeout kill at once
// and leaves its output to the guard's next round: whether output was
// dropped is in the agent's record, and one listing per sandbox and round
// (outputCaps) costs the agent far less than one per exit (a listing is
// up to 1,280 records of up to 3 KiB).
func (m *Manager) processExited(p *process) {
	p.mu.Lock()
	timedOut := p.timedOut
	p.mu.Unlock()
	if timedOut {
		m.record(p.sandbox, events.Timeout, 1, p.id, "process %s killed after its timeout of %v", argvText(p.argv), p.timeout)
	}
	if s, err := m.lookup(p.sandbox); err == nil {
		s.exitsUnchecked.Store(true)
	}
}

// outputCaps records an output_cap event for every exited background
// process of the sandbox whose output outgrew its cap (the agent kept the
// latest bytes; those before Start were dropped), once per process.
func (m *Manager) outputCaps(s *sandbox, host backend.Background) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := host.ListBackground(ctx)
	if err != nil {
		return
	}
	byPid := map[int]*process{}
	s.mu.Lock()
	for _, p := range s.procs {
		if p.exited() && !p.capChecked {
			byPid[p.pid] = p
		}
	}
	s.mu.Unlock()
	for _, r := range recs {
		p := byPid[r.Pid]
		if p == nil || !r.Exited {
			continue
		}
		p.capChecked = true // only this goroutine (the guard) reads and writes it
		for _, st := range []struct {
			name string
			rng  backend.StreamRange
		}{{"stdout", r.Stdout}, {"stderr", r.Stderr}} {
			if st.rng.Start > 0 {
				m.record(s.id, events.OutputCap, 1, p.id, "process %s wrote %d bytes to %s; the oldest %d past its output limit of %s were dropped",
					argvText(p.argv), st.rng.Total, st.name, st.rng.Start, bytesText(r.OutputCap))
			}
		}
	}
}

// argvText quotes a command for an event's detail, cut at 200 bytes.
func argvText(argv []string) string {
	s := strconv.Quote(strings.Join(argv, " "))
	if len(s) > 200 {
		s = s[:197] + "..."
	}
	return s
}

// bytesText writes a byte count in binary units ("512 MiB"); 0 is "none".
func bytesText(n int64) string {
	switch {
	case n <= 0:
		return "none"
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

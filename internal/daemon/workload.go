package daemon

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/metrics"
)

// The node's workload statistics (metrics/workload.go): how long
// sandboxes live, how much CPU the running ones use, what memory they
// hold.

// ended counts a sandbox as ended for reason, with how long it lived
// since createdMs (its record's created_at; 0: unknown).
func (m *Manager) ended(reason string, createdMs int64) {
	m.metrics.SandboxEnded(reason)
	if createdMs > 0 {
		m.metrics.SandboxLived(reason, time.Since(time.UnixMilli(createdMs)))
	}
}

// cpuSeen is a sandbox's CPU time at the daemon's last look, for its use
// over the interval to the next (containSeen holds it), and how long it
// has been idle.
type cpuSeen struct {
	at    time.Time
	usage time.Duration
	// idleSince is the first look of its current idle spell (zero: not
	// idle); reclaimed, that this spell's reclaim was done.
	idleSince time.Time
	reclaimed bool
}

// Idle, for the idle reclaim: under idleCPU CPUs at every look, and its
// tasks not stalled on memory (PSI some avg10 under idlePressure %): a
// sandbox faulting its memory back in is not idle, whatever its CPU.
const (
	idleCPU      = 0.01
	idlePressure = 1.0
)

// observeCPU records the CPU a sandbox used since the last look, in CPUs,
// and returns it; the first look (and one after a counter went back: a
// restore) only takes the baseline (ok false).
func (m *Manager) observeCPU(c *cpuSeen, usage time.Duration, now time.Time) (cpus float64, ok bool) {
	if usage <= 0 {
		return 0, false
	}
	if !c.at.IsZero() && usage >= c.usage {
		if dt := now.Sub(c.at); dt > 0 {
			cpus, ok = float64(usage-c.usage)/float64(dt), true
			// One sample per guard interval the look covers: an idle
			// sandbox's looks back off (periodicLook), and the
			// histogram counts sandbox-intervals.
			n := max(1, int((dt+m.cfg.GuardInterval/2)/m.cfg.GuardInterval))
			for range min(n, 2*maxLookBackoff) {
				m.metrics.ObserveCPUUtilisation(cpus)
			}
		}
	}
	c.at, c.usage = now, usage
	return cpus, ok
}

// idleCheck follows a running sandbox's idle spells (called at each of the
// guard's looks, with s.seen locked) and starts the reclaim of its memory
// once it has been idle for Config.IdleReclaimAfter: once per spell, one
// sandbox at a time on the node. Any look that is not idle ends the spell.
func (m *Manager) idleCheck(s *sandbox, sb backend.Sandbox, cpus float64, now time.Time) {
	after := m.cfg.IdleReclaimAfter
	ir, ok := sb.(backend.IdleReclaimer)
	if after <= 0 || !ok {
		return
	}
	c := &s.seen.cpu
	// No CPU at all since the last look: idle, and nothing of it waits
	// on memory (a task stalled in reclaim or on a refault runs some), so
	// its pressure is not read: the looks at idle sandboxes read one file.
	if cpus >= idleCPU || (cpus > 0 && ir.MemoryPressure() >= idlePressure) {
		c.idleSince, c.reclaimed = time.Time{}, false
		return
	}
	if c.idleSince.IsZero() {
		c.idleSince = now
	}
	if c.reclaimed || now.Sub(c.idleSince) < after {
		return
	}
	select {
	case m.idleReclaiming <- struct{}{}:
	default:
		return // another one's reclaim runs: this one at a later look
	}
	c.reclaimed = true
	m.spawn(func() {
		defer func() { <-m.idleReclaiming }()
		s.mu.Lock()
		running := s.st == stateRunning && s.sb == sb
		s.mu.Unlock()
		if !running {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		t0 := time.Now()
		before, after, err := ir.ReclaimIdle(ctx)
		if err != nil {
			m.log.Debug("reclaim an idle sandbox's memory", "sandbox", s.id, "err", err)
			return
		}
		m.metrics.IdleReclaimed(before.Bytes - min(after.Bytes, before.Bytes))
		m.log.Debug("idle sandbox's memory reclaimed", "sandbox", s.id, "before", before.Bytes, "after", after.Bytes, "took", time.Since(t0))
	})
}

// memoryUse sums the memory of the running sandboxes (read at a scrape of
// warren_sandbox_memory_bytes): one read of the whole backend where it
// can (backend.NodeMemory), else one per sandbox.
func (m *Manager) memoryUse() metrics.MemoryUse {
	var u metrics.MemoryUse
	add := func(st backend.Stats) {
		u.Anon += st.MemoryAnon
		u.File += st.MemoryCache
		u.Kernel += st.MemoryKernel
		u.Swap += st.MemorySwap
	}
	whole := map[string]bool{} // backends read at once
	for _, s := range m.snapshot() {
		s.mu.Lock()
		sb, running, name := s.sb, s.st == stateRunning || s.st == statePaused, s.backendName
		s.mu.Unlock()
		if !running || sb == nil {
			continue
		}
		u.Sandboxes++
		if _, ok := whole[name]; !ok {
			nm, ok := m.cfg.Backends[name].(backend.NodeMemory)
			whole[name] = ok
			if ok {
				if st, err := nm.SandboxesMemory(); err == nil {
					add(st)
				}
			}
		}
		if whole[name] {
			continue
		}
		if st, err := sb.Stats(); err == nil {
			add(st)
		}
	}
	return u
}

// DAMONState says whether this node could run DAMON-based proactive
// reclaim (a kdamond of the sysfs interface that is free), for the log at
// start: Warren runs none yet and relies on its own idle reclaim.
func DAMONState() string {
	const dir = "/sys/kernel/mm/damon/admin/kdamonds"
	b, err := os.ReadFile(dir + "/nr_kdamonds")
	if err != nil {
		return "no DAMON sysfs interface (CONFIG_DAMON_SYSFS)"
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	for i := range n {
		st, _ := os.ReadFile(dir + "/" + strconv.Itoa(i) + "/state")
		if strings.TrimSpace(string(st)) == "on" {
			return "kdamond " + strconv.Itoa(i) + " is in use by another program: DAMON-based reclaim would compete with it"
		}
	}
	return strconv.Itoa(n) + " kdamond(s), none running: free for DAMON-based reclaim"
}

package daemon

import (
	"time"

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
// over the interval to the next (containSeen holds it).
type cpuSeen struct {
	at    time.Time
	usage time.Duration
}

// observeCPU records the CPU a sandbox used since the last look, in CPUs;
// the first look (and one after a counter went back: a restore) only
// takes the baseline.
func (m *Manager) observeCPU(c *cpuSeen, usage time.Duration, now time.Time) {
	if usage <= 0 {
		return
	}
	if !c.at.IsZero() && usage >= c.usage {
		if dt := now.Sub(c.at); dt > 0 {
			m.metrics.ObserveCPUUtilisation(float64(usage-c.usage) / float64(dt))
		}
	}
	c.at, c.usage = now, usage
}

// memoryUse sums the memory of the running sandboxes (read at a scrape of
// warren_sandbox_memory_bytes).
func (m *Manager) memoryUse() metrics.MemoryUse {
	var u metrics.MemoryUse
	for _, s := range m.snapshot() {
		s.mu.Lock()
		sb, running := s.sb, s.st == stateRunning || s.st == statePaused
		s.mu.Unlock()
		if !running || sb == nil {
			continue
		}
		st, err := sb.Stats()
		if err != nil {
			continue
		}
		u.Anon += st.MemoryAnon
		u.File += st.MemoryCache
		u.Kernel += st.MemoryKernel
		u.Swap += st.MemorySwap
		u.Sandboxes++
	}
	return u
}

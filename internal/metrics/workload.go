package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The shape of the node's workload (docs/ARCHITECTURE.md, "Metrics"), so
// that an operator sees what agent sandboxes do to a node: most live long
// and sit idle. Node-wide histograms and sums, never a series per sandbox
// (thousands of sandboxes would make thousands of series); the API gives
// each sandbox's numbers (SandboxStats).

// workload are the collectors of this file, made by New.
type workload struct {
	// lifetime is warren_sandbox_lifetime_seconds{reason}: how long each
	// sandbox that ended had lived, from its create to its end.
	lifetime *prometheus.HistogramVec
	// cpu is warren_sandbox_cpu_utilisation: for every running sandbox,
	// once per look of the daemon's guard (every 2 s by default), the CPU
	// it used over the interval, in CPUs (0.05 is 5 % of one CPU).
	cpu prometheus.Histogram
	// idleReclaims, idleReclaimed: the daemon's reclaims of idle running
	// sandboxes' memory (warren_idle_reclaims_total,
	// warren_idle_reclaimed_bytes_total).
	idleReclaims, idleReclaimed prometheus.Counter
}

// LifetimeBuckets: 1 s to 1 week, 36 exponential steps (about 45 % apart).
func LifetimeBuckets() []float64 { return prometheus.ExponentialBucketsRange(1, 7*24*3600, 36) }

// UtilisationBuckets: idle to busy, finest near idle where most sandboxes are.
func UtilisationBuckets() []float64 {
	return []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8}
}

func newWorkload() workload {
	return workload{
		lifetime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:                        "warren_sandbox_lifetime_seconds",
			Help:                        "How long sandboxes that ended had lived (create to end), by why they ended (as warren_sandbox_deleted_total).",
			Buckets:                     LifetimeBuckets(),
			NativeHistogramBucketFactor: 1.1,
		}, []string{"reason"}),
		cpu: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "warren_sandbox_cpu_utilisation",
			Help:    "CPU used by each running sandbox over each interval the daemon looked (every 2 s by default), in CPUs: one observation per sandbox and interval.",
			Buckets: UtilisationBuckets(),
		}),
		idleReclaims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warren_idle_reclaims_total",
			Help: "Reclaims of the memory of running sandboxes that had been idle (serve --idle-reclaim-after).",
		}),
		idleReclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warren_idle_reclaimed_bytes_total",
			Help: "Memory that idle running sandboxes gave back (page cache, and anonymous memory to swap where the node has it), in bytes.",
		}),
	}
}

func (w workload) collectors() []prometheus.Collector {
	return []prometheus.Collector{w.lifetime, w.cpu, w.idleReclaims, w.idleReclaimed}
}

// IdleReclaimed counts one reclaim of an idle sandbox that gave back n bytes.
func (m *Metrics) IdleReclaimed(n uint64) {
	if m == nil {
		return
	}
	m.work.idleReclaims.Inc()
	m.work.idleReclaimed.Add(float64(n))
}

// SandboxLived records the lifetime of a sandbox that ended for reason.
func (m *Metrics) SandboxLived(reason string, d time.Duration) {
	if m == nil || d <= 0 {
		return
	}
	m.work.lifetime.WithLabelValues(reason).Observe(d.Seconds())
}

// ObserveCPUUtilisation records a running sandbox's CPU use over one look.
func (m *Metrics) ObserveCPUUtilisation(cpus float64) {
	if m == nil {
		return
	}
	m.work.cpu.Observe(cpus)
}

// MemoryUse is the memory of the node's sandboxes, summed, by kind.
type MemoryUse struct {
	Anon, File, Kernel, Swap uint64
	Sandboxes                int
}

// memoryCollector reads the sandboxes' memory at each scrape (a sum over
// every running sandbox's cgroup: paid only when scraped).
type memoryCollector struct {
	read func() MemoryUse
	desc *prometheus.Desc
}

func (c *memoryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *memoryCollector) Collect(ch chan<- prometheus.Metric) {
	u := c.read()
	for _, k := range []struct {
		kind string
		v    uint64
	}{{"anon", u.Anon}, {"file", u.File}, {"kernel", u.Kernel}, {"swap", u.Swap}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(k.v), k.kind)
	}
}

// MemoryFunc registers warren_sandbox_memory_bytes{kind}: what the node's
// running sandboxes hold, summed: anonymous memory, page cache (file),
// kernel memory charged to them, and what they have out on swap.
func (m *Metrics) MemoryFunc(read func() MemoryUse) {
	if m == nil {
		return
	}
	m.replace(&memoryCollector{read: read, desc: prometheus.NewDesc("warren_sandbox_memory_bytes",
		"Memory the node's running sandboxes hold, summed over them, by kind: anon (heaps, stacks, tmpfs), file (page cache), kernel (slab, stacks, page tables, sockets charged to them), swap (out on swap).",
		[]string{"kind"}, nil)})
}

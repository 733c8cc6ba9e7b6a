package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FnPool is one image's environments in the fncall backend's pools (all
// its disk quotas together), as warren_fncall_environments reports them.
type FnPool struct {
	Image               string
	Idle, InUse, Making int
}

// FnCounts are the fncall backend's environment counters since start.
type FnCounts struct {
	Created, Destroyed uint64
	// Failed counts environments destroyed because their job or reset
	// failed (a reset that could not clean them, an agent error).
	Failed uint64
}

// FnJobOutcomes are the values of warren_fncall_jobs_total{status}: a
// job's last step's status, or "error" when Warren failed to run it (an
// API error).
var FnJobOutcomes = []string{"accepted", "non_zero_exit", "signalled", "time_limit", "memory_limit",
	"output_limit", "file_error", "internal_error", "error"}

// fnCollector reads the pools at each scrape: sizes change with every
// call, and a gauge set on each change would cost the hot path a lock.
type fnCollector struct {
	pools                            func() []FnPool
	counts                           func() FnCounts
	envs, created, destroyed, failed *prometheus.Desc
}

func (c *fnCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.envs
	ch <- c.created
	ch <- c.destroyed
	ch <- c.failed
}

func (c *fnCollector) Collect(ch chan<- prometheus.Metric) {
	byImage := map[string]*FnPool{}
	var order []string
	for _, p := range c.pools() {
		a, ok := byImage[p.Image]
		if !ok {
			a = &FnPool{Image: p.Image}
			byImage[p.Image] = a
			order = append(order, p.Image)
		}
		a.Idle += p.Idle
		a.InUse += p.InUse
		a.Making += p.Making
	}
	for _, img := range order {
		a := byImage[img]
		ch <- prometheus.MustNewConstMetric(c.envs, prometheus.GaugeValue, float64(a.Idle), img, "idle")
		ch <- prometheus.MustNewConstMetric(c.envs, prometheus.GaugeValue, float64(a.InUse), img, "in_use")
		ch <- prometheus.MustNewConstMetric(c.envs, prometheus.GaugeValue, float64(a.Making), img, "making")
	}
	n := c.counts()
	ch <- prometheus.MustNewConstMetric(c.created, prometheus.CounterValue, float64(n.Created))
	ch <- prometheus.MustNewConstMetric(c.destroyed, prometheus.CounterValue, float64(n.Destroyed))
	ch <- prometheus.MustNewConstMetric(c.failed, prometheus.CounterValue, float64(n.Failed))
}

// RegisterFnCall registers the fncall backend's pool metrics, read from
// pools and counts at each scrape, and its job metrics (ObserveFnJob).
func (m *Metrics) RegisterFnCall(pools func() []FnPool, counts func() FnCounts) {
	if m == nil {
		return
	}
	m.replace(&fnCollector{
		pools:  pools,
		counts: counts,
		envs: prometheus.NewDesc("warren_fncall_environments",
			"The fncall backend's pooled environments by image and state: idle (ready), in_use (running a job), making (being created).",
			[]string{"image", "state"}, nil),
		created: prometheus.NewDesc("warren_fncall_environments_created_total",
			"Environments the fncall backend created.", nil, nil),
		destroyed: prometheus.NewDesc("warren_fncall_environments_destroyed_total",
			"Environments the fncall backend destroyed, for any reason (pool shrinking, idle timeout, image removed, failure).", nil, nil),
		failed: prometheus.NewDesc("warren_fncall_environments_failed_total",
			"Environments destroyed because their job or reset failed (the reset could not clean them, or the environment failed).", nil, nil),
	})
	m.replace(m.fnJobs)
	m.replace(m.fnJobSeconds)
}

// ObserveFnJob counts one Run job by outcome (FnJobOutcomes) and its
// latency in the daemon.
func (m *Metrics) ObserveFnJob(outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.fnJobs.WithLabelValues(outcome).Inc()
	m.fnJobSeconds.Observe(d.Seconds())
}

func newFnJobMetrics() (*prometheus.CounterVec, prometheus.Histogram) {
	jobs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warren_fncall_jobs_total",
		Help: "Jobs of Run and RunBatch by outcome: the last step's status (accepted, non_zero_exit, ..., internal_error), or error when the job did not run (an API error: an unknown image, or Warren failed).",
	}, []string{"status"})
	for _, o := range FnJobOutcomes {
		jobs.WithLabelValues(o)
	}
	secs := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:                        "warren_fncall_job_seconds",
		Help:                        "Latency of Run jobs in the daemon: image resolution, drawing an environment, every step, the reset.",
		Buckets:                     prometheus.ExponentialBucketsRange(0.0001, 60, 40),
		NativeHistogramBucketFactor: 1.1,
	})
	return jobs, secs
}

// Package metrics holds the daemon's Prometheus collectors in a registry of
// their own, served by `warren serve` on /metrics.
package metrics

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Sandbox states as used in the warren_sandboxes{state} label.
const (
	StateCreating   = "creating"
	StateRunning    = "running"
	StateStopped    = "stopped" // init exited ("dead" before the lifecycle table)
	StateDeleting   = "deleting"
	StatePaused     = "paused"
	StateHibernated = "hibernated"
	StateLost       = "lost"
	StateUnknown    = "unknown" // a record of a state this daemon does not know
)

// States lists every value of the state label.
var States = []string{StateCreating, StateRunning, StateStopped, StateDeleting,
	StatePaused, StateHibernated, StateLost, StateUnknown}

// Reasons a sandbox ended, for warren_sandbox_deleted_total{reason}.
const (
	ReasonUser    = "user"    // deleted by a Delete call while alive
	ReasonTimeout = "timeout" // its lifetime passed
	ReasonDead    = "dead"    // its init exited on its own
	ReasonMoved   = "moved"   // hibernated here and restored on another node
)

// Metrics are the daemon's collectors. Every method is safe on a nil
// *Metrics (it does nothing), so components may run without metrics.
type Metrics struct {
	Registry *prometheus.Registry

	Sandboxes     *prometheus.GaugeVec // warren_sandboxes{state}
	CreateSeconds prometheus.Histogram // warren_sandbox_create_seconds
	// CreatePhaseSeconds is warren_sandbox_create_phase_seconds{phase}:
	// where a backend's create spends its time (container: dirs, clone,
	// cgroup, config, network, init, attach), so that a slower create
	// shows which step grew.
	CreatePhaseSeconds *prometheus.HistogramVec
	ExecSeconds        prometheus.Histogram   // warren_exec_seconds
	Errors             *prometheus.CounterVec // warren_errors_total{category,op}
	Deleted            *prometheus.CounterVec // warren_sandbox_deleted_total{reason}
	// SecurityEvents is warren_security_events_total{kind}: node-wide on
	// purpose, since a sandbox label would make thousands of series; the
	// API lists each sandbox's events.
	SecurityEvents *prometheus.CounterVec
	// TrajectoryCalls is warren_trajectory_calls_total{mode}: mutating
	// calls by how the trajectory log served them: live (ran and
	// recorded), replayed (recorded outcome returned, nothing ran),
	// unrecorded (ran; the sandbox's log was full).
	TrajectoryCalls *prometheus.CounterVec
	// TrajectoryMismatches is warren_trajectory_mismatches_total: replayed
	// calls refused because their request differed from the recorded one.
	TrajectoryMismatches prometheus.Counter
	// ArchiveBytes is warren_archive_bytes_total{direction}: tar bytes
	// of the sandboxes' archive calls, out (downloads) and in (uploads),
	// as they crossed the daemon's API (a sparse archive's holes do not).
	ArchiveBytes *prometheus.CounterVec
	// DNSQueries is warren_dns_queries_total{result}: queries Warren's
	// resolver answered, by result (internal/resolver); DNSSeconds,
	// warren_dns_resolve_seconds, how long each took to answer (an
	// upstream's round trip included).
	DNSQueries *prometheus.CounterVec
	DNSSeconds prometheus.Histogram
	// PauseSeconds is warren_sandbox_pause_seconds{reclaim}: a Pause in
	// the daemon, freeze only ("false") or with the memory reclaim
	// ("true"), whose costs differ by orders of magnitude.
	PauseSeconds  *prometheus.HistogramVec
	ResumeSeconds prometheus.Histogram // warren_sandbox_resume_seconds
	// HibernateSeconds: CRIU's checkpoint; RestoreSeconds: a whole
	// restore in the daemon, by how the memory came back ("lazy" or
	// "eager": a node where user-namespace sandboxes restore eagerly
	// shows in the second); CheckpointBytes: checkpoints written.
	HibernateSeconds prometheus.Histogram     // warren_sandbox_hibernate_seconds
	RestoreSeconds   *prometheus.HistogramVec // warren_sandbox_restore_seconds{memory}
	CheckpointBytes  prometheus.Counter       // warren_checkpoint_bytes_total
	// ReclaimedBytes is warren_sandbox_reclaimed_bytes_total: memory
	// paused sandboxes gave back.
	ReclaimedBytes prometheus.Counter

	// The shape of the workload (workload.go).
	work workload

	// The fncall backend's jobs (fncall.go), registered by RegisterFnCall.
	fnJobs       *prometheus.CounterVec
	fnJobSeconds prometheus.Histogram
}

// CreateBuckets are the classic buckets of warren_sandbox_create_seconds:
// 1 ms to 10 s, 40 exponential steps (about 26 % apart).
func CreateBuckets() []float64 { return prometheus.ExponentialBucketsRange(0.001, 10, 40) }

// ExecBuckets are the classic buckets of warren_exec_seconds: 100 µs to
// 1 h, 50 exponential steps (about 40 % apart).
func ExecBuckets() []float64 { return prometheus.ExponentialBucketsRange(0.0001, 3600, 50) }

// New builds the collectors and registers them, with the Go runtime and
// process collectors, in a new registry. ops are the operation names the
// caller will report errors for; warren_errors_total is pre-initialised to
// zero for every (category, op) pair so that rates work from the start.
func New(ops ...string) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Sandboxes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warren_sandboxes",
			Help: "Sandboxes known to the daemon, by state.",
		}, []string{"state"}),
		CreateSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:                        "warren_sandbox_create_seconds",
			Help:                        "Latency of successful sandbox creation, from request to running.",
			Buckets:                     CreateBuckets(),
			NativeHistogramBucketFactor: 1.1,
		}),
		CreatePhaseSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:                        "warren_sandbox_create_phase_seconds",
			Help:                        "Time of each step of successful creates in the backend, by phase.",
			Buckets:                     prometheus.ExponentialBucketsRange(0.00001, 1, 40),
			NativeHistogramBucketFactor: 1.1,
		}, []string{"phase"}),
		ExecSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:                        "warren_exec_seconds",
			Help:                        "Duration of Exec and ExecStream commands, from start to exit.",
			Buckets:                     ExecBuckets(),
			NativeHistogramBucketFactor: 1.1,
		}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_errors_total",
			Help: "Failed operations, by error category and operation.",
		}, []string{"category", "op"}),
		Deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_sandbox_deleted_total",
			Help: "Sandboxes that ended, by reason: user (Delete of a live sandbox), timeout (lifetime passed), dead (init exited). Each sandbox is counted once.",
		}, []string{"reason"}),
	}
	m.PauseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:                        "warren_sandbox_pause_seconds",
		Help:                        "Latency of successful pauses in the daemon, by whether memory was reclaimed.",
		Buckets:                     prometheus.ExponentialBucketsRange(0.0001, 10, 40),
		NativeHistogramBucketFactor: 1.1,
	}, []string{"reclaim"})
	m.ResumeSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:                        "warren_sandbox_resume_seconds",
		Help:                        "Latency of successful resumes in the daemon.",
		Buckets:                     prometheus.ExponentialBucketsRange(0.0001, 10, 40),
		NativeHistogramBucketFactor: 1.1,
	})
	m.HibernateSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:                        "warren_sandbox_hibernate_seconds",
		Help:                        "Latency of successful checkpoints of hibernations (CRIU's dump and the writable layer's move).",
		Buckets:                     prometheus.ExponentialBucketsRange(0.001, 60, 40),
		NativeHistogramBucketFactor: 1.1,
	})
	m.RestoreSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:                        "warren_sandbox_restore_seconds",
		Help:                        "Latency of successful restores from checkpoints (resumes of hibernated sandboxes, forks) in the daemon, by how the memory came back: lazy or eager.",
		Buckets:                     prometheus.ExponentialBucketsRange(0.001, 60, 40),
		NativeHistogramBucketFactor: 1.1,
	}, []string{"memory"})
	m.CheckpointBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "warren_checkpoint_bytes_total",
		Help: "Bytes of checkpoints written by hibernations.",
	})
	m.ReclaimedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "warren_sandbox_reclaimed_bytes_total",
		Help: "Memory that paused sandboxes gave back (page cache, and anonymous memory pushed to swap), in bytes.",
	})
	m.SecurityEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warren_security_events_total",
		Help: "Actions of sandboxes the node contained or denied (OOM kills, forks refused at the pids limit, output past a cap, full disks, timeout kills, ...), by kind: occurrences, rate-limited events included.",
	}, []string{"kind"})
	m.TrajectoryCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warren_trajectory_calls_total",
		Help: "Mutating calls (exec, file writes) by how the trajectory log served them: live (ran, recorded), replayed (the recorded outcome, nothing ran), unrecorded (ran; the sandbox's log was full).",
	}, []string{"mode"})
	m.TrajectoryMismatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "warren_trajectory_mismatches_total",
		Help: "Calls refused because their trajectory step was recorded with a different request.",
	})
	for _, mode := range []string{"live", "replayed", "unrecorded"} {
		m.TrajectoryCalls.WithLabelValues(mode)
	}
	m.ArchiveBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warren_archive_bytes_total",
		Help: "Tar bytes of the sandboxes' archive calls as they crossed the API, by direction: out (downloads), in (uploads).",
	}, []string{"direction"})
	m.ArchiveBytes.WithLabelValues("out")
	m.ArchiveBytes.WithLabelValues("in")
	m.DNSQueries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warren_dns_queries_total",
		Help: "Queries of sandboxes to Warren's resolver, by result: forwarded, group, empty (AAAA), refused (not on the allowlist), failed (SERVFAIL), bad.",
	}, []string{"result"})
	m.DNSSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:                        "warren_dns_resolve_seconds",
		Help:                        "Time Warren's resolver took to answer a query, upstream round trip included.",
		Buckets:                     prometheus.ExponentialBucketsRange(0.00001, 10, 40),
		NativeHistogramBucketFactor: 1.1,
	})
	m.fnJobs, m.fnJobSeconds = newFnJobMetrics()
	for _, s := range States {
		m.Sandboxes.WithLabelValues(s)
	}
	for _, r := range []string{ReasonUser, ReasonTimeout, ReasonDead, ReasonMoved} {
		m.Deleted.WithLabelValues(r)
	}
	m.InitOps(ops...)
	m.work = newWorkload()
	for _, r := range []string{ReasonUser, ReasonTimeout, ReasonDead, ReasonMoved} {
		m.work.lifetime.WithLabelValues(r)
	}
	m.Registry.MustRegister(m.work.collectors()...)
	m.Registry.MustRegister(
		m.Sandboxes, m.CreateSeconds, m.CreatePhaseSeconds, m.ExecSeconds, m.Errors, m.Deleted, m.SecurityEvents,
		m.TrajectoryCalls, m.TrajectoryMismatches, m.ArchiveBytes,
		m.DNSQueries, m.DNSSeconds,
		m.PauseSeconds, m.ResumeSeconds, m.ReclaimedBytes, m.HibernateSeconds, m.RestoreSeconds, m.CheckpointBytes,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// InitDNSResults starts warren_dns_queries_total at zero for results.
func (m *Metrics) InitDNSResults(results ...string) {
	if m == nil {
		return
	}
	for _, r := range results {
		m.DNSQueries.WithLabelValues(r)
	}
}

// ObserveDNS counts one query of Warren's resolver and its latency.
func (m *Metrics) ObserveDNS(result string, d time.Duration) {
	if m == nil {
		return
	}
	m.DNSQueries.WithLabelValues(result).Inc()
	m.DNSSeconds.Observe(d.Seconds())
}

// ObserveCreatePhase records one step of a successful create.
func (m *Metrics) ObserveCreatePhase(phase string, d time.Duration) {
	if m == nil {
		return
	}
	m.CreatePhaseSeconds.WithLabelValues(phase).Observe(d.Seconds())
}

// DeleteFailuresFunc registers warren_delete_failures_total{backend}: how
// many deleted sandboxes' leftovers the backend could not remove.
func (m *Metrics) DeleteFailuresFunc(backend string, f func() uint64) {
	if m == nil {
		return
	}
	m.replace(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "warren_delete_failures_total",
		Help:        "Deleted sandboxes' leftovers the backend could not remove (logged with the path and error, retried at the next start).",
		ConstLabels: prometheus.Labels{"backend": backend},
	}, func() float64 { return float64(f()) }))
}

// NodeMemoryCgroupsFunc registers warren_node_memory_cgroups: the memory
// cgroups the kernel holds on the node, removed ones it keeps while pages
// are charged to them included, so that an operator sees them pile up
// (each costs kernel memory; docs/ARCHITECTURE.md, "cgroup").
func (m *Metrics) NodeMemoryCgroupsFunc(f func() (int64, error)) {
	if m == nil {
		return
	}
	m.replace(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "warren_node_memory_cgroups",
		Help: "Memory cgroups the kernel holds on the node (/proc/cgroups), removed ones still charged with pages (dying) included; -1 if unreadable.",
	}, func() float64 {
		n, err := f()
		if err != nil {
			return -1
		}
		return float64(n)
	}))
}

// replace registers c, replacing the collector of a daemon made before on
// the same registry (tests).
func (m *Metrics) replace(c prometheus.Collector) {
	var dup prometheus.AlreadyRegisteredError
	if err := m.Registry.Register(c); errors.As(err, &dup) {
		m.Registry.Unregister(dup.ExistingCollector)
		m.Registry.MustRegister(c)
	}
}

// BacklogFunc registers warren_delete_backlog{backend}: how many deleted
// sandboxes' leftovers the backend has yet to remove in the background.
func (m *Metrics) BacklogFunc(backend string, f func() int) {
	if m == nil {
		return
	}
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "warren_delete_backlog",
		Help:        "Deleted sandboxes whose leftovers (writable layers) the backend still removes in the background.",
		ConstLabels: prometheus.Labels{"backend": backend},
	}, func() float64 { return float64(f()) })
	// A daemon made again on the same registry (tests) replaces the
	// function of the one before.
	var dup prometheus.AlreadyRegisteredError
	if err := m.Registry.Register(g); errors.As(err, &dup) {
		m.Registry.Unregister(dup.ExistingCollector)
		m.Registry.MustRegister(g)
	}
}

// InitEventKinds starts warren_security_events_total at zero for kinds.
func (m *Metrics) InitEventKinds(kinds ...string) {
	if m == nil {
		return
	}
	for _, k := range kinds {
		m.SecurityEvents.WithLabelValues(k)
	}
}

// SecurityEvent counts n occurrences of security events of kind.
func (m *Metrics) SecurityEvent(kind string, n uint64) {
	if m == nil {
		return
	}
	m.SecurityEvents.WithLabelValues(kind).Add(float64(n))
}

// InitOps pre-initialises warren_errors_total for every category and op.
func (m *Metrics) InitOps(ops ...string) {
	if m == nil {
		return
	}
	for _, op := range ops {
		for _, c := range errdefs.Categories() {
			m.Errors.WithLabelValues(c.String(), op)
		}
	}
}

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Error counts a failed op; nil errors are not counted.
func (m *Metrics) Error(op string, err error) {
	if m == nil || err == nil {
		return
	}
	m.Errors.WithLabelValues(errdefs.CategoryOf(err).String(), op).Inc()
}

// SandboxState moves one sandbox from state from to state to; an empty
// from adds a sandbox, an empty to removes one.
func (m *Metrics) SandboxState(from, to string) {
	if m == nil || from == to {
		return
	}
	if from != "" {
		m.Sandboxes.WithLabelValues(from).Dec()
	}
	if to != "" {
		m.Sandboxes.WithLabelValues(to).Inc()
	}
}

// ObserveCreate records the latency of a successful create.
func (m *Metrics) ObserveCreate(seconds float64) {
	if m == nil {
		return
	}
	m.CreateSeconds.Observe(seconds)
}

// ObserveExec records the duration of one exec.
func (m *Metrics) ObserveExec(seconds float64) {
	if m == nil {
		return
	}
	m.ExecSeconds.Observe(seconds)
}

// ObservePause records a successful pause and the bytes it gave back.
func (m *Metrics) ObservePause(reclaim bool, d time.Duration, reclaimed uint64) {
	if m == nil {
		return
	}
	m.PauseSeconds.WithLabelValues(strconv.FormatBool(reclaim)).Observe(d.Seconds())
	m.ReclaimedBytes.Add(float64(reclaimed))
}

// ObserveResume records a successful resume.
func (m *Metrics) ObserveResume(d time.Duration) {
	if m == nil {
		return
	}
	m.ResumeSeconds.Observe(d.Seconds())
}

// ObserveHibernate records a successful hibernation's checkpoint.
func (m *Metrics) ObserveHibernate(d time.Duration, bytes int64) {
	if m == nil {
		return
	}
	m.HibernateSeconds.Observe(d.Seconds())
	m.CheckpointBytes.Add(float64(bytes))
}

// ObserveRestore records a successful restore from a checkpoint, its
// memory lazily or not.
func (m *Metrics) ObserveRestore(d time.Duration, lazy bool) {
	if m == nil {
		return
	}
	m.RestoreSeconds.WithLabelValues(map[bool]string{true: "lazy", false: "eager"}[lazy]).Observe(d.Seconds())
}

// SandboxEnded counts a sandbox that ended for reason.
func (m *Metrics) SandboxEnded(reason string) {
	if m == nil {
		return
	}
	m.Deleted.WithLabelValues(reason).Inc()
}

// TrajectoryCall counts one mutating call served in mode (live,
// replayed, unrecorded).
func (m *Metrics) TrajectoryCall(mode string) {
	if m == nil {
		return
	}
	m.TrajectoryCalls.WithLabelValues(mode).Inc()
}

// Archive counts n tar bytes of an archive call in direction (out, in).
func (m *Metrics) Archive(direction string, n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.ArchiveBytes.WithLabelValues(direction).Add(float64(n))
}

// TrajectoryMismatch counts one replayed call refused for a mismatch.
func (m *Metrics) TrajectoryMismatch() {
	if m == nil {
		return
	}
	m.TrajectoryMismatches.Inc()
}

// TrajectoryBytesFunc registers warren_trajectory_log_bytes: the size of
// every sandbox's trajectory log on the node's disk.
func (m *Metrics) TrajectoryBytesFunc(f func() int64) {
	if m == nil {
		return
	}
	m.replace(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "warren_trajectory_log_bytes",
		Help: "Bytes of the trajectory logs of the node's sandboxes on disk.",
	}, func() float64 { return float64(f()) }))
}

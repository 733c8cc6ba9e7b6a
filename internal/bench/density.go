package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// DensityConfig configures `warren bench density`.
type DensityConfig struct {
	N           int
	Concurrency int  // creates (and deletes) in flight
	Peers       bool // also N idle unshare+chroot and crun containers
	// KmemTrace > 0 creates that many more sandboxes, one at a time, with
	// the kernel's kmem tracepoints on (after the measurements of the N),
	// and reports the slab objects they keep by allocating call site.
	KmemTrace int
	// IdleWindow is how long the daemon's CPU is measured with the N
	// sandboxes idle (default 30 s), after IdleSettle (default 64 s: the
	// daemon's looks at idle sandboxes back off to one every 32 s).
	IdleWindow, IdleSettle time.Duration
}

// DensityReport is the result of `warren bench density`. Memory is in
// KiB; "per sandbox" values divide a delta by N.
type DensityReport struct {
	Benchmark   string `json:"benchmark"`
	Daemon      string `json:"daemon"`
	N           int    `json:"n"`
	Concurrency int    `json:"concurrency"`

	// (MemAvailable before - after) / N, both read after sync and
	// drop_caches: everything the node spends, kernel included.
	NodeKiBPerSandbox float64 `json:"node_kib_per_sandbox"`
	// The daemon's Pss (smaps_rollup) and VmRSS growth / N.
	DaemonKiBPerSandbox    *float64 `json:"daemon_kib_per_sandbox"`
	DaemonRSSKiBPerSandbox *float64 `json:"daemon_rss_kib_per_sandbox"`
	// Sum of the sandbox inits' (agents') Pss / N, and their mean RSS.
	AgentPssKiB *float64 `json:"agent_pss_kib"`
	AgentRSSKiB *float64 `json:"agent_rss_kib,omitempty"`
	AgentsFound int      `json:"agents_found"`
	// Memory charged to the sandboxes' cgroups (the daemon's cgroup
	// parent, v1 memory.usage_in_bytes, kernel memory included) / N.
	CgroupKiBPerSandbox *float64 `json:"cgroup_kib_per_sandbox,omitempty"`

	CreateS        float64 `json:"create_s"`
	CreatePerS     float64 `json:"create_per_s"`
	CreateP50      float64 `json:"create_p50_ms"`
	CreateP99      float64 `json:"create_p99_ms"`
	CreateFirstP50 float64 `json:"create_first_10pct_p50_ms"`
	CreateLastP50  float64 `json:"create_last_10pct_p50_ms"`
	Created        int     `json:"created"`
	CreateErrors   int     `json:"create_errors"`
	Verified       int     `json:"verified"`
	VerifyFailed   int     `json:"verify_failed"`
	DeleteS        float64 `json:"delete_s"`
	DeletePerS     float64 `json:"delete_per_s"`
	NodeKiBNotBack float64 `json:"node_kib_not_returned"`
	// ReaperS is how long after the last delete the daemon's reaper took
	// to remove the deleted sandboxes' writable layers (private daemon
	// only).
	ReaperS          float64 `json:"reaper_s,omitempty"`
	MemoryReturnedPc float64 `json:"memory_returned_pct"`

	// The daemon's CPU time over IdleWindowS while the N sandboxes sat
	// idle, in percent of one core (its guard's looks at every sandbox,
	// timers, the runtime): the cost of an idle fleet to the node.
	DaemonIdleCPUPct *float64 `json:"daemon_idle_cpu_pct,omitempty"`
	// The sandboxes' own CPU time over the same window (the daemon's
	// cgroup parent), percent of one core.
	SandboxesIdleCPUPct *float64 `json:"sandboxes_idle_cpu_pct,omitempty"`
	IdleWindowS         float64  `json:"idle_window_s,omitempty"`
	IdleSettleS         float64  `json:"idle_settle_s,omitempty"`

	DaemonFDsPeak   int    `json:"daemon_fds_peak"`
	DaemonNofile    string `json:"daemon_nofile_soft"`
	BenchNofile     uint64 `json:"bench_nofile_soft"`
	MemAvailBefore  int64  `json:"mem_available_before_kib"`
	MemAvailCreated int64  `json:"mem_available_created_kib"`
	MemAvailDeleted int64  `json:"mem_available_deleted_kib"`
	// Memory cgroups the kernel holds (offline ones included) at each
	// reading; readings wait until this stops falling.
	MemcgsBefore  int64 `json:"memcgs_before"`
	MemcgsCreated int64 `json:"memcgs_created"`
	MemcgsDeleted int64 `json:"memcgs_deleted"`
	// The same after the delete, before caches are dropped: a deleted
	// sandbox's memory cgroup that page cache still pins counts here
	// (cgroups.LeftoverCacheMax).
	MemcgsDeletedCached int64 `json:"memcgs_deleted_cached"`

	// Kernel slab of one new empty memory cgroup, before the sandboxes
	// were created and while they exist (see memcgCostKiB).
	MemcgCostBeforeKiB *float64 `json:"memcg_cost_before_kib,omitempty"`
	MemcgCostAtNKiB    *float64 `json:"memcg_cost_at_n_kib,omitempty"`

	// /proc/meminfo deltas (after create - before) / N: where the node
	// memory went.
	MeminfoKiBPerSandbox map[string]float64 `json:"meminfo_kib_per_sandbox,omitempty"`
	// The sum of the meminfo deltas (anon, shmem, all slab, kernel stacks,
	// page tables, percpu) per sandbox: what the node spends on it, counted
	// by kind. Unlike the MemAvailable delta it is not moved by memory the
	// kernel frees meanwhile (e.g. offline memory cgroups of an earlier
	// run), so it compares systems measured one after another fairly.
	AccountedKiBPerSandbox float64 `json:"accounted_kib_per_sandbox,omitempty"`
	// The slab caches that grew most, per sandbox (/proc/slabinfo).
	SlabKiBPerSandbox []SlabDelta `json:"slab_kib_per_sandbox,omitempty"`
	// With --kmem-trace M: the slab objects M more sandboxes keep, per
	// sandbox, in all and by the kernel function that allocated them.
	KmemTraced        int        `json:"kmem_traced,omitempty"`
	KmemKiBPerSandbox float64    `json:"kmem_kib_per_sandbox,omitempty"`
	KmemSites         []KmemSite `json:"kmem_sites,omitempty"`

	Peers []DensityPeerRow `json:"peers,omitempty"`
	Notes []string         `json:"notes,omitempty"`
	Error string           `json:"error,omitempty"`
}

// DensityPeerRow is N idle peer instances measured the same way.
type DensityPeerRow struct {
	System            string  `json:"system"`
	N                 int     `json:"n"`
	NodeKiBPerSandbox float64 `json:"node_kib_per_sandbox"`
	PssKiB            float64 `json:"pss_kib"` // sum of the instances' processes' Pss / N
	CreateS           float64 `json:"create_s"`
	DeleteS           float64 `json:"delete_s"`
	NodeKiBNotBack    float64 `json:"node_kib_not_returned"`
	// Where the memory went, as for the sandboxes.
	AccountedKiBPerSandbox float64            `json:"accounted_kib_per_sandbox,omitempty"`
	MeminfoKiBPerSandbox   map[string]float64 `json:"meminfo_kib_per_sandbox,omitempty"`
	SlabKiBPerSandbox      []SlabDelta        `json:"slab_kib_per_sandbox,omitempty"`
	Note                   string             `json:"note,omitempty"`
	Error                  string             `json:"error,omitempty"`
}

// RunDensity creates N idle sandboxes and measures what they cost.
func RunDensity(ctx context.Context, env *Env, cfg DensityConfig, benchNofile uint64) (*DensityReport, error) {
	if cfg.Concurrency < 1 {
		cfg.Concurrency = 8
	}
	rep := &DensityReport{Benchmark: "density", Daemon: env.describe(), N: cfg.N, Concurrency: cfg.Concurrency, BenchNofile: benchNofile}
	rep.checkLimits(env, cfg.N)
	if v := memcgCostKiB(); v >= 0 {
		rep.MemcgCostBeforeKiB = ptr(v)
	}

	before, err := settledMemAvailable()
	if err != nil {
		return nil, err
	}
	rep.MemAvailBefore = before
	rep.MemcgsBefore = memcgCount()
	miBefore, _ := readMeminfo()
	slabBefore := readSlabinfo()
	var dBefore procMem
	var agentsBefore []int
	if env.DaemonPid > 0 {
		if dBefore, err = readProcMem(env.DaemonPid); err != nil {
			return nil, fmt.Errorf("daemon memory: %w", err)
		}
		agentsBefore, _ = childrenOf(env.DaemonPid)
	}
	cgBefore := cgroupMemKiB(env)

	env.logf("density: creating %d sandboxes, %d at a time", cfg.N, cfg.Concurrency)
	var (
		mu  sync.Mutex
		ids []string
		lat = make([]time.Duration, cfg.N)
		seq int
	)
	progress := max(cfg.N/10, 1)
	res := Loop(ctx, cfg.N, 0, cfg.Concurrency, 1, func(ctx context.Context, _ int) ([]time.Duration, error) {
		t0 := time.Now()
		sb, err := env.Client.Create(ctx, env.CreateRequest())
		d := time.Since(t0)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		ids = append(ids, sb.GetId())
		if seq < len(lat) {
			lat[seq] = d
		}
		seq++
		if seq%progress == 0 {
			env.logf("density: %d created", seq)
		}
		mu.Unlock()
		return []time.Duration{d}, nil
	})
	rep.Created, rep.CreateErrors = res.Done, res.Errors
	rep.CreateS = round(res.Wall.Seconds(), 3)
	rep.CreatePerS = round(res.PerSecond(), 1)
	s := Summarize(res.Samples[0])
	rep.CreateP50, rep.CreateP99 = round(s.P50, 3), round(s.P99, 3)
	if done := lat[:min(seq, len(lat))]; len(done) >= 10 {
		k := len(done) / 10
		rep.CreateFirstP50 = round(Summarize(done[:k]).P50, 3)
		rep.CreateLastP50 = round(Summarize(done[len(done)-k:]).P50, 3)
	}
	if res.FirstErr != nil {
		rep.Error = "create: " + res.FirstErr.Error()
	}
	if len(ids) == 0 {
		return rep, nil
	}
	n := float64(len(ids))

	env.logf("density: measuring")
	if env.DaemonPid > 0 {
		rep.measureIdleCPU(env, cfg.IdleSettle, cfg.IdleWindow)
		rep.DaemonFDsPeak = countFDs(env.DaemonPid)
		if dAfter, err := readProcMem(env.DaemonPid); err == nil {
			rep.DaemonKiBPerSandbox = ptr(float64(dAfter.Pss-dBefore.Pss) / n)
			rep.DaemonRSSKiBPerSandbox = ptr(float64(dAfter.RSS-dBefore.RSS) / n)
		}
		agents, _ := childrenOf(env.DaemonPid)
		agents = slices.DeleteFunc(agents, func(p int) bool { return slices.Contains(agentsBefore, p) })
		pss, found := sumPss(agents)
		var rss int64
		for _, a := range agents {
			if m, err := readProcMem(a); err == nil {
				rss += m.RSS
			}
		}
		rep.AgentsFound = found
		rep.AgentPssKiB = ptr(float64(pss) / n)
		if found > 0 {
			rep.AgentRSSKiB = ptr(float64(rss) / float64(found))
		}
	}
	if cgBefore >= 0 {
		if cg := cgroupMemKiB(env); cg >= 0 {
			rep.CgroupKiBPerSandbox = ptr(float64(cg-cgBefore) / n)
		}
	}
	created, err := settledMemAvailable()
	if err != nil {
		return nil, err
	}
	rep.MemAvailCreated = created
	rep.MemcgsCreated = memcgCount()
	if v := memcgCostKiB(); v >= 0 {
		rep.MemcgCostAtNKiB = ptr(v)
	}
	rep.NodeKiBPerSandbox = round(float64(before-created)/n, 1)
	rep.SlabKiBPerSandbox = topSlabDeltas(slabBefore, readSlabinfo(), n, 12)
	rep.MeminfoKiBPerSandbox = meminfoDeltas(miBefore, n)
	rep.AccountedKiBPerSandbox = accounted(rep.MeminfoKiBPerSandbox)

	// A random 1% (at least one) must still answer.
	k := max(1, len(ids)/100)
	env.logf("density: checking that %d random sandboxes answer exec", k)
	for _, i := range rand.Perm(len(ids))[:k] {
		r, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: ids[i], Argv: []string{"true"}})
		if err == nil && r.GetExitCode() == 0 {
			rep.Verified++
		} else {
			rep.VerifyFailed++
		}
	}

	if cfg.KmemTrace > 0 {
		env.logf("density: tracing the slab allocations of %d more sandboxes", cfg.KmemTrace)
		tr, err := traceKmem(cfg.KmemTrace, func() error {
			for i := 0; i < cfg.KmemTrace; i++ {
				sb, err := env.Client.Create(ctx, env.CreateRequest())
				if err != nil {
					return fmt.Errorf("create: %w", err)
				}
				ids = append(ids, sb.GetId())
			}
			return nil
		})
		if err != nil {
			rep.Notes = append(rep.Notes, "kmem trace: "+err.Error())
		} else {
			rep.KmemTraced, rep.KmemKiBPerSandbox = tr.Sandboxes, tr.KiB
			rep.KmemSites = tr.Sites[:min(len(tr.Sites), 40)]
			rep.Notes = append(rep.Notes, fmt.Sprintf("kmem trace: slab objects allocated while %d more sandboxes were created (one at a time, after the measurements above) and still allocated after drop_caches and 2 s, by allocating function (kmem tracepoints); everything the node allocated in that window counts", tr.Sandboxes))
			if tr.Overrun {
				rep.Notes = append(rep.Notes, "kmem trace: the trace buffer overran, so the traced numbers undercount")
			}
		}
	}

	env.logf("density: deleting %d sandboxes", len(ids))
	t0 := time.Now()
	derr := deleteIDs(ctx, env.Client, ids, cfg.Concurrency)
	rep.DeleteS = round(time.Since(t0).Seconds(), 3)
	rep.DeletePerS = round(n/time.Since(t0).Seconds(), 1)
	if derr != nil {
		rep.Error = strings.TrimPrefix(rep.Error+"; ", "; ") + "delete: " + derr.Error()
	}
	// A delete hands the writable layer and the root overlay to the
	// daemon's background reaper: count the memory once it is done.
	if s, ok := env.waitTrashEmpty(2 * time.Minute); ok {
		rep.ReaperS = round(s, 2)
	}
	rep.MemcgsDeletedCached = memcgCount()
	deleted, err := settledMemAvailable()
	if err != nil {
		return nil, err
	}
	rep.MemAvailDeleted = deleted
	rep.MemcgsDeleted = memcgCount()
	rep.NodeKiBNotBack = float64(before - deleted)
	if before > created {
		rep.MemoryReturnedPc = round(100*float64(deleted-created)/float64(before-created), 1)
		if rep.MemoryReturnedPc < 80 || rep.MemoryReturnedPc > 120 {
			rep.Notes = append(rep.Notes, "memory returned is far from 100%: other processes changed the node's memory during the run, so node_kib_per_sandbox is noisy too")
		}
	}

	if cfg.Peers {
		rep.Peers = densityPeers(ctx, env, cfg)
	}
	return rep, nil
}

// measureIdleCPU reads the daemon's CPU time (and the sandboxes', where
// a private daemon's cgroup parent says where they are) across window.
func (r *DensityReport) measureIdleCPU(env *Env, settle, window time.Duration) {
	if window <= 0 {
		window = 30 * time.Second
	}
	if settle > 0 {
		env.logf("density: letting the sandboxes sit idle for %s", settle)
		time.Sleep(settle)
	}
	r.IdleSettleS = settle.Seconds()
	env.logf("density: measuring the daemon's CPU for %s with the sandboxes idle", window)
	d0, err := procCPUTime(env.DaemonPid)
	if err != nil {
		r.Notes = append(r.Notes, "daemon idle CPU: "+err.Error())
		return
	}
	s0 := cgroupCPUTime(env)
	t0 := time.Now()
	time.Sleep(window)
	d1, err := procCPUTime(env.DaemonPid)
	if err != nil {
		r.Notes = append(r.Notes, "daemon idle CPU: "+err.Error())
		return
	}
	s1 := cgroupCPUTime(env)
	wall := time.Since(t0)
	r.IdleWindowS = round(wall.Seconds(), 1)
	r.DaemonIdleCPUPct = ptr(round(100*(d1-d0).Seconds()/wall.Seconds(), 2))
	if s0 >= 0 && s1 >= s0 {
		r.SandboxesIdleCPUPct = ptr(round(100*(s1-s0).Seconds()/wall.Seconds(), 2))
	}
}

// cgroupCPUTime is the CPU time used below a private daemon's cgroup
// parent (v1 cpuacct or v2 cpu.stat), -1 when not available.
func cgroupCPUTime(env *Env) time.Duration {
	if !env.Private || env.cgroupParent == "" {
		return -1
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", env.cgroupParent, "cpuacct.usage")); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return time.Duration(v)
		}
	}
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup", env.cgroupParent, "cpu.stat"),
		filepath.Join("/sys/fs/cgroup/unified", env.cgroupParent, "cpu.stat"),
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					return time.Duration(n) * time.Microsecond
				}
			}
		}
	}
	return -1
}

// checkLimits notes the limits that matter for N sandboxes.
func (r *DensityReport) checkLimits(env *Env, n int) {
	if env.DaemonPid > 0 {
		soft, hard := nofileLimit(env.DaemonPid)
		r.DaemonNofile = soft
		if v, err := strconv.Atoi(soft); err == nil && v < n+1024 {
			r.Notes = append(r.Notes, fmt.Sprintf("daemon RLIMIT_NOFILE %s (hard %s) is close to N=%d: on hosts without cgroup2 groups (pure v1) it holds a pidfd per sandbox", soft, hard, n))
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v < 2*n+4096 {
			r.Notes = append(r.Notes, fmt.Sprintf("kernel.pid_max %d is low for N=%d", v, n))
		}
	}
}

// cgroupMemKiB reads the memory charged below a private daemon's cgroup
// parent (v1), -1 when not available.
func cgroupMemKiB(env *Env) int64 {
	if !env.Private || env.cgroupParent == "" {
		return -1
	}
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory", env.cgroupParent, "memory.usage_in_bytes"),
		filepath.Join("/sys/fs/cgroup", env.cgroupParent, "memory.current"),
	} {
		if b, err := os.ReadFile(p); err == nil {
			if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				return v / 1024
			}
		}
	}
	// The parent appears with the first sandbox: before that it is empty.
	return 0
}

// Table prints the density report.
func (r *DensityReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "density: %d idle sandboxes, created %d at a time (daemon: %s)\n\n", r.N, r.Concurrency, r.Daemon)
	t := newTable("METRIC", "VALUE")
	t.left = true
	f := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f", *v)
	}
	f2 := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f", *v)
	}
	t.add("node memory per sandbox (MemAvailable delta, caches dropped)", fmt.Sprintf("%.1f KiB", r.NodeKiBPerSandbox))
	t.add("accounted per sandbox (sum of the meminfo deltas below)", fmt.Sprintf("%.1f KiB", r.AccountedKiBPerSandbox))
	t.add("daemon Pss growth per sandbox", f(r.DaemonKiBPerSandbox)+" KiB")
	t.add("daemon RSS growth per sandbox", f(r.DaemonRSSKiBPerSandbox)+" KiB")
	t.add("agent Pss per sandbox (sum / N)", f(r.AgentPssKiB)+" KiB")
	t.add("agent RSS (mean)", f(r.AgentRSSKiB)+" KiB")
	t.add("cgroup-charged memory per sandbox", f(r.CgroupKiBPerSandbox)+" KiB")
	if len(r.MeminfoKiBPerSandbox) > 0 {
		t.add("/proc/meminfo deltas per sandbox (KiB)", formatMeminfo(r.MeminfoKiBPerSandbox))
	}
	if len(r.SlabKiBPerSandbox) > 0 {
		t.add("largest slab caches per sandbox (KiB)", formatSlab(r.SlabKiBPerSandbox))
	}
	t.add("created / errors", fmt.Sprintf("%d / %d", r.Created, r.CreateErrors))
	t.add("create wall time", fmt.Sprintf("%.2f s (%.0f/s)", r.CreateS, r.CreatePerS))
	t.add("create latency p50 / p99", fmt.Sprintf("%s / %s ms", ms(r.CreateP50), ms(r.CreateP99)))
	t.add("create p50, first 10% / last 10%", fmt.Sprintf("%s / %s ms", ms(r.CreateFirstP50), ms(r.CreateLastP50)))
	if r.DaemonIdleCPUPct != nil {
		t.add(fmt.Sprintf("daemon CPU with the sandboxes idle (%.0f s, after %.0f s idle)", r.IdleWindowS, r.IdleSettleS), f2(r.DaemonIdleCPUPct)+"% of a core")
	}
	if r.SandboxesIdleCPUPct != nil {
		t.add("the idle sandboxes' own CPU", f2(r.SandboxesIdleCPUPct)+"% of a core")
	}
	t.add("random 1% answering exec", fmt.Sprintf("%d ok, %d failed", r.Verified, r.VerifyFailed))
	if r.KmemTraced > 0 {
		var top []string
		for _, s := range r.KmemSites[:min(len(r.KmemSites), 15)] {
			top = append(top, fmt.Sprintf("%s (%s) %.1f", s.Site, s.Cache, s.KiB))
		}
		t.add(fmt.Sprintf("slab kept per sandbox, traced on %d (KiB)", r.KmemTraced), fmt.Sprintf("%.1f: %s", r.KmemKiBPerSandbox, strings.Join(top, ", ")))
	}
	t.add("delete wall time", fmt.Sprintf("%.2f s (%.0f/s)", r.DeleteS, r.DeletePerS))
	if r.ReaperS > 0 {
		t.add("reaper done after the last delete", fmt.Sprintf("%.2f s", r.ReaperS))
	}
	t.add("memory returned after delete", fmt.Sprintf("%.1f%% (%.0f KiB not back)", r.MemoryReturnedPc, r.NodeKiBNotBack))
	t.add("daemon fds at peak / RLIMIT_NOFILE", fmt.Sprintf("%d / %s", r.DaemonFDsPeak, r.DaemonNofile))
	t.add("memory cgroups on the node: before / with N / after delete", fmt.Sprintf("%d / %d / %d", r.MemcgsBefore, r.MemcgsCreated, r.MemcgsDeleted))
	t.add("  after delete, before caches were dropped (dying ones)", fmt.Sprintf("%d", r.MemcgsDeletedCached))
	t.add("slab of one new memory cgroup, before / at N", f(r.MemcgCostBeforeKiB)+" / "+f(r.MemcgCostAtNKiB)+" KiB")
	if err := t.write(w); err != nil {
		return err
	}
	if len(r.Peers) > 0 {
		fmt.Fprintln(w)
		pt := newTable("PEER", "N", "NODE KiB/EACH", "ACCOUNTED KiB/EACH", "PSS KiB/EACH", "CREATE s", "DELETE s", "KiB NOT BACK")
		for _, p := range r.Peers {
			pt.add(p.System, strconv.Itoa(p.N), fmt.Sprintf("%.1f", p.NodeKiBPerSandbox), fmt.Sprintf("%.1f", p.AccountedKiBPerSandbox), fmt.Sprintf("%.1f", p.PssKiB),
				fmt.Sprintf("%.2f", p.CreateS), fmt.Sprintf("%.2f", p.DeleteS), fmt.Sprintf("%.0f", p.NodeKiBNotBack))
		}
		if err := pt.write(w); err != nil {
			return err
		}
		for _, p := range r.Peers {
			if len(p.MeminfoKiBPerSandbox) > 0 {
				fmt.Fprintf(w, "%s, per instance (KiB): %s\n", p.System, formatMeminfo(p.MeminfoKiBPerSandbox))
			}
			if len(p.SlabKiBPerSandbox) > 0 {
				fmt.Fprintf(w, "%s, largest slab caches (KiB): %s\n", p.System, formatSlab(p.SlabKiBPerSandbox))
			}
		}
		for _, p := range r.Peers {
			if p.Note != "" {
				fmt.Fprintf(w, "note: %s: %s\n", p.System, p.Note)
			}
			if p.Error != "" {
				fmt.Fprintf(w, "error: %s: %s\n", p.System, p.Error)
			}
		}
	}
	fmt.Fprintln(w)
	if r.Error != "" {
		fmt.Fprintln(w, "error: "+r.Error)
	}
	writeNotes(w, r.Notes)
	return nil
}

// meminfoDeltas reads meminfoKeys again and returns (now - before) / n.
func meminfoDeltas(before map[string]int64, n float64) map[string]float64 {
	after, err := readMeminfo()
	if err != nil || before == nil || n <= 0 {
		return nil
	}
	out := map[string]float64{}
	for _, k := range meminfoKeys {
		out[k] = round(float64(after[k]-before[k])/n, 1)
	}
	return out
}

func formatMeminfo(m map[string]float64) string {
	var parts []string
	for _, k := range meminfoKeys {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func formatSlab(ds []SlabDelta) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("%s %.1f", d.Cache, d.KiB))
	}
	return strings.Join(parts, ", ")
}

// accounted sums the meminfo deltas: anon, shmem, slab (which includes
// SUnreclaim), kernel stacks, page tables, percpu.
func accounted(m map[string]float64) float64 {
	var sum float64
	for _, k := range []string{"AnonPages", "Shmem", "Slab", "KernelStack", "PageTables", "Percpu"} {
		sum += m[k]
	}
	return round(sum, 1)
}

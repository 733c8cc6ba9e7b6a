package daemon

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// gathered finds metric family name in the registry's current output.
func (e *env) gathered(name string) *dto.MetricFamily {
	e.t.Helper()
	fams, err := e.metrics.Registry.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	return nil
}

// TestWorkloadStatistics: a sandbox's memory is told apart by kind (its
// anonymous memory, page cache and kernel memory, in SandboxStats and
// summed over the node in warren_sandbox_memory_bytes{kind}); the
// daemon's periodic looks record running sandboxes' CPU use (a busy one
// near a whole CPU, an idle one near none) in
// warren_sandbox_cpu_utilisation; a deleted sandbox's lifetime goes to
// warren_sandbox_lifetime_seconds{reason}; warren_node_memory_cgroups
// counts the node's memory cgroups.
func TestWorkloadStatistics(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.GuardInterval = 200 * time.Millisecond })
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "mem", Resources: &warrenv1.Resources{MemoryBytes: 512 << 20}})
	// 48 MiB in a shell variable (anonymous), 16 MiB written to a file
	// (page cache), held until killed (the shell waits for its sleep:
	// a last command would be exec'd in its place).
	if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "mem", Argv: []string{"sh", "-c",
		"x=$(head -c 50331648 /dev/zero | tr '\\0' a); dd if=/dev/zero of=/tmp/f bs=1M count=16 2>/dev/null; echo held > /tmp/held; sleep 1000; echo the shell waits, holding x"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the memory to be held", func() bool { return e.sh("mem", "cat /tmp/held").GetExitCode() == 0 })
	st, err := e.m.SandboxStats(ctx, &warrenv1.SandboxStatsRequest{SandboxId: "mem"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory %d: anon %d, cache %d, kernel %d, swap %d", st.GetMemoryBytes(), st.GetMemoryAnonBytes(), st.GetMemoryCacheBytes(), st.GetMemoryKernelBytes(), st.GetMemorySwapBytes())
	if st.GetMemoryAnonBytes() < 48<<20 || st.GetMemoryCacheBytes() < 16<<20 || st.GetMemoryKernelBytes() == 0 {
		t.Errorf("memory kinds: anon %d (want >= 48 MiB), cache %d (want >= 16 MiB), kernel %d (want > 0)",
			st.GetMemoryAnonBytes(), st.GetMemoryCacheBytes(), st.GetMemoryKernelBytes())
	}
	if st.GetMemoryAnonBytes()+st.GetMemoryCacheBytes() > st.GetMemoryBytes() {
		t.Errorf("anon %d + cache %d exceed the memory charged, %d", st.GetMemoryAnonBytes(), st.GetMemoryCacheBytes(), st.GetMemoryBytes())
	}
	// The node's sums are the cgroup parent's hierarchical counters,
	// which the kernel brings up to date from its children within about
	// 2 s (its periodic statistics flush).
	kinds := map[string]float64{}
	eventually(t, 20*time.Second, "warren_sandbox_memory_bytes to count the sandbox", func() bool {
		for _, m := range e.gathered("warren_sandbox_memory_bytes").GetMetric() {
			kinds[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
		return kinds["anon"] >= 48<<20 && kinds["file"] >= 16<<20 && kinds["kernel"] > 0
	})
	t.Logf("warren_sandbox_memory_bytes: %v", kinds)

	// A busy sandbox beside the idle one: the histogram gets
	// observations near 1 CPU and near 0.
	e.create(&warrenv1.CreateRequest{Id: "busy"})
	// The node's memory cgroups: the root's and these two at least.
	if f := e.gathered("warren_node_memory_cgroups"); f == nil || f.GetMetric()[0].GetGauge().GetValue() < 3 {
		t.Errorf("warren_node_memory_cgroups with two sandboxes running: %v, want >= 3", f)
	}
	if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "busy", Argv: []string{"sh", "-c", "while :; do :; done"}}); err != nil {
		t.Fatal(err)
	}
	bucket := func(le float64) (below, total uint64) {
		h := e.gathered("warren_sandbox_cpu_utilisation").GetMetric()[0].GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == le {
				below = b.GetCumulativeCount()
			}
		}
		return below, h.GetSampleCount()
	}
	eventually(t, time.Minute, "idle and busy looks", func() bool {
		idle, total := bucket(0.05)
		return idle >= 3 && total-func() uint64 { b, _ := bucket(0.25); return b }() >= 3
	})

	before := e.gathered("warren_sandbox_lifetime_seconds")
	count := func(f *dto.MetricFamily) uint64 {
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == "user" {
				return m.GetHistogram().GetSampleCount()
			}
		}
		return 0
	}
	n := count(before)
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "busy"}); err != nil {
		t.Fatal(err)
	}
	if got := count(e.gathered("warren_sandbox_lifetime_seconds")); got != n+1 {
		t.Errorf("lifetimes of deleted sandboxes: %d, want %d", got, n+1)
	}
}

// TestIdleReclaim: a running sandbox idle for IdleReclaimAfter (no CPU at
// the guard's looks) gives its page cache back without being stopped, once
// per idle spell; a busy one beside it keeps its cache.
func TestIdleReclaim(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.GuardInterval = 100 * time.Millisecond
		c.IdleReclaimAfter = time.Second
	})
	ctx := ctxT(t)
	for _, id := range []string{"idle", "busy"} {
		e.create(&warrenv1.CreateRequest{Id: id, Resources: &warrenv1.Resources{MemoryBytes: 512 << 20}})
		// 32 MiB of page cache; the busy one then spins.
		loop := "sleep 1000; echo waited"
		if id == "busy" {
			loop = "while :; do :; done"
		}
		if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"sh", "-c",
			"dd if=/dev/zero of=/tmp/f bs=1M count=32 2>/dev/null; cat /tmp/f > /dev/null; echo > /tmp/ready; " + loop}}); err != nil {
			t.Fatal(err)
		}
	}
	cache := func(id string) uint64 {
		st, err := e.m.SandboxStats(ctx, &warrenv1.SandboxStatsRequest{SandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetMemoryCacheBytes()
	}
	eventually(t, time.Minute, "the page cache to be filled", func() bool {
		return e.sh("idle", "cat /tmp/ready").GetExitCode() == 0 && e.sh("busy", "cat /tmp/ready").GetExitCode() == 0
	})
	// A reclaim takes it below 8 MiB; the node's own reclaim (kswapd,
	// DAMON here) may take a few pages of any cgroup, so the bar is 24 MiB.
	if c := cache("busy"); c < 24<<20 {
		t.Fatalf("busy sandbox's page cache %d, want >= 24 MiB of its 32", c)
	}
	eventually(t, time.Minute, "the idle sandbox's page cache to be reclaimed", func() bool { return cache("idle") < 8<<20 })
	// The counters move once the reclaim returned, after the cache went.
	eventually(t, time.Minute, "the reclaim to be counted", func() bool {
		return e.gathered("warren_idle_reclaims_total").GetMetric()[0].GetCounter().GetValue() >= 1 &&
			e.gathered("warren_idle_reclaimed_bytes_total").GetMetric()[0].GetCounter().GetValue() >= 24<<20
	})
	if r := e.sh("idle", "echo alive"); string(r.GetStdout()) != "alive\n" {
		t.Errorf("the idle sandbox after its reclaim: %v", r)
	}
	// Idle again since that exec, the same spell or a new one: reclaimed
	// at most once more meanwhile; the busy one never.
	time.Sleep(1500 * time.Millisecond)
	if c := cache("busy"); c < 24<<20 {
		t.Errorf("busy sandbox's page cache went down to %d (reclaimed)", c)
	}
}

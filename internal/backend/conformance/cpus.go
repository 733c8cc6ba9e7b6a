package conformance

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/backend"
)

// cpuViews: a sandbox sees the CPUs its quota gives it, not the node's:
// nproc (sched_getaffinity), /sys/devices/system/cpu/online (glibc's
// get_nprocs, Python's os.cpu_count) and /proc/cpuinfo all count
// ceil(cpu_millis / 1000), so make -j$(nproc), JVMs and process pools
// size themselves to the sandbox; and an Update of the quota changes
// what it sees (not where the harness says the CPUs are fixed at
// create). A sandbox without a quota sees every CPU.
func cpuViews(t *testing.T, b backend.Backend, h Harness) {
	ncpu := runtime.NumCPU()
	if ncpu < 2 {
		t.Skip("the node has one CPU: every quota sees all of it")
	}
	count := func(sb backend.Sandbox) []int {
		t.Helper()
		r := sh(t, sb, "nproc; cat /sys/devices/system/cpu/online; grep -c ^processor /proc/cpuinfo")
		f := strings.Fields(r.Stdout)
		if len(f) != 3 {
			t.Fatalf("views: %+v", r)
		}
		online := 0
		for _, part := range strings.Split(f[1], ",") {
			lo, hi, isRange := strings.Cut(part, "-")
			a, _ := strconv.Atoi(lo)
			z := a
			if isRange {
				z, _ = strconv.Atoi(hi)
			}
			online += z - a + 1
		}
		n, _ := strconv.Atoi(f[0])
		c, _ := strconv.Atoi(f[2])
		return []int{n, online, c}
	}
	want := func(got []int, n int, what string) {
		t.Helper()
		if got[0] != n || got[1] != n || got[2] != n {
			t.Errorf("%s: nproc %d, online CPUs %d, /proc/cpuinfo processors %d; want %d each", what, got[0], got[1], got[2], n)
		}
	}
	half := create(t, b, h, func(s *backend.Spec) { s.CPUMillis = 500 })
	want(count(half), 1, "a sandbox of half a core")
	none := create(t, b, h, nil)
	want(count(none), ncpu, "a sandbox without a quota")
	if r := sh(t, half, "cat /proc/cpuinfo | grep -c '^model name\\|^vendor_id\\|^flags\\|^CPU implementer'"); r.Stdout == "0\n" {
		t.Errorf("the CPU view lost the processor's description: %+v", r)
	}

	up, ok := half.(backend.Updater)
	if !ok || h.FixedCPUs {
		return
	}
	ctx := context.Background()
	all := int64(ncpu * 1000)
	if err := up.Update(ctx, backend.Update{CPUMillis: &all}); err != nil {
		t.Fatal(err)
	}
	want(count(half), ncpu, "after raising the quota to every CPU")
	one := int64(1000)
	if err := up.Update(ctx, backend.Update{CPUMillis: &one}); err != nil {
		t.Fatal(err)
	}
	want(count(half), 1, "after lowering the quota to one core")
}

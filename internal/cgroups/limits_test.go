package cgroups

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

func i64p(v int64) *int64 { return &v }

// limitsOf reads a group's CPU quota, memory limit and pids limit back
// from its files, in the host's layout.
func limitsOf(t *testing.T, parent, name string) (cpu, mem, pids string) {
	t.Helper()
	if Mode() == "v2" {
		dir := filepath.Join(Root, parent, name)
		cpu, _, _ = strings.Cut(mustRead(t, filepath.Join(dir, "cpu.max")), " ")
		return cpu, mustRead(t, filepath.Join(dir, "memory.max")), mustRead(t, filepath.Join(dir, "pids.max"))
	}
	return mustRead(t, filepath.Join(Root, "cpu", parent, name, "cpu.cfs_quota_us")),
		mustRead(t, filepath.Join(Root, "memory", parent, name, "memory.limit_in_bytes")),
		mustRead(t, filepath.Join(Root, "pids", parent, name, "pids.max"))
}

// unlimited reports whether a limit file's value means no limit: "max",
// v1's -1 quota, or v1's page-rounded huge memory limit.
func unlimited(v string) bool {
	n, err := strconv.ParseInt(v, 10, 64)
	return v == "max" || v == "-1" || err == nil && n > 1<<60
}

// TestSetLimitsReadBack: SetLimits writes exactly the limits it is given
// (read back from the cgroup files of this host's layout), leaves the
// others alone, and 0 lifts a limit.
func TestSetLimitsReadBack(t *testing.T) {
	parent := testParent(t)
	g, err := New(parent, "sb", Resources{CPUMillis: 500, MemoryBytes: 64 << 20, PidsMax: 50})
	if err != nil {
		t.Fatal(err)
	}
	testSetLimits(t, g, parent, "sb")
	deleteGroup(t, g, parent, "sb")
}

// TestSetLimitsOldLayout: the same on a group of the legacy v1 layout (as
// pure v1 hosts have, and hybrid hosts had before the hybrid layout).
func TestSetLimitsOldLayout(t *testing.T) {
	parent := testParent(t)
	if Mode() == "v2" {
		t.Skip("no v1 hierarchies")
	}
	g := oldLayoutGroup(t, parent)
	if err := g.SetLimits(Limits{CPUMillis: i64p(500), MemoryBytes: i64p(64 << 20), PidsMax: i64p(50)}); err != nil {
		t.Fatal(err)
	}
	testSetLimits(t, g, parent, "old")
	deleteGroup(t, g, parent, "old")
}

func testSetLimits(t *testing.T, g Group, parent, name string) {
	t.Helper()
	if cpu, mem, pids := limitsOf(t, parent, name); cpu != "50000" || mem != strconv.Itoa(64<<20) || pids != "50" {
		t.Fatalf("before: cpu %s mem %s pids %s", cpu, mem, pids)
	}
	if err := g.SetLimits(Limits{CPUMillis: i64p(1500), MemoryBytes: i64p(128 << 20), PidsMax: i64p(80)}); err != nil {
		t.Fatal(err)
	}
	if cpu, mem, pids := limitsOf(t, parent, name); cpu != "150000" || mem != strconv.Itoa(128<<20) || pids != "80" {
		t.Fatalf("after: cpu %s mem %s pids %s", cpu, mem, pids)
	}
	if err := g.SetLimits(Limits{CPUMillis: i64p(0)}); err != nil {
		t.Fatal(err)
	}
	if cpu, mem, pids := limitsOf(t, parent, name); !unlimited(cpu) || mem != strconv.Itoa(128<<20) || pids != "80" {
		t.Fatalf("after cpu 0: cpu %s mem %s pids %s", cpu, mem, pids)
	}
	if err := g.SetLimits(Limits{MemoryBytes: i64p(0), PidsMax: i64p(0)}); err != nil {
		t.Fatal(err)
	}
	if _, mem, pids := limitsOf(t, parent, name); !unlimited(mem) || !unlimited(pids) {
		t.Fatalf("after 0: mem %s pids %s", mem, pids)
	}
	if err := g.SetLimits(Limits{}); err != nil {
		t.Fatalf("empty: %v", err)
	}
}

// TestSetLimitsAllOrNothing: a memory limit below what the group holds
// (anonymous memory, which cannot be reclaimed without swap) is refused
// as invalid, and the CPU quota written before it in the same call is
// put back: the group's limits are as they were.
func TestSetLimitsAllOrNothing(t *testing.T) {
	parent := testParent(t)
	g, err := New(parent, "full", Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PidsMax: 50})
	if err != nil {
		t.Fatal(err)
	}
	// 64 MiB held (a shell variable as big took 26 s to fill under the
	// group's half a CPU in a TCG guest: TestCgroupV2InAVM).
	_, start, _ := gated(t, g, anonHolder(t, 64, true), nil)
	start()
	waitFor(t, "the group to hold 64 MiB", 30*time.Second, func() bool {
		st, err := g.Stats()
		return err == nil && st.MemoryBytes > 64<<20
	})
	cpu0, mem0, pids0 := limitsOf(t, parent, "full")
	err = g.SetLimits(Limits{CPUMillis: i64p(2000), PidsMax: i64p(20), MemoryBytes: i64p(16 << 20)})
	if errdefs.CategoryOf(err) != errdefs.Invalid || !strings.Contains(err.Error(), "cannot give back") {
		t.Fatalf("limit below use: %v", err)
	}
	if cpu, mem, pids := limitsOf(t, parent, "full"); cpu != cpu0 || mem != mem0 || pids != pids0 {
		t.Fatalf("limits changed by a refused call: cpu %s mem %s pids %s", cpu, mem, pids)
	}
	if err := g.Kill(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// oldLayoutGroup makes group parent/old in the legacy v1 layout (a
// directory in every legacy hierarchy) and loads it.
func oldLayoutGroup(t *testing.T, parent string) Group {
	t.Helper()
	for _, h := range legacySubsystems {
		if err := os.MkdirAll(filepath.Join(Root, string(h), parent, "old"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	g, err := Load(parent, "old")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := g.(*v1Group); !ok {
		t.Fatalf("old layout loaded as %T", g)
	}
	return g
}

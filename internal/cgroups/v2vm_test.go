package cgroups_test

import (
	"os"
	"testing"

	"github.com/warrenrl/warren/internal/testvm"
)

// This package's tests run on the node's own layout (hybrid on the
// development machines), and again on cgroup v2, the layout of
// production nodes, in a QEMU microVM whose init is this package's test
// binary (TestCgroupV2InAVM, internal/testvm): the v2 paths (one group
// per sandbox, cgroup.kill, cgroup.freeze, memory.reclaim, cpu.idle, the
// eBPF device filter) are otherwise never run here.

func TestMain(m *testing.M) {
	testvm.Main()
	os.Exit(m.Run())
}

// TestCgroupV2InAVM runs every test of the package on cgroup v2 but
// those of the other layouts (v1, hybrid) and its own.
func TestCgroupV2InAVM(t *testing.T) {
	testvm.Run(t, testvm.Config{
		Package: "./internal/cgroups",
		Tests: []string{
			"TestNewLimitsAndLayout", "TestNewRollback", "TestProcsDevicesFreezeStats", "TestKillForkingChild",
			"TestPidsRefused", "TestFreezeReclaimThaw", "TestReclaimV2PushesToSwap", "TestMemoryLimitBoundsSwap",
			"TestDeleteReclaimsLeftovers", "TestReadKey",
			"TestSetLimitsReadBack", "TestSetLimitsAllOrNothing", "TestQoSClassesReadBack",
		},
	})
}

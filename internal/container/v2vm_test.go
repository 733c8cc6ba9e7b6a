package container

import (
	"os"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/testvm"
)

// The backend's tests run on the node's own cgroup layout (hybrid on the
// development machines); those that touch cgroups run again on cgroup
// v2, the layout of production nodes, in a QEMU microVM whose init is
// this package's test binary (internal/testvm).

func TestMain(m *testing.M) {
	testvm.Main()
	os.Exit(m.Run())
}

// TestContainerOnCgroupV2InAVM: the conformance suite (limits, update,
// pause, kill, adoption, sweeps, networks; not the disk limit, whose
// mkfs.ext4 the VM's busybox initramfs lacks), the sandbox's cgroup
// view, /dev/shm's charge and the exit monitor (cgroup.events of a v2
// group) on cgroup v2.
func TestContainerOnCgroupV2InAVM(t *testing.T) {
	testvm.Run(t, testvm.Config{
		Package: "./internal/container",
		Tests: []string{"TestConformance", "TestCgroupView", "TestDevShmCharged", "TestCPUSpread",
			"TestMonitorGroupExit", "TestMonitorGroupEmptyAtWatch", "TestLiveSandboxesHoldNoDescriptor"},
		Skip: "TestConformance/^DiskLimit$",
		// The root's overlay; what netpolicy uses: veths, nftables'
		// expressions, conntrack's netlink and TCP socket lists. A node's
		// modprobe loads them when asked; the VM has no modprobe.
		Modules: []string{"overlay", "veth", "nf_tables", "nft_ct", "nft_reject_inet", "nft_redir", "nft_masq",
			"nft_chain_nat", "nft_log", "nft_limit", "nfnetlink_log", "nf_conntrack_netlink", "tcp_diag"},
		MemoryMiB: 1536,
		Timeout:   4 * time.Minute,
	})
}

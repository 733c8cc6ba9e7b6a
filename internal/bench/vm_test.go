package bench

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/microvm"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestVMBenchRunsShort: `warren bench vm` in its shortest form (one boot
// per layer mode, one idle VM per memory configuration, a 4 MiB file)
// runs end to end on real QEMU: both boot modes report their times, every
// memory configuration (virtio-blk with and without the balloon, pmem)
// reports memory before and after the reclaim, and the snapshot part is
// the named skip while microVM sandboxes do not checkpoint.
func TestVMBenchRunsShort(t *testing.T) {
	if testing.Short() {
		t.Skip("boots five microVMs")
	}
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skipf("no qemu-system-x86_64 (scripts/vm.sh installs it): %v", err)
	}
	if _, err := guestkernel.Find(guestkernel.Dir); err != nil {
		t.Skipf("%v", err)
	}
	if _, err := erofs.FindMkfs(); err != nil {
		t.Skipf("no mkfs.erofs: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rep, err := RunVM(ctx, VMConfig{N: 1, Idle: 1, Pmem: true, LayerMiB: 4, Vsock: true,
		GuestAgent: testutil.StaticBinary(t, "./cmd/warren-guest")}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ReadyP50 <= 0 || rep.PmemReadyP50 <= 0 || rep.GuestUptimeP50 <= 0 {
		t.Fatalf("boot times: %+v", rep)
	}
	if _, err := microvm.PickVsock(""); err == nil && (rep.VsockReadyP50 <= 0 || rep.VsockDevice == "") {
		t.Fatalf("vsock boots: %+v", rep)
	} else if err != nil && rep.VsockSkip == "" {
		t.Fatalf("no vsock on the node (%v) and no skip in the report", err)
	}
	if len(rep.Memory) != 3 {
		t.Fatalf("memory configurations: %+v", rep.Memory)
	}
	for _, m := range rep.Memory {
		if m.VMs != 1 || m.PssKiB <= 0 || m.AnonKiB <= 0 || m.ReclaimedPssKiB <= 0 || m.ReclaimedAnonKiB <= 0 {
			t.Fatalf("memory %+v", m)
		}
	}
	if !microvm.SandboxCheckpoints() && rep.SnapshotSkip != "snapshot: microvm has no Checkpointer on this build" {
		t.Fatalf("snapshot skip: %q", rep.SnapshotSkip)
	}
	if microvm.SandboxCheckpoints() && (rep.CheckpointP50 <= 0 || rep.RestoreP50 <= 0 || rep.SnapshotSkip != "") {
		t.Fatalf("snapshot and restore: checkpoint p50 %v ms, restore p50 %v ms, skip %q", rep.CheckpointP50, rep.RestoreP50, rep.SnapshotSkip)
	}
}

// testWriter sends progress lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}

package microvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/qos"
)

// hostFile reads a limit of VM id's QEMU cgroup: v1 controller dir ctl
// and file v1, or the v2 file v2.
func hostFile(t *testing.T, id, ctl, v1, v2 string) string {
	t.Helper()
	name := filepath.Join(defaultCgroupParent, GroupName(Name, id))
	p := filepath.Join(cgroups.Root, ctl, name, v1)
	if cgroups.Mode() == "v2" {
		p = filepath.Join(cgroups.Root, name, v2)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// quota is the VM's host CPU quota in µs per 100 ms period (-1: none).
func quota(t *testing.T, id string) int64 {
	s := hostFile(t, id, "cpu", "cpu.cfs_quota_us", "cpu.max")
	f := strings.Fields(s)
	if f[0] == "max" {
		return -1
	}
	n, _ := strconv.ParseInt(f[0], 10, 64)
	return n
}

// hasGroup reports whether VM id's QEMU cgroup exists in any hierarchy.
func hasGroup(t *testing.T, id string) bool {
	names, err := cgroups.List(defaultCgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(names, GroupName(Name, id))
}

func waitGone(t *testing.T, id string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); hasGroup(t, id); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("VM %s's cgroup is still there", id)
		}
	}
}

func qosOf(t *testing.T, id string) (idle bool, weight uint64) {
	t.Helper()
	g, err := cgroups.Load(defaultCgroupParent, GroupName(Name, id))
	if err != nil {
		t.Fatal(err)
	}
	idle, weight, _, err = cgroups.ReadQoS(g)
	if err != nil {
		t.Fatal(err)
	}
	return idle, weight
}

func guestLimits(t *testing.T, sb backend.Sandbox) (mem, pids uint64) {
	t.Helper()
	cs, err := sb.(*sandbox).cgroupStats()
	if err != nil {
		t.Fatal(err)
	}
	return cs.MemoryMax, cs.PidsMax
}

// TestVMHostCgroupLimitsAndUpdate: a VM's QEMU runs in a host cgroup of
// its own from its start, with the sandbox's CPU quota, its QoS class, a
// memory limit of the guest's memory and QEMU's margin and a pids limit;
// Update changes the host's quota and class and the guest's memory and
// pids limits, refuses a memory limit beyond the VM's boot memory (and
// a network policy) changing nothing, and the cgroup goes with the VM.
func TestVMHostCgroupLimitsAndUpdate(t *testing.T) {
	cfg := testConfig(t)
	b, err := New(Options{StateDir: t.TempDir(), QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const id = "cg1"
	sb, err := b.Create(ctx, backend.Spec{ID: id, Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}},
		CPUMillis: 1500, MemoryBytes: 64 << 20, PidsMax: 100, QoS: backend.QoS{Class: backend.QoSBestEffort}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(ctx) })

	pid := sb.(*sandbox).vm.Pid()
	b2, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	want := "/" + defaultCgroupParent + "/" + GroupName(Name, id)
	for _, line := range strings.Split(strings.TrimSpace(string(b2)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if (f[1] == "" || slices.Contains(strings.Split(f[1], ","), "memory") || slices.Contains(strings.Split(f[1], ","), "cpu") ||
			f[1] == "pids") && f[2] != want {
			t.Fatalf("QEMU (pid %d) is not in its cgroup %s: %s", pid, want, b2)
		}
	}
	if q := quota(t, id); q != 150000 {
		t.Fatalf("host CPU quota %d µs per period, want 150000", q)
	}
	if idle, _ := qosOf(t, id); !idle {
		t.Fatal("class be: the VM's group does not idle")
	}
	guestMB := 64 + guestOverheadMB
	if got := hostFile(t, id, "memory", "memory.limit_in_bytes", "memory.max"); got != strconv.FormatInt(HostMemoryBytes(guestMB, false), 10) {
		t.Fatalf("host memory limit %s, want %d", got, HostMemoryBytes(guestMB, false))
	}
	if got := hostFile(t, id, "pids", "pids.max", "pids.max"); got != strconv.FormatInt(HostPids(2), 10) {
		t.Fatalf("host pids limit %s, want %d", got, HostPids(2))
	}
	st, err := sb.Stats()
	if err != nil || st.MemoryBytes < 16<<20 {
		t.Fatalf("stats: %+v %v: want the cgroup's charge of a booted VM", st, err)
	}
	if mem, pids := guestLimits(t, sb); mem != 64<<20 || pids != 100 {
		t.Fatalf("guest limits %d bytes, %d pids; want %d, 100", mem, pids, 64<<20)
	}

	up := sb.(backend.Updater)
	i64 := func(n int64) *int64 { return &n }
	if err := up.Update(ctx, backend.Update{CPUMillis: i64(500), QoS: &backend.QoS{Class: backend.QoSLatency},
		MemoryBytes: i64(48 << 20), PidsMax: i64(50)}); err != nil {
		t.Fatal(err)
	}
	if q := quota(t, id); q != 50000 {
		t.Fatalf("host CPU quota %d after the update, want 50000", q)
	}
	if idle, w := qosOf(t, id); idle || w != qos.LSWeight {
		t.Fatalf("class ls: idle %v weight %d, want weight %d", idle, w, qos.LSWeight)
	}
	if mem, pids := guestLimits(t, sb); mem != 48<<20 || pids != 50 {
		t.Fatalf("guest limits %d bytes, %d pids after the update; want %d, 50", mem, pids, 48<<20)
	}

	// Beyond the boot memory: Invalid naming the most, and the CPU
	// quota of the same update not applied.
	most := MaxSandboxMemory(guestMB)
	err = up.Update(ctx, backend.Update{CPUMillis: i64(2000), MemoryBytes: i64(most + 1<<20)})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), strconv.FormatInt(most, 10)) {
		t.Fatalf("memory beyond the boot memory: %v, want Invalid naming %d", err, most)
	}
	if q := quota(t, id); q != 50000 {
		t.Fatalf("host CPU quota %d after a refused update, want 50000 still", q)
	}
	if mem, _ := guestLimits(t, sb); mem != 48<<20 {
		t.Fatalf("guest memory limit %d after a refused update", mem)
	}
	if err := up.Update(ctx, backend.Update{MemoryBytes: i64(most), QoS: &backend.QoS{Class: backend.QoSBestEffort}}); err != nil {
		t.Fatalf("memory at the most: %v", err)
	}
	if mem, _ := guestLimits(t, sb); mem != uint64(most) {
		t.Fatalf("guest memory limit %d, want the most, %d", mem, most)
	}
	if idle, _ := qosOf(t, id); !idle {
		t.Fatal("back to class be: the VM's group does not idle")
	}
	p := netpolicy.Policy{Mode: netpolicy.Allowlist}
	if err := up.Update(ctx, backend.Update{Network: &p}); !errors.Is(err, errdefs.ErrUnsupported) {
		t.Fatalf("network update: %v, want Unsupported", err)
	}

	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if hasGroup(t, id) {
		t.Fatal("the VM's cgroup outlived Destroy")
	}
}

// TestVMCgroupGoesWithQEMUAndSweep: the cgroup goes when QEMU is killed
// (kill -9), an adopted VM keeps its cgroup (and updates through it),
// and a sweep removes the cgroups of VMs it does not keep, with their
// QEMU, and groups whose QEMU is gone.
func TestVMCgroupGoesWithQEMUAndSweep(t *testing.T) {
	cfg := testConfig(t)
	state := t.TempDir()
	newBackend := backendAt(t, cfg, state)
	b := newBackend()
	ctx := context.Background()
	spec := func(id string) backend.Spec {
		return backend.Spec{ID: id, Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}}, CPUMillis: 1000, MemoryBytes: 32 << 20}
	}

	sb, err := b.Create(ctx, spec("crash"))
	if err != nil {
		t.Fatal(err)
	}
	if !hasGroup(t, "crash") {
		t.Fatal("no cgroup for the VM")
	}
	if err := syscall.Kill(sb.(*sandbox).vm.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Exited().Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Exited not done after QEMU was killed")
	}
	if hasGroup(t, "crash") {
		t.Fatal("the cgroup of a killed VM is still there once Exited is done")
	}
	_ = sb.Destroy(ctx)

	sb, err = b.Create(ctx, spec("kept"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(ctx) })
	// A group whose QEMU is gone (a crash between NewHostGroup and boot).
	if _, err := NewHostGroup(HostGroup{Parent: defaultCgroupParent, Backend: Name, ID: "ghost", GuestMB: 64, CPUs: 1}); err != nil {
		t.Fatal(err)
	}
	// The daemon restarts: the VM is adopted and keeps its group.
	v := sb.(*sandbox).vm
	v.sess.Close()
	v.conn.Close()
	b2 := newBackend()
	sb2, err := b2.Adopt(ctx, "kept", sb.State())
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Sweep(ctx, map[string]bool{"kept": true}); err != nil {
		t.Fatal(err)
	}
	if !hasGroup(t, "kept") || hasGroup(t, "ghost") {
		t.Fatalf("after a sweep keeping the adopted VM: kept %v, ghost %v", hasGroup(t, "kept"), hasGroup(t, "ghost"))
	}
	millis := int64(700)
	if err := sb2.(backend.Updater).Update(ctx, backend.Update{CPUMillis: &millis}); err != nil {
		t.Fatal(err)
	}
	if q := quota(t, "kept"); q != 70000 {
		t.Fatalf("adopted VM's quota %d after an update, want 70000", q)
	}
	// Another restart that does not keep it: QEMU and group go.
	pid := sb2.(*sandbox).vm.Pid()
	sb2.(*sandbox).vm.sess.Close()
	if err := newBackend().Sweep(ctx, map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatal("the swept VM's QEMU still runs")
	}
	waitGone(t, "kept")
}

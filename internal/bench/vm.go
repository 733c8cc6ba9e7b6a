package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/initramfs"
	"github.com/warrenrl/warren/internal/microvm"
)

// VMConfig configures `warren bench vm`.
type VMConfig struct {
	N          int    // measured boots (per layer mode)
	Idle       int    // VMs held at once for each memory measurement
	GuestAgent string // the static warren-guest binary
	// Peers adds the floor (QEMU and kernel into an init that powers
	// off) and a container sandbox of the same image through a private
	// daemon.
	Peers bool
	// Pmem measures layers on persistent memory with DAX as well.
	Pmem bool
	// LayerMiB is a file of that size in the image, which each idle VM
	// reads once (what a runtime's libraries are to a real image).
	LayerMiB int
	// KVM boots with KVM (TCG otherwise).
	KVM bool
	// Exe is the warren binary of the container peer's private daemon.
	Exe string
	// Vsock also boots with the agent on vsock (the node's device:
	// microvm.PickVsock), virtio-blk layer.
	Vsock bool
}

// VMMemory is host memory per idle VM in one configuration.
type VMMemory struct {
	Config string `json:"config"`
	VMs    int    `json:"vms"`
	// Booted, idle, the layer's file read once: QEMU's Pss (its share of
	// what it maps: file pages shared by the VMs counted by share) and its
	// anonymous part (the guest memory it touched, TCG's code cache).
	PssKiB  float64 `json:"pss_kib_per_vm"`
	AnonKiB float64 `json:"anon_kib_per_vm"`
	// The same after each guest dropped its page cache (the reclaim a
	// pause with reclaim and the idle reclaim do).
	ReclaimedPssKiB  float64 `json:"reclaimed_pss_kib_per_vm"`
	ReclaimedAnonKiB float64 `json:"reclaimed_anon_kib_per_vm"`
}

// VMReport is the result of `warren bench vm`.
type VMReport struct {
	Benchmark string `json:"benchmark"`
	Kernel    string `json:"kernel"`
	Accel     string `json:"accel"`
	Boots     int    `json:"boots"`
	// ReadyMs: QEMU started to the agent's first answer (module loads,
	// layer mount, sandbox init included), layers on virtio-blk.
	ReadyP50 float64 `json:"ready_ms_p50"`
	ReadyP99 float64 `json:"ready_ms_p99"`
	// GuestUptimeMs: the guest kernel's own clock when the agent answered.
	GuestUptimeP50 float64 `json:"guest_uptime_ms_p50"`
	// PmemReadyMs: the same with the layers on pmem (DAX).
	PmemReadyP50 float64 `json:"pmem_ready_ms_p50,omitempty"`
	PmemReadyP99 float64 `json:"pmem_ready_ms_p99,omitempty"`
	// VsockReadyMs: the same with the agent on vsock (VsockDevice:
	// "kernel" or the vhost-user backend's path), and the backend
	// process's Pss per VM (0 for the kernel's device); VsockSkip says
	// why not measured.
	VsockReadyP50     float64 `json:"vsock_ready_ms_p50,omitempty"`
	VsockReadyP99     float64 `json:"vsock_ready_ms_p99,omitempty"`
	VsockDevice       string  `json:"vsock_device,omitempty"`
	VsockBackendPssKi float64 `json:"vsock_backend_pss_kib,omitempty"`
	VsockSkip         string  `json:"vsock_skip,omitempty"`
	// FloorMs: the same QEMU and kernel with an init that powers off at
	// once: boot to /init and out, the least a VM can take here.
	FloorP50       float64 `json:"floor_ms_p50,omitempty"`
	FloorP99       float64 `json:"floor_ms_p99,omitempty"`
	ReadyOverFloor float64 `json:"ready_over_floor,omitempty"`
	// ContainerReadyMs: a container sandbox of the same image through a
	// private daemon's API, Create to its first exec's answer.
	ContainerReadyP50 float64 `json:"container_ready_ms_p50,omitempty"`
	ContainerReadyP99 float64 `json:"container_ready_ms_p99,omitempty"`
	// Idle VMs held at once: the default configuration's Pss per VM
	// (virtio-blk, free page reporting), then every configuration's.
	IdleVMs       int        `json:"idle_vms"`
	IdlePssKiBAvg float64    `json:"idle_pss_kib_per_vm"`
	LayerMiB      int        `json:"layer_file_mib"`
	Memory        []VMMemory `json:"memory,omitempty"`
	// Snapshot and restore, when microVM sandboxes implement
	// backend.Checkpointer; SnapshotSkip says why not otherwise.
	CheckpointP50 float64 `json:"checkpoint_ms_p50,omitempty"`
	CheckpointP99 float64 `json:"checkpoint_ms_p99,omitempty"`
	RestoreP50    float64 `json:"restore_ms_p50,omitempty"`
	RestoreP99    float64 `json:"restore_ms_p99,omitempty"`
	SnapshotSkip  string  `json:"snapshot_skip,omitempty"`
	// Snapshots are the same per configuration: the above's (no disk,
	// virtio-blk layer), a disk limit's, layers on pmem.
	Snapshots []VMSnapshot `json:"snapshots,omitempty"`
	TargetMs  float64      `json:"ready_target_ms"`
	Notes     []string     `json:"notes,omitempty"`
}

// vmSetup is what every phase boots from.
type vmSetup struct {
	cfg    VMConfig
	qemu   string
	kernel guestkernel.Kernel
	dir    string
	layer  string
	logf   func(string, ...any)
	seq    int
	// vsock, when set, is the device the next boots use.
	vsock *microvm.Vsock
}

// boot boots one VM of the bench's image.
func (s *vmSetup) boot(ctx context.Context, pmem, noBalloon bool) (*microvm.VM, error) {
	s.seq++
	id := "vm" + strconv.Itoa(s.seq)
	var vs *microvm.Vsock
	if s.vsock != nil {
		vs = s.vsock.ForVM(id)
	}
	return microvm.Boot(ctx, microvm.Config{QEMU: s.qemu, Kernel: s.kernel, GuestAgent: s.cfg.GuestAgent,
		Dir: filepath.Join(s.dir, "vms", id), CacheDir: s.dir, Layers: []string{s.layer},
		MemoryMB: 256 + 128, SandboxMemory: 256 << 20, KVM: s.cfg.KVM, PMEM: pmem, NoBalloon: noBalloon, Vsock: vs})
}

// RunVM boots microVMs one after another (virtio-blk layers, then pmem),
// holds Idle at once in each memory configuration, and runs the peers.
func RunVM(ctx context.Context, cfg VMConfig, progress io.Writer) (*VMReport, error) {
	logf := func(format string, a ...any) {
		if progress != nil {
			fmt.Fprintf(progress, format+"\n", a...)
		}
	}
	k, err := guestkernel.Find(guestkernel.Dir)
	if err != nil {
		return nil, err
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, fmt.Errorf("no qemu-system-x86_64 (scripts/vm.sh installs it)")
	}
	mk, err := erofs.FindMkfs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "warren-bench-vm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "rootfs")
	logf("vm: building a busybox root filesystem with a %d MiB file", cfg.LayerMiB)
	if err := image.BuildBusybox(ctx, root); err != nil {
		return nil, err
	}
	if cfg.LayerMiB > 0 {
		if err := writeRandomFile(filepath.Join(root, "data", "blob"), cfg.LayerMiB<<20); err != nil {
			return nil, err
		}
	}
	layer := filepath.Join(dir, "busybox.erofs")
	if out, err := exec.Command(mk.Path, layer, root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mkfs.erofs: %v: %s", err, out)
	}
	accel := "tcg"
	if cfg.KVM {
		accel = "kvm"
	}
	s := &vmSetup{cfg: cfg, qemu: qemu, kernel: k, dir: dir, layer: layer, logf: logf}
	rep := &VMReport{Benchmark: "vm", Kernel: k.Release, Accel: accel, Boots: cfg.N, TargetMs: 3000, IdleVMs: cfg.Idle, LayerMiB: cfg.LayerMiB}
	rep.Notes = append(rep.Notes,
		"ready: QEMU -M microvm (1 vCPU, 256+128 MiB, balloon with free page reporting) started to the guest agent's first answer: kernel, modules, the EROFS layer and overlay mounted, warren-init started",
		"pmem: the layer mapped as guest memory marked persistent (memmap=), mounted from /dev/pmem0 with dax=always; -M microvm,pcie=on",
		"memory: QEMU's Pss and anonymous memory per VM with all of them booted, idle, each having read the image's file once; reclaimed: after each guest dropped its page cache (pause with reclaim, idle reclaim)")

	boots := func(pmem bool) (ready, uptime []float64, err error) {
		for i := range cfg.N {
			v, err := s.boot(ctx, pmem, false)
			if err != nil {
				return nil, nil, err
			}
			ready = append(ready, float64(v.Ready.Microseconds())/1000)
			uptime = append(uptime, float64(v.GuestUptime.Microseconds())/1000)
			v.Close()
			logf("vm: boot %d/%d (pmem %v): ready in %.0f ms", i+1, cfg.N, pmem, ready[len(ready)-1])
		}
		slices.Sort(ready)
		slices.Sort(uptime)
		return ready, uptime, nil
	}
	ready, uptime, err := boots(false)
	if err != nil {
		return nil, err
	}
	rep.ReadyP50, rep.ReadyP99 = Percentile(ready, 50), Percentile(ready, 99)
	rep.GuestUptimeP50 = Percentile(uptime, 50)
	if cfg.Pmem {
		ready, _, err := boots(true)
		if err != nil {
			return nil, fmt.Errorf("pmem boots: %w", err)
		}
		rep.PmemReadyP50, rep.PmemReadyP99 = Percentile(ready, 50), Percentile(ready, 99)
	}

	if cfg.Vsock {
		if err := vsockBoots(ctx, s, rep); err != nil {
			return nil, fmt.Errorf("vsock boots: %w", err)
		}
	}

	if cfg.Idle > 0 {
		confs := []struct {
			name            string
			pmem, noBalloon bool
		}{
			{"virtio-blk, free page reporting", false, false},
			{"virtio-blk, no balloon", false, true},
		}
		if cfg.Pmem {
			confs = append(confs, struct {
				name            string
				pmem, noBalloon bool
			}{"pmem DAX, free page reporting", true, false})
		}
		for _, c := range confs {
			m, err := idleMemory(ctx, s, c.name, c.pmem, c.noBalloon)
			if err != nil {
				return nil, fmt.Errorf("idle memory (%s): %w", c.name, err)
			}
			rep.Memory = append(rep.Memory, m)
		}
		rep.IdlePssKiBAvg = rep.Memory[0].PssKiB
	}

	if microvm.SandboxCheckpoints() {
		if err := vmSnapshots(ctx, s, rep); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
	} else {
		rep.SnapshotSkip = "snapshot: microvm has no Checkpointer on this build"
	}

	if cfg.Peers {
		floor, err := floorBoots(ctx, qemu, k, cfg, dir, logf)
		if err != nil {
			return nil, fmt.Errorf("floor peer: %w", err)
		}
		slices.Sort(floor)
		rep.FloorP50, rep.FloorP99 = Percentile(floor, 50), Percentile(floor, 99)
		if rep.FloorP50 > 0 {
			rep.ReadyOverFloor = rep.ReadyP50 / rep.FloorP50
		}
		ctr, err := containerReady(ctx, cfg, progress)
		if err != nil {
			return nil, fmt.Errorf("container peer: %w", err)
		}
		slices.Sort(ctr)
		rep.ContainerReadyP50, rep.ContainerReadyP99 = Percentile(ctr, 50), Percentile(ctr, 99)
	}
	return rep, nil
}

// vsockBoots times boots with the agent on the node's vsock device, and
// what a vhost-user backend process holds of the node per VM.
func vsockBoots(ctx context.Context, s *vmSetup, rep *VMReport) error {
	d, err := microvm.PickVsock("")
	if err != nil {
		rep.VsockSkip = err.Error()
		return nil
	}
	rep.VsockDevice = "kernel"
	if !d.Kernel {
		rep.VsockDevice = d.Backend
	}
	s.vsock = &d
	defer func() { s.vsock = nil }()
	var ready, pss []float64
	for i := range s.cfg.N {
		v, err := s.boot(ctx, false, false)
		if err != nil {
			return err
		}
		ready = append(ready, float64(v.Ready.Microseconds())/1000)
		if pid := v.VsockBackendPid(); pid > 0 {
			if use, err := microvm.ProcessMemory(pid); err == nil {
				pss = append(pss, float64(use.Bytes)/1024)
			}
		}
		v.Close()
		s.logf("vm: boot %d/%d (vsock): ready in %.0f ms", i+1, s.cfg.N, ready[len(ready)-1])
	}
	slices.Sort(ready)
	rep.VsockReadyP50, rep.VsockReadyP99 = Percentile(ready, 50), Percentile(ready, 99)
	if len(pss) > 0 {
		var sum float64
		for _, p := range pss {
			sum += p
		}
		rep.VsockBackendPssKi = sum / float64(len(pss))
	}
	return nil
}

// writeRandomFile writes n incompressible bytes (a file the guest must
// really read, which no layer compression shrinks).
func writeRandomFile(path string, n int) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return os.WriteFile(path, b, 0o644)
}

// idleMemory boots s.cfg.Idle VMs in one configuration, has each read the
// image's file, waits for their memory to settle, reads it, has each
// guest drop its page cache (VM.Reclaim), and reads it again.
func idleMemory(ctx context.Context, s *vmSetup, name string, pmem, noBalloon bool) (VMMemory, error) {
	m := VMMemory{Config: name, VMs: s.cfg.Idle}
	var vms []*microvm.VM
	defer func() {
		for _, v := range vms {
			v.Close()
		}
	}()
	for i := range s.cfg.Idle {
		v, err := s.boot(ctx, pmem, noBalloon)
		if err != nil {
			return m, err
		}
		vms = append(vms, v)
		if s.cfg.LayerMiB > 0 {
			if r, err := v.Exec(ctx, []string{"/bin/sh", "-c", "cat /data/blob > /dev/null"}, []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}); err != nil || r.Exit.Code != 0 {
				return m, fmt.Errorf("read the image's file: %v %+v %s", err, r.Exit, r.Stderr)
			}
		}
		s.logf("vm: %s: %d/%d booted", name, i+1, s.cfg.Idle)
	}
	pss, anon, err := settledMemory(ctx, vms)
	if err != nil {
		return m, err
	}
	m.PssKiB, m.AnonKiB = pss, anon
	// Every guest drops its caches at once; each Reclaim waits for its
	// VM's reporting to settle.
	var wg sync.WaitGroup
	errs := make([]error, len(vms))
	for i, v := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = v.Reclaim(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return m, fmt.Errorf("reclaim: %w", err)
	}
	if m.ReclaimedPssKiB, m.ReclaimedAnonKiB, err = settledMemory(ctx, vms); err != nil {
		return m, err
	}
	s.logf("vm: %s: %d idle VMs: %.0f KiB Pss, %.0f KiB anon each; after reclaim %.0f / %.0f", name, len(vms), m.PssKiB, m.AnonKiB, m.ReclaimedPssKiB, m.ReclaimedAnonKiB)
	return m, nil
}

// settledMemory waits until the VMs' anonymous memory stopped falling
// (free page reporting runs ~2 s after the guest frees; at most 30 s),
// then returns the average Pss and anonymous KiB per VM.
func settledMemory(ctx context.Context, vms []*microvm.VM) (pss, anon float64, err error) {
	read := func() (p, a float64) {
		for _, v := range vms {
			u, _ := processMemoryKiB(v.Pid())
			p += float64(u.pss)
			a += float64(u.anon)
		}
		return p / float64(len(vms)), a / float64(len(vms))
	}
	low := -1.0
	lowAt, end := time.Now(), time.Now().Add(30*time.Second)
	for {
		p, a := read()
		if low < 0 || a < low-1024 {
			low, lowAt = a, time.Now()
		}
		if time.Since(lowAt) >= 4*time.Second || time.Now().After(end) {
			return p, a, nil
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

type kib struct{ pss, anon int64 }

// processMemoryKiB reads a process's Pss and anonymous Pss.
func processMemoryKiB(pid int) (kib, error) {
	var u kib
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "Pss":
			u.pss = n
		case "Pss_Anon", "Pss_Shmem":
			u.anon += n
		}
	}
	return u, nil
}

// VMSnapshot is checkpoint and restore times of one configuration, and
// the checkpoint's size on disk (the state file; the disk image's copy's
// allocated blocks).
type VMSnapshot struct {
	Config        string  `json:"config"`
	CheckpointP50 float64 `json:"checkpoint_ms_p50"`
	CheckpointP99 float64 `json:"checkpoint_ms_p99"`
	RestoreP50    float64 `json:"restore_ms_p50"`
	RestoreP99    float64 `json:"restore_ms_p99"`
	StateMiB      float64 `json:"state_mib"`
	DiskMiB       float64 `json:"disk_copy_mib,omitempty"`
}

// vmSnapshots checkpoints a microVM sandbox and restores it, min(N, 3)
// rounds, through the backend, in each configuration: no disk, a 256 MiB
// disk limit with 16 MiB written to it, layers on pmem.
func vmSnapshots(ctx context.Context, s *vmSetup, rep *VMReport) error {
	for _, c := range []struct {
		name string
		disk int64
		pmem bool
	}{{"virtio-blk layer, no disk", 0, false}, {"disk limit 256 MiB, 16 MiB written", 256 << 20, false}, {"pmem DAX layer", 0, true}} {
		snap, err := vmSnapshot(ctx, s, c.name, c.disk, c.pmem)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		rep.Snapshots = append(rep.Snapshots, snap)
	}
	first := rep.Snapshots[0]
	rep.CheckpointP50, rep.CheckpointP99 = first.CheckpointP50, first.CheckpointP99
	rep.RestoreP50, rep.RestoreP99 = first.RestoreP50, first.RestoreP99
	return nil
}

// vmSnapshot is vmSnapshots' for one configuration.
func vmSnapshot(ctx context.Context, s *vmSetup, name string, disk int64, pmem bool) (VMSnapshot, error) {
	snap := VMSnapshot{Config: name}
	s.seq++
	// A parent of its own: a daemon's sweep of "warren" would take the
	// bench's VMs.
	parent := fmt.Sprintf("warren-bench-vm-%d-%d", os.Getpid(), s.seq)
	defer func() { _ = cgroups.RemoveParent(parent) }()
	b, err := microvm.New(microvm.Options{StateDir: filepath.Join(s.dir, "backend"+strconv.Itoa(s.seq)), QEMU: s.qemu, GuestAgent: s.cfg.GuestAgent, KVM: s.cfg.KVM, PMEM: pmem, CgroupParent: parent})
	if err != nil {
		return snap, err
	}
	layers := []backend.Layer{{Digest: "sha256:bench-vm", Blob: s.layer}}
	var cp, rs []float64
	for i := range min(s.cfg.N, 3) {
		id := fmt.Sprintf("snap%d-%d", s.seq, i)
		sb, err := b.Create(ctx, backend.Spec{ID: id, Layers: layers, MemoryBytes: 256 << 20, DiskBytes: disk})
		if err != nil {
			return snap, err
		}
		if disk > 0 {
			if err := execIn(ctx, sb, "head -c 16777216 /dev/urandom > /root/f && sync"); err != nil {
				_ = sb.Destroy(context.WithoutCancel(ctx))
				return snap, err
			}
		}
		dir := filepath.Join(s.dir, "checkpoints", id)
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return snap, err
		}
		t0 := time.Now()
		err = sb.(backend.Checkpointer).Checkpoint(ctx, dir)
		cp = append(cp, float64(time.Since(t0).Microseconds())/1000)
		_ = sb.Destroy(context.WithoutCancel(ctx))
		if err != nil {
			return snap, err
		}
		snap.StateMiB = fileMiB(filepath.Join(dir, "vm.state"), false)
		snap.DiskMiB = fileMiB(filepath.Join(dir, "disk.img"), true)
		t0 = time.Now()
		rsb, err := b.Create(ctx, backend.Spec{ID: id + "r", Layers: layers, MemoryBytes: 256 << 20, DiskBytes: disk, Restore: dir})
		if err != nil {
			return snap, err
		}
		rs = append(rs, float64(time.Since(t0).Microseconds())/1000)
		_ = rsb.Destroy(context.WithoutCancel(ctx))
		_ = os.RemoveAll(dir)
		s.logf("vm: snapshot (%s) %d: checkpoint %.0f ms, restore %.0f ms, state %.0f MiB, disk copy %.0f MiB", name, i+1, cp[i], rs[i], snap.StateMiB, snap.DiskMiB)
	}
	slices.Sort(cp)
	slices.Sort(rs)
	snap.CheckpointP50, snap.CheckpointP99 = Percentile(cp, 50), Percentile(cp, 99)
	snap.RestoreP50, snap.RestoreP99 = Percentile(rs, 50), Percentile(rs, 99)
	return snap, nil
}

// fileMiB is path's size in MiB, or its allocated blocks' (a sparse
// file's), 0 if there is none.
func fileMiB(path string, blocks bool) float64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	if blocks {
		return float64(st.Blocks*512) / (1 << 20)
	}
	return float64(st.Size) / (1 << 20)
}

// execIn runs a shell command in sb to its end, an error unless it exits 0.
func execIn(ctx context.Context, sb backend.Sandbox, script string) error {
	p, err := sb.Start(ctx, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}})
	if err != nil {
		return err
	}
	defer p.Close()
	st, err := p.Wait()
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("%q exited %d", script, st.Code)
	}
	return err
}

// containerReady times container sandboxes of the busybox image through
// a private daemon: Create to the answer of its first exec.
func containerReady(ctx context.Context, cfg VMConfig, progress io.Writer) ([]float64, error) {
	env, err := Setup(ctx, Options{Exe: cfg.Exe, Progress: progress, UserAgent: "warren-bench-vm"})
	if err != nil {
		return nil, err
	}
	defer env.Close()
	var out []float64
	for i := range cfg.N {
		t0 := time.Now()
		sb, err := env.Client.Create(ctx, env.CreateRequest())
		if err != nil {
			return nil, err
		}
		res, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Argv: []string{"true"}})
		d := time.Since(t0)
		_ = env.Client.Delete(context.WithoutCancel(ctx), sb.GetId())
		if err != nil {
			return nil, err
		}
		if res.GetExitCode() != 0 {
			return nil, fmt.Errorf("exec true: exit %d", res.GetExitCode())
		}
		out = append(out, float64(d.Microseconds())/1000)
		if progress != nil {
			fmt.Fprintf(progress, "vm: container %d/%d: ready in %.0f ms\n", i+1, cfg.N, out[i])
		}
	}
	return out, nil
}

// floorBoots times QEMU booting the kernel into an init that powers off.
func floorBoots(ctx context.Context, qemu string, k guestkernel.Kernel, cfg VMConfig, dir string, logf func(string, ...any)) ([]float64, error) {
	w := initramfs.New()
	if err := w.AddFile("init", cfg.GuestAgent, 0o755); err != nil {
		return nil, err
	}
	initrd := filepath.Join(dir, "floor.cpio")
	f, err := os.Create(initrd)
	if err != nil {
		return nil, err
	}
	if err := w.Write(f); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	accel := "tcg,thread=multi"
	if cfg.KVM {
		accel = "kvm"
	}
	var out []float64
	for i := range cfg.N {
		cmd := exec.CommandContext(ctx, qemu, "-M", "microvm", "-accel", accel, "-cpu", "max", "-smp", "1", "-m", "384M",
			"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-kernel", k.Vmlinux, "-initrd", initrd,
			"-append", "console=ttyS0 quiet panic=-1 tsc_early_khz="+strconv.Itoa(microvm.HostTSCkHz())+" warren.poweroff=1")
		t0 := time.Now()
		b, err := cmd.CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("floor boot: %v: %s", err, b)
		}
		out = append(out, float64(time.Since(t0).Microseconds())/1000)
		logf("vm: floor %d/%d: %.0f ms", i+1, cfg.N, out[len(out)-1])
	}
	return out, nil
}

// Table writes the report.
func (r *VMReport) Table(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "microVM boot (%s, %s, %d boots each)\tp50 ms\tp99 ms\n", r.Kernel, r.Accel, r.Boots)
	fmt.Fprintf(tw, "warren: start to agent ready (virtio-blk layer)\t%.0f\t%.0f\n", r.ReadyP50, r.ReadyP99)
	fmt.Fprintf(tw, "  guest kernel uptime at ready\t%.0f\t\n", r.GuestUptimeP50)
	if r.PmemReadyP50 > 0 {
		fmt.Fprintf(tw, "warren: start to agent ready (pmem DAX layer)\t%.0f\t%.0f\n", r.PmemReadyP50, r.PmemReadyP99)
	}
	if r.VsockReadyP50 > 0 {
		fmt.Fprintf(tw, "warren: start to agent ready (agent on vsock, %s)\t%.0f\t%.0f\n", r.VsockDevice, r.VsockReadyP50, r.VsockReadyP99)
		if r.VsockBackendPssKi > 0 {
			fmt.Fprintf(tw, "  vhost-user backend Pss per VM, KiB\t%.0f\t\n", r.VsockBackendPssKi)
		}
	}
	if r.FloorP50 > 0 {
		fmt.Fprintf(tw, "floor: QEMU + kernel to /init, powered off\t%.0f\t%.0f\n", r.FloorP50, r.FloorP99)
		fmt.Fprintf(tw, "ratio (ready / floor)\t%.2fx\t\n", r.ReadyOverFloor)
	}
	if r.ContainerReadyP50 > 0 {
		fmt.Fprintf(tw, "peer: container sandbox, Create to first exec (API)\t%.0f\t%.0f\n", r.ContainerReadyP50, r.ContainerReadyP99)
	}
	fmt.Fprintf(tw, "target\t<= %.0f\t\n", r.TargetMs)
	for _, sn := range r.Snapshots {
		fmt.Fprintf(tw, "snapshot (%s; state %.0f MiB, disk copy %.0f MiB): checkpoint\t%.0f\t%.0f\n", sn.Config, sn.StateMiB, sn.DiskMiB, sn.CheckpointP50, sn.CheckpointP99)
		fmt.Fprintf(tw, "snapshot (%s): restore to running\t%.0f\t%.0f\n", sn.Config, sn.RestoreP50, sn.RestoreP99)
	}
	if len(r.Snapshots) == 0 && r.CheckpointP50 > 0 {
		fmt.Fprintf(tw, "snapshot: checkpoint\t%.0f\t%.0f\n", r.CheckpointP50, r.CheckpointP99)
		fmt.Fprintf(tw, "snapshot: restore to running\t%.0f\t%.0f\n", r.RestoreP50, r.RestoreP99)
	}
	if len(r.Memory) > 0 {
		fmt.Fprintf(tw, "\nidle host memory per VM (%d VMs, %d MiB file read once)\tPss KiB\tanon KiB\tPss after reclaim\tanon after reclaim\n", r.IdleVMs, r.LayerMiB)
		for _, m := range r.Memory {
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\n", m.Config, m.PssKiB, m.AnonKiB, m.ReclaimedPssKiB, m.ReclaimedAnonKiB)
		}
	}
	if r.SnapshotSkip != "" {
		fmt.Fprintf(tw, "# %s\n", r.SnapshotSkip)
	}
	if r.VsockSkip != "" {
		fmt.Fprintf(tw, "# vsock: %s\n", r.VsockSkip)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(tw, "# %s\n", n)
	}
	return tw.Flush()
}

package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/initramfs"
	"github.com/warrenrl/warren/internal/microvm"
)

// VMConfig configures `warren bench vm`.
type VMConfig struct {
	N          int    // measured boots
	Idle       int    // VMs held at once for the memory measurement
	GuestAgent string // the static warren-guest binary
	Peers      bool
}

// VMReport is the result of `warren bench vm`.
type VMReport struct {
	Benchmark string `json:"benchmark"`
	Kernel    string `json:"kernel"`
	Accel     string `json:"accel"`
	Boots     int    `json:"boots"`
	// ReadyMs: QEMU started to the agent's first answer (module loads,
	// layer mount, sandbox init included).
	ReadyP50 float64 `json:"ready_ms_p50"`
	ReadyP99 float64 `json:"ready_ms_p99"`
	// GuestUptimeMs: the guest kernel's own clock when the agent answered.
	GuestUptimeP50 float64 `json:"guest_uptime_ms_p50"`
	// FloorMs: the same QEMU and kernel with an init that powers off at
	// once: boot to /init and out, the least a VM can take here.
	FloorP50       float64 `json:"floor_ms_p50,omitempty"`
	FloorP99       float64 `json:"floor_ms_p99,omitempty"`
	ReadyOverFloor float64 `json:"ready_over_floor,omitempty"`
	// Idle VMs held at once: host memory per VM (QEMU's Pss: its share of
	// what it maps, guest memory it touched included).
	IdleVMs       int      `json:"idle_vms"`
	IdlePssKiBAvg float64  `json:"idle_pss_kib_per_vm"`
	TargetMs      float64  `json:"ready_target_ms"`
	Notes         []string `json:"notes,omitempty"`
}

// RunVM boots microVMs one after another, then Idle at once, and the
// floor peer.
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
	logf("vm: building a busybox root filesystem")
	if err := image.BuildBusybox(ctx, root); err != nil {
		return nil, err
	}
	layer := filepath.Join(dir, "busybox.erofs")
	if out, err := exec.Command(mk.Path, layer, root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mkfs.erofs: %v: %s", err, out)
	}
	rep := &VMReport{Benchmark: "vm", Kernel: k.Release, Accel: "tcg", Boots: cfg.N, TargetMs: 3000, IdleVMs: cfg.Idle}
	rep.Notes = append(rep.Notes,
		"ready: QEMU -M microvm (TCG, 1 vCPU, 256+96 MiB) started to the guest agent's first answer: kernel, modules, the EROFS layer and overlay mounted, warren-init started",
		"floor: the same QEMU and kernel with an initramfs whose /init powers the VM off at once (no modules, no layer): boot to /init and QEMU's exit",
		"idle memory: QEMU's Pss per VM with all of them booted and idle; layers are virtio-blk (host page cache shared, guest page cache not): virtio-pmem with DAX does not work on -M microvm in QEMU 7.2 (docs/MICROVM.md)")
	boot := func(i int) (*microvm.VM, error) {
		return microvm.Boot(ctx, microvm.Config{QEMU: qemu, Kernel: k, GuestAgent: cfg.GuestAgent,
			Dir: filepath.Join(dir, "vms", "vm"+strconv.Itoa(i)), CacheDir: dir, Layers: []string{layer},
			MemoryMB: 256 + 96, SandboxMemory: 256 << 20})
	}
	var ready, uptime []float64
	for i := range cfg.N {
		v, err := boot(i)
		if err != nil {
			return nil, err
		}
		ready = append(ready, float64(v.Ready.Microseconds())/1000)
		uptime = append(uptime, float64(v.GuestUptime.Microseconds())/1000)
		v.Close()
		logf("vm: boot %d/%d: ready in %.0f ms", i+1, cfg.N, ready[len(ready)-1])
	}
	slices.Sort(ready)
	slices.Sort(uptime)
	rep.ReadyP50, rep.ReadyP99 = Percentile(ready, 50), Percentile(ready, 99)
	rep.GuestUptimeP50 = Percentile(uptime, 50)

	if cfg.Idle > 0 {
		var vms []*microvm.VM
		for i := range cfg.Idle {
			v, err := boot(1000 + i)
			if err != nil {
				for _, v := range vms {
					v.Close()
				}
				return nil, err
			}
			vms = append(vms, v)
		}
		time.Sleep(2 * time.Second) // settle: the guests go idle
		var total float64
		for _, v := range vms {
			total += float64(pssKiB(v.Pid()))
		}
		rep.IdlePssKiBAvg = total / float64(len(vms))
		for _, v := range vms {
			v.Close()
		}
		logf("vm: %d idle VMs: %.0f KiB Pss each", cfg.Idle, rep.IdlePssKiBAvg)
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
	}
	return rep, nil
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
	var out []float64
	for i := range cfg.N {
		cmd := exec.CommandContext(ctx, qemu, "-M", "microvm", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-m", "352M",
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

// pssKiB is a process's proportional set size.
func pssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// Table writes the report.
func (r *VMReport) Table(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "microVM boot (%s, %s, %d boots)\tp50 ms\tp99 ms\n", r.Kernel, r.Accel, r.Boots)
	fmt.Fprintf(tw, "warren: start to agent ready\t%.0f\t%.0f\n", r.ReadyP50, r.ReadyP99)
	fmt.Fprintf(tw, "  guest kernel uptime at ready\t%.0f\t\n", r.GuestUptimeP50)
	if r.FloorP50 > 0 {
		fmt.Fprintf(tw, "floor: QEMU + kernel to /init, powered off\t%.0f\t%.0f\n", r.FloorP50, r.FloorP99)
		fmt.Fprintf(tw, "ratio (ready / floor)\t%.2fx\t\n", r.ReadyOverFloor)
	}
	fmt.Fprintf(tw, "target\t<= %.0f\t\n", r.TargetMs)
	if r.IdleVMs > 0 {
		fmt.Fprintf(tw, "idle host memory (%d VMs)\t%.0f KiB Pss each\t\n", r.IdleVMs, r.IdlePssKiBAvg)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(tw, "# %s\n", n)
	}
	return tw.Flush()
}

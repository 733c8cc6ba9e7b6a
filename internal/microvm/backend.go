package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/qos"
	"github.com/warrenrl/warren/internal/rlimit"
)

// Name is the backend's name in CreateRequest.backend.
const Name = "microvm"

// guestOverheadMB is the memory a VM has beyond its sandbox's limit: the
// guest kernel and its page cache, the agent, warren-init. Debian's kernel
// keeps ~46 MiB of a 128 MiB VM to itself, and the guest's own processes
// take ~41 MiB more of what is left (measured: /proc/meminfo in the
// guest), so 96 left a 32 MiB sandbox at its limit with ~9 MiB for the
// guest's kernel allocations. The guest touches only what it uses.
const guestOverheadMB = 128

// bootTimeout bounds a boot to the agent's first answer (~2.5 s here, a
// minute on a very loaded node; BootWithin).
var bootTimeout = 3 * time.Minute

// Options configure the backend.
type Options struct {
	StateDir   string // the backend's directory: vms/<id>/ and initramfs images
	QEMU       string // default: qemu-system-x86_64 on $PATH
	KernelDir  string // default: guestkernel.Dir
	GuestAgent string // the static warren-guest binary
	KVM        bool
	// Network gives VMs with a network policy their taps and rules: the
	// daemon's one node, shared with the container backend (nil: VMs
	// have network mode none only).
	Network *netpolicy.Node
	// PMEM maps the VMs' layers as persistent memory mounted with DAX
	// (pmem.go): one copy of a layer on the node, the host's page cache,
	// for every VM; the machine gets pcie=on.
	PMEM bool
	// CgroupParent is the parent of the VMs' QEMU cgroups: the container
	// backend's (the daemon's --cgroup-parent; default "warren"), whose
	// sandboxes' groups they are siblings of (vmcg.go).
	CgroupParent string
	// Transport is how the host reaches the guest agent: TransportSerial
	// (the default: a virtio-serial port) or TransportVsock (vsock.go:
	// the kernel's vhost-vsock where the node has it, else the vhost-user
	// backend VsockBackend, default vhost-device-vsock on $PATH).
	Transport    string
	VsockBackend string
}

// DefaultGuestAgent is where the guest agent is looked for when none is
// named: warren-guest beside the running executable (make build puts it
// there).
func DefaultGuestAgent() string {
	exe, err := os.Executable()
	if err != nil {
		return "warren-guest"
	}
	return filepath.Join(filepath.Dir(exe), "warren-guest")
}

// Backend runs sandboxes as microVMs (backend.Backend).
type Backend struct {
	opts   Options
	kernel guestkernel.Kernel
	// vsock is the node's vsock device for the VMs, nil for
	// virtio-serial.
	vsock *Vsock
}

var (
	_ backend.Backend     = (*Backend)(nil)
	_ backend.LayerMounts = (*Backend)(nil)
	_ backend.Sandbox     = (*sandbox)(nil)
)

// New checks that the node can boot microVMs: QEMU, a guest kernel and
// the guest agent; Unsupported naming what is missing otherwise.
func New(opts Options) (*Backend, error) {
	if opts.QEMU == "" {
		p, err := exec.LookPath("qemu-system-x86_64")
		if err != nil {
			return nil, errdefs.Unsupportedf("microvm: no qemu-system-x86_64 (scripts/vm.sh installs it)")
		}
		opts.QEMU = p
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = defaultCgroupParent
	}
	if opts.KernelDir == "" {
		opts.KernelDir = guestkernel.Dir
	}
	k, err := guestkernel.Find(opts.KernelDir)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unsupported, err, "microvm")
	}
	if fi, err := os.Stat(opts.GuestAgent); err != nil || fi.IsDir() {
		return nil, errdefs.Unsupportedf("microvm: no guest agent at %q (make build puts warren-guest beside warren)", opts.GuestAgent)
	}
	b := &Backend{opts: opts, kernel: k}
	switch opts.Transport {
	case "", TransportSerial:
	case TransportVsock:
		d, err := PickVsock(opts.VsockBackend)
		if err != nil {
			return nil, err
		}
		b.vsock = &d
	default:
		return nil, errdefs.Invalidf("microvm: transport %q: want %s or %s", opts.Transport, TransportSerial, TransportVsock)
	}
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "vms"), 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "microvm state directory")
	}
	return b, nil
}

func (b *Backend) Name() string { return Name }

// MountLayers: the VM reads the layer blobs as disks; nothing is mounted
// on the node.
func (b *Backend) MountLayers() bool { return false }

func (b *Backend) vmDir(id string) string { return filepath.Join(b.opts.StateDir, "vms", id) }

// Create boots a VM for spec.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (backend.Sandbox, error) {
	switch {
	case !backend.ValidID(spec.ID):
		return nil, errdefs.Invalidf("bad sandbox id %q", spec.ID)
	case spec.DiskBytes > 0 && spec.DiskBytes < minDiskBytes:
		return nil, errdefs.Invalidf("microvm: disk limit %d bytes is below the minimum of %d", spec.DiskBytes, minDiskBytes)
	case len(spec.Devices) > 0 || len(spec.Mounts) > 0:
		return nil, errdefs.Unsupportedf("microvm: devices and host mounts are not passed into VMs")
	case !spec.Network.IsNone() && b.opts.Network == nil:
		// No node networking given: a policy that allows anything is
		// refused, not dropped.
		return nil, errdefs.Unsupportedf("microvm: network policy %s: this backend has no sandbox networking (mode none only)", spec.Network)
	case qos.Check(spec.QoS) != nil:
		return nil, qos.Check(spec.QoS)
	case len(spec.Layers) == 0:
		return nil, errdefs.Invalidf("microvm: no layers")
	}
	rl, err := guestRlimits(spec.Rlimits)
	if err != nil {
		return nil, err
	}
	var layers []string
	for i := len(spec.Layers) - 1; i >= 0; i-- { // bottom first
		l := spec.Layers[i]
		if l.Blob == "" {
			return nil, errdefs.Invalidf("microvm: layer %q is a directory, not an EROFS blob: import the image into an EROFS store", l.Digest)
		}
		layers = append(layers, l.Blob)
	}
	if spec.Restore != "" {
		return b.restore(ctx, spec, layers) // snapshot.go
	}
	// The VM holds the sandbox's memory limit and what the guest needs
	// of its own (kernel, agent: guestOverheadMB); the limit itself is the
	// sandbox's cgroup's in the guest.
	mem := 256 + guestOverheadMB
	if spec.MemoryBytes > 0 {
		mem = int(spec.MemoryBytes>>20) + guestOverheadMB
	}
	// vCPUs: the quota rounded up to cores, as a container's CPU views
	// count them; without a quota, every CPU of the node.
	cpus := runtime.NumCPU()
	if spec.CPUMillis > 0 {
		cpus = int((spec.CPUMillis + 999) / 1000)
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID // as a container's
	}
	// The directory is the claim on the id.
	if err := os.Mkdir(b.vmDir(spec.ID), 0o700); err != nil {
		if os.IsExist(err) {
			return nil, errdefs.AlreadyExistsf("microvm: sandbox %s exists", spec.ID)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "microvm: VM directory")
	}
	var cu cleanup.Cleanup
	defer func() { _ = cu.Clean() }()
	cu.Add(func() error { return os.RemoveAll(b.vmDir(spec.ID)) })
	grp, err := b.hostGroup(spec, mem, cpus)
	if err != nil {
		return nil, err
	}
	cu.Add(grp.Delete) // until QEMU is in it: then it goes with QEMU
	cfg := Config{QEMU: b.opts.QEMU, Kernel: b.kernel, GuestAgent: b.opts.GuestAgent,
		Dir: b.vmDir(spec.ID), Layers: layers, MemoryMB: mem, CPUs: cpus, KVM: b.opts.KVM, PMEM: b.opts.PMEM,
		Hostname: hostname, CacheDir: b.opts.StateDir, SandboxMemory: spec.MemoryBytes, SandboxPids: spec.PidsMax, Rlimits: rl,
		Cgroup: grp}
	if b.vsock != nil {
		cfg.Vsock = b.vsock.forVM(spec.ID)
	}
	st := vmState{Env: spec.Env, Cwd: spec.Workdir, Rlimits: rl, Group: true, CPUMillis: spec.CPUMillis, MemoryMB: mem, Vsock: cfg.Vsock}
	if spec.DiskBytes > 0 {
		cfg.Disk = diskImage(cfg.Dir)
		if err := makeDisk(cfg.Disk, spec.DiskBytes); err != nil {
			return nil, err
		}
		st.Disk = true
	}
	if !spec.Network.IsNone() {
		a, tap, err := b.opts.Network.AttachTap(Name, spec.ID, hostname, spec.Network)
		if err != nil {
			return nil, err
		}
		// QEMU holds the tap once started: ours goes after the boot
		// either way.
		defer tap.Close()
		cu.Add(func() error { return b.opts.Network.Detach(spec.ID, a) })
		gw, addr := b.opts.Network.Addrs(a.Index)
		cfg.Net = &Net{Tap: tap, Addr: addr, Gateway: gw, Resolv: len(spec.Etc) > 0}
		st.Net = &a
	}
	v, err := BootWithin(ctx, cfg, bootTimeout, "microvm")
	if err != nil {
		return nil, err
	}
	if err := isolate(v.Pid(), spec.QoS); err != nil {
		v.Close()
		return nil, err
	}
	var digests []string
	for i := len(spec.Layers) - 1; i >= 0; i-- {
		digests = append(digests, spec.Layers[i].Digest)
	}
	st.Digests = digests
	cu.Release()
	return b.newSandbox(spec.ID, v, st), nil
}

// hostGroup makes the host cgroup of a VM of spec with guestMB of memory
// and cpus vCPUs (vmcg.go).
func (b *Backend) hostGroup(spec backend.Spec, guestMB, cpus int) (cgroups.Group, error) {
	return NewHostGroup(HostGroup{Parent: b.opts.CgroupParent, Backend: Name, ID: spec.ID,
		GuestMB: guestMB, CPUs: cpus, KVM: b.opts.KVM, CPUMillis: spec.CPUMillis, QoS: spec.QoS})
}

func (b *Backend) newSandbox(id string, v *VM, st vmState) *sandbox {
	exited, cancel := context.WithCancel(context.Background())
	go func() {
		<-v.done
		if v.cgDone != nil {
			<-v.cgDone // its cgroup goes with it
		}
		cancel()
	}()
	if st.MemoryMB == 0 {
		st.MemoryMB = v.cfg.MemoryMB
	}
	return &sandbox{id: id, vm: v, exited: exited, env: st.Env, cwd: st.Cwd, rlimits: st.Rlimits,
		net: b.opts.Network, att: st.Net, disk: st.Disk, digests: st.Digests,
		cpuMillis: st.CPUMillis, memoryMB: st.MemoryMB}
}

// guestRlimits are the limits of a sandbox's processes as the agent sets
// them. A hard limit above the daemon's own is refused, as the container
// backend refuses it: the guest could grant it, but a sandbox's limits
// must not depend on its backend.
func guestRlimits(ls []rlimit.Limit) ([]guest.Rlimit, error) {
	var out []guest.Rlimit
	for _, l := range ls {
		num, ok := rlimit.Number(l.Name)
		if !ok {
			return nil, errdefs.Invalidf("microvm: unknown resource limit %q", l.Name)
		}
		if ceil := rlimit.Ceiling(num); l.Hard > ceil {
			return nil, errdefs.Invalidf("microvm: resource limit %s: hard limit %s above the node's %s", l.Name, rlimit.Format(l.Hard), rlimit.Format(ceil))
		}
		out = append(out, guest.Rlimit{Resource: num, Soft: l.Soft, Hard: l.Hard})
	}
	return out, nil
}

// vmState is what the daemon keeps of a VM for Adopt.
type vmState struct {
	Pid     int            `json:"pid"`
	Dir     string         `json:"dir"`
	Env     []string       `json:"env,omitempty"`
	Cwd     string         `json:"cwd,omitempty"`
	Rlimits []guest.Rlimit `json:"rlimits,omitempty"`
	// Net is the VM's network (its tap and rules), nil for none.
	Net *netpolicy.Attachment `json:"net,omitempty"`
	// Disk says the writable layer is on the VM's disk image.
	Disk bool `json:"disk,omitempty"`
	// Digests are the layers', bottom first (a checkpoint names them).
	Digests []string `json:"digests,omitempty"`
	// Group says QEMU runs in a host cgroup of its own (vmcg.go), whose
	// CPU quota is CPUMillis; MemoryMB is the guest's memory (the most
	// an update may give the sandbox: Update).
	Group     bool  `json:"group,omitempty"`
	CPUMillis int64 `json:"cpu_millis,omitempty"`
	MemoryMB  int   `json:"memory_mb,omitempty"`
	// Vsock is the agent's vsock device, nil for the virtio-serial port.
	Vsock *Vsock `json:"vsock,omitempty"`
}

// Adopt reaches a VM an earlier daemon (or handle) booted, through a port
// of its own (Attach); the VM's processes, background ones included, run
// on. A VM whose QEMU is gone is cleaned up and NotFound.
func (b *Backend) Adopt(ctx context.Context, id string, state []byte) (backend.Sandbox, error) {
	if !backend.ValidID(id) {
		return nil, errdefs.Invalidf("bad sandbox id %q", id)
	}
	var st vmState
	if err := json.Unmarshal(state, &st); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "microvm: sandbox state")
	}
	dir := b.vmDir(id)
	if st.Net != nil {
		if b.opts.Network == nil {
			return nil, errdefs.Unavailablef("microvm: sandbox %s has a network and this backend no sandbox networking", id)
		}
		if st.Net.Owner == "" {
			st.Net.Owner = Name // a record from before taps had owners
		}
		// Taken before anything can fail, so that a cleanup below frees
		// it and no create meanwhile takes it.
		if err := b.opts.Network.Adopt(id, *st.Net); err != nil {
			return nil, err
		}
	}
	gone := func() {
		if st.Net != nil {
			_ = b.opts.Network.Detach(id, *st.Net)
		}
	}
	pids := qemuPids(dir, st.Pid)
	if len(pids) == 0 {
		_ = os.RemoveAll(dir)
		_ = RemoveHostGroup(b.opts.CgroupParent, Name, id)
		gone()
		return nil, errdefs.NotFoundf("microvm: sandbox %s: its VM is gone", id)
	}
	cfg := Config{QEMU: b.opts.QEMU, Kernel: b.kernel, GuestAgent: b.opts.GuestAgent, Dir: dir, KVM: b.opts.KVM, MemoryMB: st.MemoryMB, Vsock: st.Vsock}
	if st.Group {
		cfg.Cgroup = LoadHostGroup(b.opts.CgroupParent, Name, id)
	}
	v, err := Attach(ctx, cfg, pids[0])
	if errors.Is(err, errdefs.ErrNotFound) {
		b.stopOrphan(id, 0)
		_ = RemoveHostGroup(b.opts.CgroupParent, Name, id)
		gone()
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	sb := b.newSandbox(id, v, st)
	running, err := v.running(ctx)
	if err != nil {
		v.Close()
		return nil, err
	}
	sb.paused.Store(!running)
	return sb, nil
}

// Sweep stops the VMs of ids not in keep and removes their directories.
func (b *Backend) Sweep(ctx context.Context, keep map[string]bool) error {
	ents, err := os.ReadDir(filepath.Join(b.opts.StateDir, "vms"))
	if err != nil && !os.IsNotExist(err) {
		return errdefs.Wrap(errdefs.Internal, err, "microvm sweep")
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			b.stopOrphan(e.Name(), 0)
		}
	}
	// The cgroups of QEMUs gone while no daemon ran, and of creates a
	// crash interrupted.
	if err := SweepHostGroups(b.opts.CgroupParent, Name, keep); err != nil {
		return err
	}
	// The orphans' taps went with their QEMU; their rules, and the taps
	// of creates a crash interrupted, go here.
	if b.opts.Network != nil {
		if err := b.opts.Network.SweepTaps(Name, keep); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "microvm sweep")
		}
	}
	return nil
}

// stopOrphan kills the QEMU of VM id (found by its directory in the
// command line, pid a hint) and removes the directory.
func (b *Backend) stopOrphan(id string, pid int) {
	StopVM(b.vmDir(id), pid, LoadHostGroup(b.opts.CgroupParent, Name, id), 2*time.Second)
}

// StopVM stops the VM in dir that no handle holds (an orphan, a sweep):
// its QEMU (pid a hint) and vsock backend are killed, each waited for up
// to wait, and the directory removed. grp, its host cgroup if it has one,
// is thawed first: a frozen QEMU (a paused vsock VM) would not die.
func StopVM(dir string, pid int, grp cgroups.Group, wait time.Duration) {
	if grp != nil {
		_ = grp.Thaw()
	}
	for _, p := range qemuPids(dir, pid) {
		killAndWait(p, wait)
	}
	killVsockBackend(dir)
	_ = os.RemoveAll(dir)
}

// killAndWait kills pid and waits up to wait for it to be gone.
func killAndWait(pid int, wait time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
			return
		}
	}
}

// qemuPids are the processes whose command line names dir's QMP socket:
// that VM's QEMU.
func qemuPids(dir string, hint int) []int {
	if hint > 0 && isQEMUOf(hint, dir) {
		return []int{hint}
	}
	return pidsWhose(qemuOf(dir))
}

// pidsWhose are the processes whose command line (its arguments joined
// by NULs) match says yes to.
func pidsWhose(match func(cmdline string) bool) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && match(string(b)) {
			out = append(out, pid)
		}
	}
	return out
}

// sandbox is one VM.
type sandbox struct {
	id     string
	vm     *VM
	exited context.Context
	env    []string
	cwd    string
	// rlimits are every process's (the agent sets them: Request.Rlimits).
	rlimits []guest.Rlimit
	// digests are the layers', bottom first (Checkpoint names them).
	digests []string
	// paused is set while the VM is stopped (Pause): calls that would
	// wait on the agent are not made.
	paused atomic.Bool
	// net and att are the VM's network (nil: none), disk whether its
	// writable layer is on a disk image (disk.go).
	// netMu guards att's policy, which Update changes (the pointer and
	// the index stay).
	net   *netpolicy.Node
	netMu sync.Mutex
	att   *netpolicy.Attachment
	disk  bool
	// cpuMillis is the host cgroup's CPU quota (0: none), memoryMB the
	// guest's memory (0: unknown); updates change the first (update.go).
	cpuMillis int64
	memoryMB  int
	// kind names the backend in errors ("" is microvm); overheadMB is
	// what of memoryMB the guest keeps for itself (0: guestOverheadMB),
	// more for a full OS (internal/fullvm, NewSandbox).
	kind       string
	overheadMB int
	// eagerWhy is set on a restore that was asked to be lazy
	// (MemoryRestore).
	eagerWhy string
}

var _ backend.OOMCounter = (*sandbox)(nil)

// MemoryRestore (backend.MemoryRestorer): a VM's memory comes back
// whole, read from its checkpoint's migration stream before it runs.
func (s *sandbox) MemoryRestore() (bool, string) { return false, s.eagerWhy }

// statsTimeout bounds a counters call to the agent.
const statsTimeout = 10 * time.Second

func (s *sandbox) cgroupStats() (guest.CgroupStats, error) {
	var cs guest.CgroupStats
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	err := s.vm.call(ctx, guest.Request{Op: "cgroup"}, nil, &cs)
	return cs, err
}

// OOMKills is the sandbox cgroup's count in the guest: one call to the
// agent.
func (s *sandbox) OOMKills() (uint64, error) {
	if s.paused.Load() {
		return 0, errdefs.Unavailablef("microvm: sandbox %s is paused", s.id)
	}
	cs, err := s.cgroupStats()
	return cs.OOMKills, err
}

func (s *sandbox) ID() string { return s.id }

func (s *sandbox) State() []byte {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	b, _ := json.Marshal(vmState{Pid: s.vm.Pid(), Dir: s.vm.cfg.Dir, Env: s.env, Cwd: s.cwd, Rlimits: s.rlimits, Net: s.att, Disk: s.disk, Digests: s.digests,
		Group: s.vm.cfg.Cgroup != nil, CPUMillis: s.cpuMillis, MemoryMB: s.memoryMB, Vsock: s.vm.cfg.Vsock})
	return b
}

// Root: the VM's files are not reachable from the node.
func (s *sandbox) Root() string { return "" }

func (s *sandbox) Start(ctx context.Context, p backend.ProcSpec) (backend.Process, error) {
	if p.Cwd == "" {
		p.Cwd = s.cwd
	}
	return s.vm.start(ctx, p, s.rlimits)
}

func (s *sandbox) Exited() context.Context { return s.exited }

// Stats are the VM's on the node: its memory, what its QEMU cgroup is
// charged (the guest memory QEMU touched, its own, the page cache of
// its disks: what the cgroup's limit holds it to), or without a cgroup
// the QEMU process's proportional set size; its CPU time; and the
// sandbox's cgroup's in the guest: OOM kills and processes (not while
// paused: the agent answers nothing then).
func (s *sandbox) Stats() (backend.Stats, error) {
	pid := s.vm.Pid()
	var st backend.Stats
	if g := s.vm.cfg.Cgroup; g != nil {
		gs, err := g.Stats()
		if err != nil {
			return st, errdefs.Wrap(errdefs.Unavailable, err, "read the VM's cgroup")
		}
		st.MemoryBytes, st.MemoryCache = gs.MemoryBytes, gs.MemoryCache
	} else {
		use, err := processMemory(pid)
		if err != nil {
			return st, err
		}
		st.MemoryBytes, st.MemoryCache = use.Bytes, use.File
	}
	if !s.paused.Load() {
		cs, err := s.cgroupStats()
		if err != nil {
			return st, err
		}
		st.OOMKills, st.Pids = cs.OOMKills, cs.Pids
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := strings.LastIndexByte(string(b), ')'); i > 0 {
			f := strings.Fields(string(b)[i+2:])
			if len(f) > 12 {
				ut, _ := strconv.ParseUint(f[11], 10, 64)
				stt, _ := strconv.ParseUint(f[12], 10, 64)
				st.CPUUsage = time.Duration(ut+stt) * (time.Second / 100) // USER_HZ
			}
		}
	}
	return st, nil
}

// Destroy stops the VM (its tap goes with its QEMU), then removes its
// network's rules and address.
func (s *sandbox) Destroy(ctx context.Context) error {
	err := s.vm.Close()
	if s.att != nil {
		err = errors.Join(err, s.net.Detach(s.id, *s.att))
	}
	return err
}

package microvm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guestkernel"
)

// Name is the backend's name in CreateRequest.backend.
const Name = "microvm"

// guestOverheadMB is the memory a VM has beyond its sandbox's limit: the
// guest kernel and its page cache, the agent, warren-init.
const guestOverheadMB = 96

// Options configure the backend.
type Options struct {
	StateDir   string // the backend's directory: vms/<id>/ and initramfs images
	QEMU       string // default: qemu-system-x86_64 on $PATH
	KernelDir  string // default: guestkernel.Dir
	GuestAgent string // the static warren-guest binary
	KVM        bool
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
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "vms"), 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "microvm state directory")
	}
	return &Backend{opts: opts, kernel: k}, nil
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
	case spec.Restore != "":
		return nil, errdefs.Unsupportedf("microvm: restoring a checkpoint is not implemented yet")
	case spec.DiskBytes > 0:
		return nil, errdefs.Unsupportedf("microvm: a disk limit is not implemented yet (the writable layer is guest memory)")
	case len(spec.Devices) > 0 || len(spec.Mounts) > 0:
		return nil, errdefs.Unsupportedf("microvm: devices and host mounts are not passed into VMs")
	case !spec.Network.IsNone():
		// The VM has no network device: a policy that allows anything
		// is refused, not dropped.
		return nil, errdefs.Unsupportedf("microvm: network policy %s: VMs have no network yet (mode none only)", spec.Network)
	case spec.QoS.Latency():
		// QEMU runs in the daemon's cgroup, not one of the VM's own that
		// a class could weigh: refused rather than ignored.
		return nil, errdefs.Unsupportedf("microvm: QoS class ls is not implemented for VMs yet (their QEMU has no cgroup of its own); use the container backend or class be")
	case len(spec.Layers) == 0:
		return nil, errdefs.Invalidf("microvm: no layers")
	}
	var layers []string
	for i := len(spec.Layers) - 1; i >= 0; i-- { // bottom first
		l := spec.Layers[i]
		if l.Blob == "" {
			return nil, errdefs.Invalidf("microvm: layer %q is a directory, not an EROFS blob: import the image into an EROFS store", l.Digest)
		}
		layers = append(layers, l.Blob)
	}
	// The VM holds the sandbox's memory limit and what the guest needs
	// of its own (kernel, agent: guestOverheadMB); the limit itself is the
	// sandbox's cgroup's in the guest.
	mem := 256 + guestOverheadMB
	if spec.MemoryBytes > 0 {
		mem = int(spec.MemoryBytes>>20) + guestOverheadMB
	}
	cpus := 1
	if spec.CPUMillis > 1000 {
		cpus = int((spec.CPUMillis + 999) / 1000)
	}
	// The directory is the claim on the id.
	if err := os.Mkdir(b.vmDir(spec.ID), 0o700); err != nil {
		if os.IsExist(err) {
			return nil, errdefs.AlreadyExistsf("microvm: sandbox %s exists", spec.ID)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "microvm: VM directory")
	}
	v, err := Boot(ctx, Config{QEMU: b.opts.QEMU, Kernel: b.kernel, GuestAgent: b.opts.GuestAgent,
		Dir: b.vmDir(spec.ID), Layers: layers, MemoryMB: mem, CPUs: cpus, KVM: b.opts.KVM,
		Hostname: spec.Hostname, CacheDir: b.opts.StateDir, SandboxMemory: spec.MemoryBytes, SandboxPids: spec.PidsMax})
	if err != nil {
		_ = os.RemoveAll(b.vmDir(spec.ID))
	}
	if err != nil {
		return nil, err
	}
	exited, cancel := context.WithCancel(context.Background())
	go func() { <-v.done; cancel() }()
	return &sandbox{id: spec.ID, vm: v, exited: exited, env: spec.Env, cwd: spec.Workdir}, nil
}

// vmState is what the daemon keeps of a VM for Adopt.
type vmState struct {
	Pid int    `json:"pid"`
	Dir string `json:"dir"`
}

// Adopt: a VM's agent session does not survive its daemon yet (the guest
// would have to take a new session on its port), so an adopted VM is
// stopped and reported gone.
func (b *Backend) Adopt(ctx context.Context, id string, state []byte) (backend.Sandbox, error) {
	var st vmState
	_ = json.Unmarshal(state, &st)
	b.stopOrphan(id, st.Pid)
	return nil, errdefs.NotFoundf("microvm: sandbox %s did not survive the daemon's restart (VMs are not adopted yet)", id)
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
	return nil
}

// stopOrphan kills the QEMU of VM id (found by its directory in the
// command line, pid a hint) and removes the directory.
func (b *Backend) stopOrphan(id string, pid int) {
	dir := b.vmDir(id)
	for _, p := range qemuPids(dir, pid) {
		_ = syscall.Kill(p, syscall.SIGKILL)
		for i := 0; i < 200; i++ {
			if _, err := os.Stat("/proc/" + strconv.Itoa(p)); err != nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	_ = os.RemoveAll(dir)
}

// qemuPids are the processes whose command line names dir's agent
// socket: that VM's QEMU.
func qemuPids(dir string, hint int) []int {
	want := filepath.Join(dir, "agent.sock")
	var out []int
	check := func(pid int) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(b), want) {
			out = append(out, pid)
		}
	}
	if hint > 0 {
		check(hint)
		if len(out) > 0 {
			return out
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			check(pid)
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
}

func (s *sandbox) ID() string { return s.id }

func (s *sandbox) State() []byte {
	b, _ := json.Marshal(vmState{Pid: s.vm.Pid(), Dir: s.vm.cfg.Dir})
	return b
}

// Root: the VM's files are not reachable from the node.
func (s *sandbox) Root() string { return "" }

func (s *sandbox) Start(ctx context.Context, p backend.ProcSpec) (backend.Process, error) {
	if p.Cwd == "" {
		p.Cwd = s.cwd
	}
	return s.vm.Start(ctx, p)
}

func (s *sandbox) Exited() context.Context { return s.exited }

// Stats are the QEMU process's: its resident memory (guest memory it
// touched, QEMU's own) and CPU time.
func (s *sandbox) Stats() (backend.Stats, error) {
	pid := s.vm.Pid()
	var st backend.Stats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, errdefs.Wrap(errdefs.Unavailable, err, "microvm stats")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			st.MemoryBytes = kb << 10
		}
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

func (s *sandbox) Destroy(ctx context.Context) error { return s.vm.Close() }

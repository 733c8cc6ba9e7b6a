package microvm

import (
	"context"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/rlimit"
)

// What other VM backends (internal/fullvm) share of this one: the agent's
// host side, the VM's lifecycle and the sandbox built on them.

// ForVM is the device for VM id (the kernel's needs a CID of its own).
func (d Vsock) ForVM(id string) *Vsock { return d.forVM(id) }

// VsockBackendPid is the pid of the VM's vhost-user vsock backend, 0 if
// it has none.
func (v *VM) VsockBackendPid() int {
	if !v.cfg.vhostUser() {
		return 0
	}
	if pids := vsockBackendPids(v.cfg.Dir); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// ProcessMemory is a process's memory (smaps_rollup).
func ProcessMemory(pid int) (backend.MemoryUse, error) { return processMemory(pid) }

// AgentSocket and QMPSocket are the sockets QEMU makes in a VM's
// directory: the agent's virtio-serial port and QMP.
const (
	AgentSocket = "agent.sock"
	QMPSocket   = qmpSocket
)

// Sandbox is a sandbox on a VM whose guest runs the agent: exec, files,
// background processes, ports, pause, stats (backend.Sandbox and its
// optional interfaces).
type Sandbox = sandbox

// SandboxOpts are what NewSandbox's sandbox is made of besides its VM.
type SandboxOpts struct {
	Kind string // the backend, in errors
	// Env and Cwd are its processes' defaults, Rlimits their limits
	// (each call to the agent carries them).
	Env     []string
	Cwd     string
	Rlimits []guest.Rlimit
	// CPUMillis is its QEMU cgroup's CPU quota (Config.Cgroup).
	CPUMillis int64
	// MemoryMB is the guest's memory (0: unknown, and memory updates are
	// refused), OverheadMB what of it the guest's OS keeps: a memory
	// limit may be raised up to the rest.
	MemoryMB, OverheadMB int
	// Network and Net are its network (netpolicy.Node.AttachTap), nil
	// for none: Update changes its tap's rules, Destroy detaches it.
	Network *netpolicy.Node
	Net     *netpolicy.Attachment
	// Disk says its writable layer is on the disk image in the VM's
	// directory (DiskImage): DiskUsage reads it.
	Disk bool
}

// NewSandbox makes the sandbox of VM v, whose guest agent runs as a
// service of a full OS (internal/fullvm): its commands' memory and pids
// limits are a cgroup's in the guest ("limits": SetGuestLimits, Update).
func NewSandbox(id string, v *VM, o SandboxOpts) *Sandbox {
	b := &Backend{opts: Options{Network: o.Network}}
	s := b.newSandbox(id, v, vmState{Env: o.Env, Cwd: o.Cwd, Rlimits: o.Rlimits, CPUMillis: o.CPUMillis, MemoryMB: o.MemoryMB,
		Net: o.Net, Disk: o.Disk})
	s.kind, s.overheadMB = o.Kind, o.OverheadMB
	return s
}

// SetGuestLimits sets the memory and pids limits of the guest's commands
// (0: none), as at a create: the agent of a full OS gets them after its
// boot, having no kernel command line of Warren's to read them from.
func (s *sandbox) SetGuestLimits(ctx context.Context, memory, pids int64) error {
	return s.guestLimits(ctx, &memory, &pids)
}

// SetGuestNetwork gives the guest's interface of MAC address mac its
// address and gateway on the sandbox's /31, and with resolv the
// sandbox's resolv.conf naming the gateway's resolver: the agent of a
// full OS gets them after its boot, as its limits (SetGuestLimits).
func (s *sandbox) SetGuestNetwork(ctx context.Context, mac string, resolv bool) error {
	if s.att == nil {
		return nil
	}
	gw, addr := s.net.Addrs(s.att.Index)
	n := &guest.Network{Addr: addr.String(), Gateway: gw.String(), MAC: mac}
	if resolv {
		n.Nameserver = gw.String()
	}
	var r struct{}
	if err := s.vm.call(ctx, guest.Request{Op: "network", Network: n}, nil, &r); err != nil {
		return errdefs.Wrap(errdefs.CategoryOf(err), err, s.name()+": sandbox "+s.id+": network in the guest")
	}
	return nil
}

// MinDiskBytes is the smallest disk limit.
const MinDiskBytes = minDiskBytes

// DiskImage is the disk image of the VM whose directory is dir.
func DiskImage(dir string) string { return diskImage(dir) }

// MakeDisk creates the disk image img, size bytes, sparse, as ext4.
func MakeDisk(img string, size int64) error { return makeDisk(img, size) }

// GuestRlimits are the limits of a sandbox's processes as the agent sets
// them; Invalid for a hard limit above the node's.
func GuestRlimits(ls []rlimit.Limit) ([]guest.Rlimit, error) { return guestRlimits(ls) }

// QEMUPids are the processes whose command line names dir's agent
// socket (hint first if it is one): that VM's QEMU.
func QEMUPids(dir string, hint int) []int { return qemuPids(dir, hint) }

// MarkPaused records that the VM was found stopped (adopted paused).
func (s *sandbox) MarkPaused() { s.paused.Store(true) }

// VMPid is the VM's QEMU's.
func (s *sandbox) VMPid() int { return s.vm.Pid() }

// Isolate gives a latency-sensitive VM's QEMU a core-scheduling cookie of
// its own where the kernel has core scheduling.
func Isolate(pid int, q backend.QoS) error { return isolate(pid, q) }

// AgentLosses is how often the VM's agent went while it ran (VM.AgentLosses).
func (s *sandbox) AgentLosses() int64 { return s.vm.AgentLosses() }

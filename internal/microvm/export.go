package microvm

import (
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/rlimit"
)

// What other VM backends (internal/fullvm) share of this one: the agent's
// host side, the VM's lifecycle and the sandbox built on them.

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

// NewSandbox makes the sandbox of VM v; env and cwd are its processes'
// defaults, rl their limits (each call to the agent carries them).
// The whole guest is the sandbox: its memory and pids are the VM's, fixed
// at boot; cpuMillis is its QEMU cgroup's CPU quota (Config.Cgroup).
func NewSandbox(id string, v *VM, env []string, cwd string, rl []guest.Rlimit, cpuMillis int64) *Sandbox {
	s := (&Backend{}).newSandbox(id, v, vmState{Env: env, Cwd: cwd, Rlimits: rl, CPUMillis: cpuMillis})
	s.whole = true
	return s
}

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

package daemon

import (
	"runtime"
	"slices"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// qosOf validates a class and its pinning as a request names them ("":
// best-effort) and returns them as the backend takes them.
func qosOf(class string, cpus []int32) (backend.QoS, error) {
	q := backend.QoS{Class: class}
	switch class {
	case "":
		q.Class = backend.QoSBestEffort
	case backend.QoSBestEffort, backend.QoSLatency:
	default:
		return q, errdefs.Invalidf("qos %q: want %q (latency-sensitive) or %q (best-effort)", class, backend.QoSLatency, backend.QoSBestEffort)
	}
	if len(cpus) > 0 && !q.Latency() {
		return q, errdefs.Invalidf("qos_cpus: only a latency-sensitive (%q) sandbox is pinned", backend.QoSLatency)
	}
	n := runtime.NumCPU()
	for _, c := range cpus {
		if c < 0 || int(c) >= n {
			return q, errdefs.Invalidf("qos_cpus: CPU %d out of range [0, %d)", c, n)
		}
		if !slices.Contains(q.CPUs, int(c)) {
			q.CPUs = append(q.CPUs, int(c))
		}
	}
	slices.Sort(q.CPUs)
	return q, nil
}

// recordedQoS is the class of a sandbox's record: records from before
// classes are best-effort, what their sandboxes ran as.
func recordedQoS(info *warrenv1.Sandbox) backend.QoS {
	q := backend.QoS{Class: info.GetQos()}
	if q.Class == "" {
		q.Class = backend.QoSBestEffort
	}
	for _, c := range info.GetQosCpus() {
		q.CPUs = append(q.CPUs, int(c))
	}
	return q
}

// setQoSInfo writes class q into a record.
func setQoSInfo(info *warrenv1.Sandbox, q backend.QoS) {
	info.Qos, info.QosCpus = q.Class, nil
	for _, c := range q.CPUs {
		info.QosCpus = append(info.QosCpus, int32(c))
	}
}

// Admission is a node's own limit on what it runs (warren serve
// --cpu-overcommit, --memory-overcommit, --max-sandboxes): a create, fork
// or restore past any of them is refused with Exhausted. A zero field is
// no limit.
type Admission struct {
	// CPUOvercommit admits sandboxes while the CPU they asked for
	// (Resources.cpu_millis; 0 asks for none) stays within the node's
	// cores times the ratio.
	CPUOvercommit float64
	// MemoryOvercommit: the same for memory limits (the node default
	// counted for a sandbox that set none) against the node's memory.
	MemoryOvercommit float64
	// MaxSandboxes caps the resident sandboxes.
	MaxSandboxes int
}

func (m *Manager) admission() Admission {
	return Admission{CPUOvercommit: m.cfg.CPUOvercommit, MemoryOvercommit: m.cfg.MemoryOvercommit, MaxSandboxes: m.cfg.MaxSandboxes}
}

func (a Admission) limited() bool {
	return a.CPUOvercommit > 0 || a.MemoryOvercommit > 0 || a.MaxSandboxes > 0
}

// resident: a sandbox that holds the node's CPU or memory, or is being
// made or restored. A hibernated one holds neither (its restore is
// admitted then); stopped and deleting ones are on their way out.
func (s *sandbox) residentLocked() bool {
	switch s.st {
	case stateStopped, stateDeleting:
		return false
	case stateHibernated:
		return s.admitted
	}
	return true
}

// usage is what the node's resident sandboxes take.
type usage struct {
	cpu, mem int64
	n        int
}

// usageLocked sums the resident sandboxes other than skip; m.mu held (read or
// write), each sandbox's mu taken in turn (m.mu before s.mu, as
// everywhere).
func (m *Manager) usageLocked(skip *sandbox) usage {
	var u usage
	for _, s := range m.sandboxes {
		if s == skip {
			continue
		}
		s.mu.Lock()
		if s.residentLocked() {
			u.n++
			u.cpu += s.info.GetResources().GetCpuMillis()
			u.mem += s.info.GetResources().GetMemoryBytes()
		}
		s.mu.Unlock()
	}
	return u
}

// nodeCapacity is the node's CPU (millis) and memory (bytes).
func nodeCapacity() (int64, int64) { return int64(runtime.NumCPU()) * 1000, memTotal() }

// admitLocked refuses a sandbox asking for res when the node's resident
// sandboxes (other than s) and it would pass an admission limit; m.mu
// held for writing, so that two creates cannot both take the last room.
// Nothing is counted without a limit (a scan per create, on a node of
// thousands, only where it buys something).
func (m *Manager) admitLocked(s *sandbox, res *warrenv1.Resources) error {
	a := m.admission()
	if !a.limited() {
		return nil
	}
	u := m.usageLocked(s)
	if a.MaxSandboxes > 0 && u.n+1 > a.MaxSandboxes {
		return errdefs.Exhaustedf("node %s is full: %d resident sandboxes, its --max-sandboxes is %d", m.nodeName(), u.n, a.MaxSandboxes)
	}
	cpuCap, memCap := nodeCapacity()
	if a.CPUOvercommit > 0 {
		limit := int64(float64(cpuCap) * a.CPUOvercommit)
		if want := res.GetCpuMillis(); u.cpu+want > limit {
			return errdefs.Exhaustedf("node %s has no CPU left: its sandboxes asked for %d of %d cpu_millis (%d cores x --cpu-overcommit %g), this one for %d",
				m.nodeName(), u.cpu, limit, cpuCap/1000, a.CPUOvercommit, want)
		}
	}
	if a.MemoryOvercommit > 0 {
		limit := int64(float64(memCap) * a.MemoryOvercommit)
		if want := res.GetMemoryBytes(); u.mem+want > limit {
			return errdefs.Exhaustedf("node %s has no memory left: its sandboxes asked for %d of %d bytes (%d bytes x --memory-overcommit %g), this one for %d",
				m.nodeName(), u.mem, limit, memCap, a.MemoryOvercommit, want)
		}
	}
	return nil
}

func (m *Manager) nodeName() string {
	if m.cfg.NodeName != "" {
		return m.cfg.NodeName
	}
	return "(this node)"
}

// nodeFree is what the node still admits (NodeStatus.free): -1 for no
// limit of a kind.
func (m *Manager) nodeFree() *warrenv1.NodeFree {
	a := m.admission()
	f := &warrenv1.NodeFree{CpuMillis: -1, MemoryBytes: -1, Sandboxes: -1}
	if !a.limited() {
		return f
	}
	m.mu.RLock()
	u := m.usageLocked(nil)
	m.mu.RUnlock()
	cpuCap, memCap := nodeCapacity()
	if a.CPUOvercommit > 0 {
		f.CpuMillis = max(0, int64(float64(cpuCap)*a.CPUOvercommit)-u.cpu)
	}
	if a.MemoryOvercommit > 0 {
		f.MemoryBytes = max(0, int64(float64(memCap)*a.MemoryOvercommit)-u.mem)
	}
	if a.MaxSandboxes > 0 {
		f.Sandboxes = int32(max(0, a.MaxSandboxes-u.n))
	}
	return f
}

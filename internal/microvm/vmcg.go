package microvm

import (
	"errors"
	"os"
	"strings"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/coresched"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/qos"
)

// defaultCgroupParent is the container backend's default: the daemon
// gives both backends its --cgroup-parent, so that a VM's QEMU and a
// container weigh against each other as siblings (a class is relative
// to a group's siblings). Tests set their own.
var defaultCgroupParent = "warren"

// GroupName is the host cgroup of VM id of backend name (microvm,
// fullvm): a sibling of the container sandboxes' groups below the same
// parent, named with a ':' that no sandbox id holds (backend.ValidID), so
// that neither backend's sweep takes the other's.
func GroupName(backendName, id string) string { return backendName + ":" + id }

// qemuOverheadMB is what a QEMU process holds beyond its guest's memory
// on the host: its own heap, device state, I/O buffers. The limit also
// counts page cache (QEMU's binary, the kernel, the layers it read), which
// the kernel reclaims before it OOM-kills. Measured under TCG: a VM of 384
// MiB was charged 187 MiB anonymous and 108 MiB cache once booted, 368
// MiB anonymous with 177 MiB used by its sandbox (the cgroup's
// memory.stat); 256 MiB is the margin beyond the guest's memory.
const qemuOverheadMB = 256

// tcgCodeMB is TCG's translation buffer, which QEMU 7.2 sizes 1 GiB on
// a 64-bit host (tcg/region.c, DEFAULT_CODE_GEN_BUFFER_SIZE) and fills
// as the guest runs code it has not run before: touched lazily, but a
// long-running VM reaches it.
const tcgCodeMB = 1024

// HostMemoryBytes is the memory limit of a VM's QEMU cgroup: the guest's
// memory and QEMU's own with a margin. A host OOM kill takes the whole
// VM, so the limit bounds a runaway QEMU, never a guest using what it was
// given; the sandbox's own limit is the guest cgroup's inside.
func HostMemoryBytes(guestMB int, kvm bool) int64 {
	mb := guestMB + qemuOverheadMB
	if !kvm {
		mb += tcgCodeMB
	}
	return int64(mb) << 20
}

// HostPids is the pids limit of a VM's QEMU cgroup: its main loop, RCU
// and worker threads (the block layer's pool grows to 64) and one thread
// per vCPU, with room to spare. QEMU forks nothing.
func HostPids(cpus int) int64 { return int64(128 + cpus) }

// HostGroup is what a VM's QEMU cgroup is made with.
type HostGroup struct {
	Parent, Backend, ID string
	GuestMB, CPUs       int
	KVM                 bool
	// CPUMillis is the VM's CPU quota on the host (0: none): its vCPUs
	// and QEMU's own threads together.
	CPUMillis int64
	QoS       backend.QoS
}

// NewHostGroup makes a VM's QEMU cgroup with its limits and class
// (internal/qos, as a container's group). QEMU joins it before it runs
// (Config.Cgroup).
func NewHostGroup(h HostGroup) (cgroups.Group, error) {
	if err := qos.Check(h.QoS); err != nil {
		return nil, err
	}
	if h.Parent == "" {
		h.Parent = defaultCgroupParent
	}
	g, err := cgroups.New(h.Parent, GroupName(h.Backend, h.ID), cgroups.Resources{
		CPUMillis: h.CPUMillis, MemoryBytes: HostMemoryBytes(h.GuestMB, h.KVM), PidsMax: HostPids(h.CPUs), AnyDevice: true,
	})
	if err != nil {
		return nil, err
	}
	if err := qos.Apply(g, nil, h.QoS); err != nil {
		return nil, errors.Join(err, g.Delete())
	}
	return g, nil
}

// isolate gives a latency-sensitive VM's QEMU a core-scheduling cookie
// of its own where the kernel has core scheduling (qos.Apply: the
// group's processes; QEMU's threads are one process).
func isolate(pid int, q backend.QoS) error {
	if !coresched.Available() {
		return nil
	}
	return coresched.Isolate([]int{pid}, q.Latency())
}

// LoadHostGroup opens the cgroup of an adopted VM; nil if it has none (a
// VM booted by a version before host cgroups).
func LoadHostGroup(parent, backendName, id string) cgroups.Group {
	if parent == "" {
		parent = defaultCgroupParent
	}
	g, err := cgroups.Load(parent, GroupName(backendName, id))
	if err != nil {
		return nil
	}
	if _, err := g.Procs(); err != nil {
		return nil
	}
	return g
}

// SweepHostGroups kills what is left in, and removes, the QEMU cgroups of
// backendName below parent whose ids are not in keep.
func SweepHostGroups(parent, backendName string, keep map[string]bool) error {
	if parent == "" {
		parent = defaultCgroupParent
	}
	names, err := cgroups.List(parent)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, backendName+": list cgroups")
	}
	var errs []error
	for _, n := range names {
		id, ok := strings.CutPrefix(n, backendName+":")
		if !ok || keep[id] {
			continue
		}
		errs = append(errs, RemoveHostGroup(parent, backendName, id))
	}
	return errors.Join(errs...)
}

// RemoveHostGroup kills what is left in, and removes, the QEMU cgroup of
// VM id of backendName (none: nothing to do).
func RemoveHostGroup(parent, backendName, id string) error {
	if parent == "" {
		parent = defaultCgroupParent
	}
	g, err := cgroups.Load(parent, GroupName(backendName, id))
	if err != nil {
		return nil // none
	}
	return dropGroup(g)
}

// dropGroup kills what is in g and removes it; a group removed meanwhile
// (a sweep and a VM's own waiter both at it) is no error.
func dropGroup(g cgroups.Group) error {
	err := g.Kill(10 * time.Second)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return errors.Join(err, g.Delete())
}

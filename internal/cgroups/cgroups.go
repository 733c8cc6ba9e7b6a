// Package cgroups gives each sandbox one control group with cpu, memory and
// pids limits, behind one small interface that works on cgroup v1 (and
// hybrid) hosts and on cgroup v2 hosts. Creation and limits go through
// containerd/cgroups; the few counters read on hot paths (OOM kills,
// memory use) are read directly from their files.
//
// Every cgroup directory costs kernel memory (~6 KiB each), so a sandbox
// gets as few as possible: one on v2; on hybrid hosts (v1 controllers
// plus a controller-less cgroup2 at /sys/fs/cgroup/unified) memory, cpu
// and pids for the limits and one unified directory for freezing, killing,
// CPU usage and the process list, while devices is one directory shared by
// every sandbox of a parent (see sharedDevices); on pure v1 hosts cpu,
// cpuacct, memory, pids, freezer and devices.
package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cg "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/kfile"
)

// Root is the mount point of the cgroup filesystem(s).
const Root = "/sys/fs/cgroup"

// Resources are the limits of one sandbox. Zero means unlimited.
type Resources struct {
	CPUMillis   int64
	MemoryBytes int64
	PidsMax     int64
	// AnyDevice leaves device access unconfined: a VM's QEMU opens
	// /dev/kvm, /dev/net/tun and vhost nodes, which the sandboxes'
	// whitelist (allowedDevices) refuses, while its guest reaches no
	// device node of the node.
	AnyDevice bool
}

// Group is one sandbox's control group.
type Group interface {
	// Name is the group's path below the cgroup root, e.g. "warren/sb1".
	Name() string
	AddProc(pid int) error
	// Procs lists the pids in the group.
	Procs() ([]int, error)
	// Kill sends SIGKILL to every process in the group and waits until it
	// is empty or the timeout passes.
	Kill(timeout time.Duration) error
	// Freeze stops every process in the group (and those it forks) until
	// Thaw; it returns once they are all frozen.
	Freeze() error
	Thaw() error
	// Frozen reports whether the group is frozen (a Freeze not thawed,
	// perhaps by an earlier daemon).
	Frozen() (bool, error)
	// Memory reads what the group's processes hold (memory.go).
	Memory() (Memory, error)
	// Reclaim gives back what the group's memory it can: page cache, and
	// anonymous memory where the node has swap. Meant for a frozen group,
	// whose tasks do not fault it back in meanwhile (memory.go).
	Reclaim() error
	// ReclaimIdle gives back what it can of a running group's memory,
	// never risking an OOM kill (memory.go).
	ReclaimIdle() error
	// MemoryPressure is PSI's "some avg10" of the group's memory, -1
	// unknown (memory.go).
	MemoryPressure() float64
	Stats() (Stats, error)
	// CPUUsage reads only the group's CPU time so far (one file).
	CPUUsage() (time.Duration, error)
	// OOMKills reads only the OOM-kill counter: one file, for the exec
	// path, which checks it before and after every process.
	OOMKills() (uint64, error)
	// PidsRefused reads how many forks the pids limit refused
	// (pids.events "max", on v1 as on v2).
	PidsRefused() (uint64, error)
	// SetLimits changes the limits l sets, all or none (limits.go).
	SetLimits(l Limits) error
	// SetQoS sets the group's CPU class (qos.go).
	SetQoS(q QoS) error
	// Delete removes the group; it must be empty. Page cache still
	// charged to it is reclaimed first when there is little of it
	// (LeftoverCacheMax), so that the kernel frees the group at once.
	Delete() error
}

// Stats are the counters the daemon reads.
type Stats struct {
	MemoryBytes uint64
	MemoryCache uint64 // of MemoryBytes, page cache (0 when unread)
	// Of MemoryBytes, anonymous memory (heaps, stacks, tmpfs) and the
	// kernel's (slab, kernel stacks, page tables, sockets) charged to
	// the group (0 when the kernel does not say); MemorySwap is what it
	// has out on swap, beside MemoryBytes.
	MemoryAnon, MemoryKernel, MemorySwap uint64
	OOMKills                             uint64
	CPUUsage                             time.Duration
	Pids                                 uint64
}

// Mode reports "v2", "hybrid" or "v1".
func Mode() string {
	switch cg.Mode() {
	case cg.Unified:
		return "v2"
	case cg.Hybrid:
		return "hybrid"
	case cg.Legacy:
		return "v1"
	}
	return "unavailable"
}

func unified() bool { return cg.Mode() == cg.Unified }

// hybrid: v1 controllers plus a cgroup2 mount at Root/unified (cg.Mode
// checks its filesystem magic).
func hybrid() bool { return cg.Mode() == cg.Hybrid }

// unifiedDir is the hybrid host's cgroup2 mount below Root.
const unifiedDir = "unified"

// legacySubsystems are the hierarchies a sandbox joins on pure v1 hosts
// (and did on hybrid ones before the hybrid layout): only those it needs,
// since every extra hierarchy costs a mkdir and kernel memory per sandbox.
// cpuset is left out because it needs cpus/mems copied in.
var legacySubsystems = []cgroup1.Name{
	cgroup1.Cpu, cgroup1.Cpuacct, cgroup1.Memory,
	cgroup1.Pids, cgroup1.Freezer, cgroup1.Devices,
}

// hybridSubsystems hold the limits on hybrid hosts; the unified directory
// does the rest and devices is shared.
var hybridSubsystems = []cgroup1.Name{cgroup1.Memory, cgroup1.Cpu, cgroup1.Pids}

// v1Subsystems is containerd's default v1 hierarchy, found once: building
// it parses /proc/self/mountinfo and /proc/self/cgroup, 9% of the daemon's
// CPU in a profile of create/exec/delete cycles when done for every group.
// The subsystems hold only their mount points.
var v1Subsystems = sync.OnceValues(cgroup1.Default)

// v1Hierarchy restricts containerd's hierarchy to names (those mounted).
func v1Hierarchy(names []cgroup1.Name) cgroup1.Hierarchy {
	return func() ([]cgroup1.Subsystem, error) {
		all, err := v1Subsystems()
		if err != nil {
			return nil, err
		}
		var out []cgroup1.Subsystem
		for _, s := range all {
			if slices.Contains(names, s.Name()) {
				out = append(out, s)
			}
		}
		return out, nil
	}
}

// allowedDevices are the only device nodes a sandbox may open: the ones its
// minimal /dev holds.
var allowedDevices = []specs.LinuxDeviceCgroup{
	{Allow: false, Access: "rwm"},
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"}, // null
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(5), Access: "rwm"}, // zero
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(7), Access: "rwm"}, // full
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(8), Access: "rwm"}, // random
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(9), Access: "rwm"}, // urandom
	{Allow: true, Type: "c", Major: i64(5), Minor: i64(0), Access: "rwm"}, // tty
	{Allow: true, Type: "c", Major: i64(5), Minor: i64(2), Access: "rwm"}, // ptmx
	{Allow: true, Type: "c", Major: i64(136), Minor: nil, Access: "rwm"},  // pts
}

func i64(v int64) *int64 { return &v }

var (
	extraMu      sync.Mutex
	extraDevices []specs.LinuxDeviceCgroup
)

// AllowDevices adds character devices (major, minor) to what every
// sandbox's devices cgroup allows from then on: the node's GPUs, whose
// nodes only the sandboxes given them have in their /dev (the sandboxes
// cannot make device nodes). Sandboxes of a devices cgroup set up before
// keep its rules.
func AllowDevices(devs [][2]uint32) {
	extraMu.Lock()
	defer extraMu.Unlock()
	for _, d := range devs {
		// rwm, as the standard ones: the kernel merges a rule into an
		// equal device's, and devices.list must read as the rules do.
		r := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: i64(int64(d[0])), Minor: i64(int64(d[1])), Access: "rwm"}
		same := func(e specs.LinuxDeviceCgroup) bool { return deviceRule(e) == deviceRule(r) }
		if !slices.ContainsFunc(allowedDevices, same) && !slices.ContainsFunc(extraDevices, same) {
			extraDevices = append(extraDevices, r)
		}
	}
}

// deviceRules are allowedDevices and those AllowDevices added.
func deviceRules() []specs.LinuxDeviceCgroup {
	extraMu.Lock()
	defer extraMu.Unlock()
	return append(slices.Clip(allowedDevices), extraDevices...)
}

func spec(r Resources) *specs.LinuxResources {
	out := &specs.LinuxResources{}
	if !r.AnyDevice {
		out.Devices = deviceRules()
	}
	if r.MemoryBytes > 0 {
		out.Memory = &specs.LinuxMemory{Limit: i64(r.MemoryBytes)}
		if v1SwapAccounting() {
			out.Memory.Swap = i64(r.MemoryBytes)
		}
	}
	if r.PidsMax > 0 {
		out.Pids = &specs.LinuxPids{Limit: i64(r.PidsMax)}
	}
	if r.CPUMillis > 0 {
		period := uint64(100000)
		out.CPU = &specs.LinuxCPU{Period: &period, Quota: i64(r.CPUMillis * 100)}
	}
	return out
}

// New creates the group parent/name with limits r.
func New(parent, name string, r Resources) (Group, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	path := "/" + parent + "/" + name
	if unified() {
		res := cgroup2.ToResources(spec(r))
		// Devices on v2 need an eBPF program; the minimal /dev and the
		// dropped CAP_MKNOD already confine device access.
		res.Devices = nil
		m, err := cgroup2.NewManager(Root, path, res)
		if err != nil {
			return nil, classify(err, "create cgroup "+path)
		}
		g := &v2Group{name: parent + "/" + name, m: m}
		if r.MemoryBytes > 0 && v2SwapFile(g.dir()) {
			if err := kfile.Write(filepath.Join(g.dir(), "memory.swap.max"), v2SwapMax(r.MemoryBytes)); err != nil {
				_ = m.Delete()
				return nil, classify(err, "bound the swap of cgroup "+path)
			}
		}
		return g, nil
	}
	if hybrid() {
		g, err := newHybrid(parent, name, r)
		if !errors.Is(err, errNoHybrid) {
			return g, err
		}
	}
	c, err := cgroup1.New(cgroup1.StaticPath(path), spec(r), cgroup1.WithHierarchy(v1Hierarchy(legacySubsystems)))
	if err != nil {
		// cgroup1.New may have created some hierarchies before failing.
		_ = removeDirs(parent, name)
		return nil, classify(err, "create cgroup "+path)
	}
	return &v1Group{name: parent + "/" + name, c: c}, nil
}

// errNoHybrid makes New fall back to the legacy layout for one sandbox.
var errNoHybrid = errors.New("hybrid cgroup layout unavailable")

func newHybrid(parent, name string, r Resources) (Group, error) {
	path := "/" + parent + "/" + name
	g := &hybridGroup{name: parent + "/" + name}
	err := unix.Mkdir(g.udir(), 0o755)
	if err == unix.ENOENT {
		err = os.MkdirAll(g.udir(), 0o755)
	}
	if err != nil {
		return nil, classify(&os.PathError{Op: "mkdir", Path: g.udir(), Err: err}, "create cgroup "+path)
	}
	// cgroup.kill needs Linux 5.14 (cgroup.freeze 5.2): without it, the
	// legacy layout. The kernel does not change while we run.
	if !hasKill(g.udir()) {
		_ = unix.Rmdir(g.udir())
		return nil, errNoHybrid
	}
	if !r.AnyDevice {
		devices, err := sharedDevices(parent)
		if err != nil {
			_ = os.Remove(g.udir())
			return nil, err
		}
		g.devices = devices
	}
	res := spec(r)
	res.Devices = nil
	if _, err := cgroup1.New(cgroup1.StaticPath(path), res, cgroup1.WithHierarchy(v1Hierarchy(hybridSubsystems))); err != nil {
		_ = removeDirs(parent, name)
		return nil, classify(err, "create cgroup "+path)
	}
	return g, nil
}

var (
	killOnce sync.Once
	killOK   bool
)

// hasKill reports whether cgroup2 directories have cgroup.kill, looking at
// the first directory it is given.
func hasKill(dir string) bool {
	killOnce.Do(func() {
		_, err := os.Stat(filepath.Join(dir, "cgroup.kill"))
		killOK = err == nil
	})
	return killOK
}

// hasDevices: the devices hierarchy is mounted (and usable: containerd
// leaves it out in a user namespace). Mounts do not change while we run.
var hasDevices = sync.OnceValues(func() (bool, error) {
	subs, err := v1Hierarchy([]cgroup1.Name{cgroup1.Devices})()
	return len(subs) > 0, err
})

// devicesMu serializes the setup of shared devices cgroups.
var devicesMu sync.Mutex

// sharedDevices returns the devices cgroup every hybrid-layout sandbox
// below parent joins: the directory Root/devices/<parent> itself, with the
// allowedDevices whitelist. The whitelist is the same for every sandbox,
// so one shared directory confines them as well as one each, without the
// ~6 KiB of kernel memory a per-sandbox directory costs. It returns ""
// when no devices hierarchy is mounted (as containerd skips it then), and
// errNoHybrid while the directory holds sandboxes of the legacy layout
// (from before an upgrade): the kernel refuses "a" rules in a devices
// cgroup with children, and their parent must not be left open. Sandboxes
// created meanwhile take the legacy layout too, so a busy node switches
// only once it has drained.
func sharedDevices(parent string) (string, error) {
	has, err := hasDevices()
	if err != nil || !has {
		return "", classify(err, "find the devices cgroup")
	}
	dir := filepath.Join(Root, string(cgroup1.Devices), parent)
	devicesMu.Lock()
	defer devicesMu.Unlock()
	// Idempotent: a restarted daemon, or its sandboxes already in dir,
	// find it set up and nothing is rewritten. Checked on every create,
	// so that one opened meanwhile is repaired.
	ok, err := whitelisted(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", classify(err, "create devices cgroup "+parent)
		}
		ok, err = whitelisted(dir)
	}
	if err != nil {
		return "", classify(err, "read devices cgroup "+parent)
	}
	if ok {
		return dir, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", classify(err, "read devices cgroup "+parent)
	}
	for _, e := range ents {
		if e.IsDir() {
			return "", errNoHybrid
		}
	}
	for _, d := range deviceRules() {
		file := "devices.deny"
		if d.Allow {
			file = "devices.allow"
		}
		err := kfile.Write(filepath.Join(dir, file), deviceRule(d))
		// A child removed just now stays online for a moment.
		for i := 0; i < 100 && d.Type == "" && errors.Is(err, syscall.EINVAL); i++ {
			time.Sleep(2 * time.Millisecond)
			err = kfile.Write(filepath.Join(dir, file), deviceRule(d))
		}
		if d.Type == "" && errors.Is(err, syscall.EINVAL) {
			return "", errNoHybrid
		}
		if err != nil {
			return "", classify(err, "set devices cgroup "+parent)
		}
	}
	if ok, err := whitelisted(dir); err != nil || !ok {
		return "", classify(errors.Join(err, errors.New("devices.list differs from the whitelist")), "set devices cgroup "+parent)
	}
	return dir, nil
}

// deviceRule formats d as devices.allow/deny and devices.list do.
func deviceRule(d specs.LinuxDeviceCgroup) string {
	num := func(n *int64) string {
		if n == nil || *n < 0 {
			return "*"
		}
		return strconv.FormatInt(*n, 10)
	}
	typ := d.Type
	if typ == "" {
		typ = "a"
	}
	return fmt.Sprintf("%s %s:%s %s", typ, num(d.Major), num(d.Minor), d.Access)
}

// whitelisted reports whether the devices cgroup dir denies all but
// allowedDevices.
func whitelisted(dir string) (bool, error) {
	b, err := kfile.Read(filepath.Join(dir, "devices.list"))
	if err != nil {
		return false, err
	}
	var want []string
	for _, d := range deviceRules() {
		if d.Allow {
			want = append(want, deviceRule(d))
		}
	}
	have := strings.Split(strings.TrimSpace(string(b)), "\n")
	slices.Sort(want)
	slices.Sort(have)
	return slices.Equal(want, have), nil
}

// Load opens an existing group, in the layout it was created with: a
// daemon adopts sandboxes of the version before it.
func Load(parent, name string) (Group, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	path := "/" + parent + "/" + name
	if unified() {
		m, err := cgroup2.Load(path, cgroup2.WithMountpoint(Root))
		if err != nil {
			return nil, classify(err, "load cgroup "+path)
		}
		return &v2Group{name: parent + "/" + name, m: m}, nil
	}
	if hybrid() {
		// A unified directory marks the hybrid layout. Its v1 directories
		// may be missing (a crash inside New): Kill and Delete still work.
		g := &hybridGroup{name: parent + "/" + name}
		if _, err := os.Stat(g.udir()); err == nil {
			if _, err := os.Stat(filepath.Join(Root, string(cgroup1.Devices), parent)); err == nil {
				g.devices = filepath.Join(Root, string(cgroup1.Devices), parent)
			}
			return g, nil
		}
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(path), cgroup1.WithHierarchy(v1Hierarchy(legacySubsystems)))
	if err != nil {
		return nil, classify(err, "load cgroup "+path)
	}
	return &v1Group{name: parent + "/" + name, c: c}, nil
}

// v1Dirs are the directories a group parent/name may have on a v1 or
// hybrid host, in either layout. Never the shared devices directory.
func v1Dirs(parent, name string) []string {
	var out []string
	for _, n := range legacySubsystems {
		out = append(out, filepath.Join(Root, string(n), parent, name))
	}
	if hybrid() {
		out = append(out, filepath.Join(Root, unifiedDir, parent, name))
	}
	// A pinned group's cpuset (qos.go), in either layout.
	return append(out, filepath.Join(Root, string(cgroup1.Cpuset), parent, name))
}

// RemoveParent removes parent's own directories, in every hierarchy of the
// host's layout (the shared devices directory too), once its groups are
// gone. A backend keeps its parent for the next daemon; tests, which own a
// parent per process, call this so that none is left behind (they used to
// list hierarchy names by hand and missed the ones a host names apart,
// such as a lone "cpu").
func RemoveParent(parent string) error {
	if err := validParent(parent); err != nil {
		return err
	}
	if unified() {
		return rmdirs([]string{filepath.Join(Root, parent)})
	}
	return rmdirs(append(v1Dirs(parent, ""), filepath.Join(Root, string(cgroup1.Devices), parent)))
}

// List returns the names of the groups below parent, in any hierarchy.
func List(parent string) ([]string, error) {
	dirs := []string{filepath.Join(Root, parent)}
	if !unified() {
		dirs = v1Dirs(parent, "")
	}
	seen := map[string]bool{}
	var out []string
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				out = append(out, e.Name())
			}
		}
	}
	return out, nil
}

func validName(name string) error {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return errdefs.Invalidf("bad cgroup name %q", name)
	}
	return nil
}

func classify(err error, what string) error {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.ENOMEM):
		return errdefs.Wrap(errdefs.Exhausted, err, what)
	case errors.Is(err, os.ErrNotExist), errors.Is(err, cgroup1.ErrCgroupDeleted):
		return errdefs.Wrap(errdefs.NotFound, err, what)
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ERANGE):
		return errdefs.Wrap(errdefs.Invalid, err, what)
	}
	return errdefs.Wrap(errdefs.Internal, err, what)
}

// FreezeTimeout bounds Freeze: a task that cannot be frozen (in an
// uninterruptible sleep) must not block the caller for ever.
const FreezeTimeout = 10 * time.Second

// freeze asks for the frozen state (again, as tasks may join meanwhile)
// until the group reports it, or thaws it and fails after FreezeTimeout.
func freeze(name string, request func() error, frozen func() (bool, error), thaw func() error) error {
	deadline := time.Now().Add(FreezeTimeout)
	// Sleeping tasks freeze at once and a running one at its next
	// return to user space, often within tens of microseconds: poll from
	// 20 µs, doubling to 1 ms. A flat 1 ms made most freezes take at
	// least that (`warren bench hibernate`'s raw freeze+thaw p50: 1.21 to
	// 1.24 ms in four of five runs; 0.11 to 1.16 ms in four runs since).
	wait := 20 * time.Microsecond
	for {
		if err := request(); err != nil {
			_ = thaw()
			return classify(err, "freeze cgroup "+name)
		}
		ok, err := frozen()
		if err != nil {
			_ = thaw()
			return classify(err, "freeze cgroup "+name)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			_ = thaw()
			return errdefs.Unavailablef("cgroup %s did not freeze within %v (a task in uninterruptible sleep?)", name, FreezeTimeout)
		}
		time.Sleep(wait)
		wait = min(2*wait, time.Millisecond)
	}
}

// killUntilEmpty repeatedly SIGKILLs the pids procs() returns until none
// remain. Freezing first stops a fork bomb from outrunning the kill loop.
func killUntilEmpty(procs func() ([]int, error), freeze, thaw func() error, timeout time.Duration) error {
	// The common case on delete: the sandbox's init is gone and took its
	// pid namespace with it, so there is nothing to freeze.
	if pids, err := procs(); err == nil && len(pids) == 0 || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	deadline := time.Now().Add(timeout)
	frozen := freeze != nil && freeze() == nil
	for {
		pids, err := procs()
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if frozen {
			// SIGKILL is delivered to frozen tasks only once they thaw.
			_ = thaw()
			frozen = false
		}
		if time.Now().After(deadline) {
			return errdefs.Internalf("cgroup still has %d processes after %v", len(pids), timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func readUint(path string) (uint64, error) {
	b, err := kfile.Read(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// readKey reads "key value" lines (memory.events, memory.oom_control).
// readKeys reads the values of keys from a flat-keyed file such as
// memory.stat in one read; 0 for a key missing or the file unreadable.
func readKeys(path string, keys ...string) []uint64 {
	out := make([]uint64, len(keys))
	b, err := kfile.Read(path)
	if err != nil {
		return out
	}
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		k, v, ok := bytes.Cut(line, []byte{' '})
		if !ok {
			continue
		}
		if i := slices.Index(keys, string(k)); i >= 0 {
			out[i], _ = strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		}
	}
	return out
}

func readKey(path, key string) (uint64, error) {
	b, err := kfile.Read(path)
	if err != nil {
		return 0, err
	}
	// Called on every exec (the OOM counter): no Scanner or Fields.
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		k, v, ok := bytes.Cut(line, []byte{' '})
		if ok && string(k) == key {
			return strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		}
	}
	return 0, nil
}

func readPids(path string) ([]int, error) {
	b, err := kfile.Read(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, l := range strings.Fields(string(b)) {
		p, err := strconv.Atoi(l)
		if err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

type v1Group struct {
	name string
	c    cgroup1.Cgroup
}

func (g *v1Group) Name() string                { return g.name }
func (g *v1Group) dir(sub cgroup1.Name) string { return v1Dir(sub, g.name) }
func (g *v1Group) AddProc(pid int) error {
	return classify(g.c.AddProc(uint64(pid)), "add pid to cgroup")
}
func (g *v1Group) Procs() ([]int, error) {
	return readPids(filepath.Join(g.dir(cgroup1.Pids), "cgroup.procs"))
}
func (g *v1Group) Kill(timeout time.Duration) error {
	return killUntilEmpty(g.Procs, g.c.Freeze, g.c.Thaw, timeout)
}
func (g *v1Group) Freeze() error {
	state := filepath.Join(g.dir(cgroup1.Freezer), "freezer.state")
	return freeze(g.name, func() error { return kfile.Write(state, "FROZEN") }, func() (bool, error) {
		b, err := kfile.Read(state)
		return strings.TrimSpace(string(b)) == "FROZEN", err
	}, g.Thaw)
}
func (g *v1Group) Thaw() error {
	err := kfile.Write(filepath.Join(g.dir(cgroup1.Freezer), "freezer.state"), "THAWED")
	return classify(err, "thaw cgroup "+g.name)
}
func (g *v1Group) OOMKills() (uint64, error)    { return v1OOMKills(g.name) }
func (g *v1Group) PidsRefused() (uint64, error) { return v1PidsRefused(g.name) }

func (g *v1Group) Stats() (Stats, error) {
	ns, _ := g.CPUUsage()
	return v1Stats(g.name, ns)
}

func (g *v1Group) CPUUsage() (time.Duration, error) {
	ns, err := readUint(filepath.Join(g.dir(cgroup1.Cpuacct), "cpuacct.usage"))
	return time.Duration(ns), classify(err, "read CPU use of cgroup "+g.name)
}
func (g *hybridGroup) CPUUsage() (time.Duration, error) { return cpuUsageOf(g.name, g.udir()) }
func (g *v2Group) CPUUsage() (time.Duration, error)     { return cpuUsageOf(g.name, g.dir()) }

func cpuUsageOf(name, dir string) (time.Duration, error) {
	usec, err := readKey(filepath.Join(dir, "cpu.stat"), "usage_usec")
	return time.Duration(usec) * time.Microsecond, classify(err, "read CPU use of cgroup "+name)
}

// v1Dir is group name's directory in the v1 hierarchy sub.
func v1Dir(sub cgroup1.Name, name string) string { return filepath.Join(Root, string(sub), name) }

func v1OOMKills(name string) (uint64, error) {
	return readKey(filepath.Join(v1Dir(cgroup1.Memory, name), "memory.oom_control"), "oom_kill")
}

func v1PidsRefused(name string) (uint64, error) {
	return readKey(filepath.Join(v1Dir(cgroup1.Pids, name), "pids.events"), "max")
}

// v1Stats reads what the v1 memory and pids directories of group name
// hold; the CPU usage comes from wherever the layout keeps it.
func v1Stats(name string, cpu time.Duration) (Stats, error) {
	s := Stats{CPUUsage: cpu}
	var err error
	mem := v1Dir(cgroup1.Memory, name)
	if s.MemoryBytes, err = readUint(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return s, classify(err, "read cgroup stats")
	}
	s.OOMKills, _ = readKey(filepath.Join(mem, "memory.oom_control"), "oom_kill")
	st := readKeys(filepath.Join(mem, "memory.stat"), "total_cache", "total_rss", "total_swap")
	s.MemoryCache, s.MemoryAnon, s.MemorySwap = st[0], st[1], st[2]
	// v1 charges kernel memory to the group as well (usage includes it).
	s.MemoryKernel, _ = readUint(filepath.Join(mem, "memory.kmem.usage_in_bytes"))
	s.Pids, _ = readUint(filepath.Join(v1Dir(cgroup1.Pids, name), "pids.current"))
	return s, nil
}

// Delete removes the group's directories: those of either layout, as a
// group may have been half created (or by an older version).
func (g *v1Group) Delete() error {
	parent, name := splitName(g.name)
	reclaimLeftoversV1(g.name, g.dir(cgroup1.Memory))
	return classify(removeDirs(parent, name), "delete cgroup "+g.name)
}

func splitName(n string) (parent, name string) {
	i := strings.LastIndex(n, "/")
	return n[:i], n[i+1:]
}

// removeDirs removes every directory of group parent/name. A sandbox group
// has no children, so one rmdir each does it (the library's Delete walks
// every hierarchy's tree first, which costs more than the create).
func removeDirs(parent, name string) error { return rmdirs(v1Dirs(parent, name)) }

func rmdirs(dirs []string) error {
	var errs []error
	for _, dir := range dirs {
		var err error
		// rmdir races with the last task's exit (EBUSY): retry briefly.
		for i := 0; i < 500; i++ {
			if err = unix.Rmdir(dir); err == nil || err == unix.ENOENT {
				err = nil
				break
			}
			if err != unix.EBUSY {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			errs = append(errs, &os.PathError{Op: "rmdir", Path: dir, Err: err})
		}
	}
	return errors.Join(errs...)
}

// hybridGroup is a sandbox on a hybrid host: memory, cpu and pids
// directories for the limits, a unified one for the rest, and the parent's
// shared devices directory.
type hybridGroup struct {
	name    string
	devices string // the shared devices cgroup, "" if none
}

func (g *hybridGroup) Name() string                { return g.name }
func (g *hybridGroup) dir(sub cgroup1.Name) string { return v1Dir(sub, g.name) }
func (g *hybridGroup) udir() string                { return filepath.Join(Root, unifiedDir, g.name) }

func (g *hybridGroup) AddProc(pid int) error {
	dirs := []string{g.dir(cgroup1.Memory), g.dir(cgroup1.Cpu), g.dir(cgroup1.Pids), g.udir()}
	if g.devices != "" {
		dirs = append(dirs, g.devices)
	}
	for _, d := range dirs {
		if err := writeProcs(d, pid); err != nil {
			return classify(err, "add pid to cgroup")
		}
	}
	return nil
}

// writeProcs moves pid into the cgroup dir. A task still being forked
// (TASK_NEW) is refused with EINVAL: retry, as runc and containerd do.
func writeProcs(dir string, pid int) error {
	var err error
	for range 5 {
		err = kfile.Write(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid))
		if !errors.Is(err, syscall.EINVAL) {
			return err
		}
		time.Sleep(30 * time.Millisecond)
	}
	return err
}

func (g *hybridGroup) Procs() ([]int, error) {
	return readPids(filepath.Join(g.udir(), "cgroup.procs"))
}

// allProcs adds the pids of the v1 pids directory, which holds a process
// alone only if AddProc was cut short (a daemon crash in New).
func (g *hybridGroup) allProcs() ([]int, error) {
	pids, err := g.Procs()
	more, err2 := readPids(filepath.Join(g.dir(cgroup1.Pids), "cgroup.procs"))
	if err != nil && err2 != nil {
		return nil, err
	}
	for _, p := range more {
		if !slices.Contains(pids, p) {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

func (g *hybridGroup) Kill(timeout time.Duration) error {
	// cgroup.kill is atomic against forks (and works on frozen tasks); the
	// loop then only waits for the group to empty.
	err := kfile.Write(filepath.Join(g.udir(), "cgroup.kill"), "1")
	if err == nil || errors.Is(err, os.ErrNotExist) {
		return killUntilEmpty(g.allProcs, nil, nil, timeout)
	}
	return killUntilEmpty(g.allProcs, g.Freeze, g.Thaw, timeout)
}
func (g *hybridGroup) Freeze() error                { return freeze2(g.name, g.udir()) }
func (g *hybridGroup) Thaw() error                  { return thaw2(g.name, g.udir()) }
func (g *hybridGroup) OOMKills() (uint64, error)    { return v1OOMKills(g.name) }
func (g *hybridGroup) PidsRefused() (uint64, error) { return v1PidsRefused(g.name) }
func (g *hybridGroup) Stats() (Stats, error) {
	cpu, _ := g.CPUUsage()
	return v1Stats(g.name, cpu)
}

// Delete removes the directories of the hybrid layout; Load would not
// have found this layout for a group of the legacy one.
func (g *hybridGroup) Delete() error {
	reclaimLeftoversV1(g.name, g.dir(cgroup1.Memory))
	dirs := make([]string, 0, len(hybridSubsystems)+1)
	for _, n := range hybridSubsystems {
		dirs = append(dirs, g.dir(n))
	}
	dirs = append(dirs, filepath.Join(Root, string(cgroup1.Cpuset), g.name)) // pinned (qos.go)
	return classify(rmdirs(append(dirs, g.udir())), "delete cgroup "+g.name)
}

type v2Group struct {
	name string
	m    *cgroup2.Manager
}

func (g *v2Group) Name() string { return g.name }
func (g *v2Group) dir() string  { return filepath.Join(Root, g.name) }
func (g *v2Group) AddProc(pid int) error {
	return classify(g.m.AddProc(uint64(pid)), "add pid to cgroup")
}
func (g *v2Group) Procs() ([]int, error) {
	return readPids(filepath.Join(g.dir(), "cgroup.procs"))
}
func (g *v2Group) Kill(timeout time.Duration) error {
	// cgroup.kill is atomic against forks; fall back to the loop.
	if err := kfile.Write(filepath.Join(g.dir(), "cgroup.kill"), "1"); err == nil {
		return killUntilEmpty(g.Procs, nil, nil, timeout)
	}
	return killUntilEmpty(g.Procs, g.m.Freeze, g.m.Thaw, timeout)
}
func (g *v2Group) Freeze() error { return freeze2(g.name, g.dir()) }
func (g *v2Group) Thaw() error   { return thaw2(g.name, g.dir()) }
func (g *v2Group) PidsRefused() (uint64, error) {
	return readKey(filepath.Join(g.dir(), "pids.events"), "max")
}

func (g *v2Group) OOMKills() (uint64, error) {
	return readKey(filepath.Join(g.dir(), "memory.events"), "oom_kill")
}

func (g *v2Group) Stats() (Stats, error) {
	var s Stats
	var err error
	// A group made without a memory limit may have no memory controller
	// (containerd enables those its limits use): its memory reads 0, the
	// rest is still read (TestPidsRefused on v2, TestCgroupV2InAVM).
	if s.MemoryBytes, err = readUint(filepath.Join(g.dir(), "memory.current")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return s, classify(err, "read cgroup stats")
	}
	s.OOMKills, _ = readKey(filepath.Join(g.dir(), "memory.events"), "oom_kill")
	st := readKeys(filepath.Join(g.dir(), "memory.stat"), "file", "anon", "kernel",
		"kernel_stack", "slab", "percpu", "sock", "pagetables")
	s.MemoryCache, s.MemoryAnon, s.MemoryKernel = st[0], st[1], st[2]
	if s.MemoryKernel == 0 { // "kernel" is Linux 5.18's; its parts before
		s.MemoryKernel = st[3] + st[4] + st[5] + st[6] + st[7]
	}
	s.MemorySwap, _ = readUint(filepath.Join(g.dir(), "memory.swap.current"))
	s.CPUUsage, _ = g.CPUUsage()
	s.Pids, _ = readUint(filepath.Join(g.dir(), "pids.current"))
	return s, nil
}
func (g *v2Group) Delete() error {
	reclaimLeftoversV2(g.dir())
	var err error
	for i := 0; i < 50; i++ {
		if err = g.m.Delete(); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return classify(err, fmt.Sprintf("delete cgroup %s", g.name))
}

// freeze2, thaw2 and cpuUsage2 work on a cgroup2 directory: a sandbox's
// group on v2 hosts, and its unified-hierarchy group on hybrid ones.
func freeze2(name, dir string) error {
	return freeze(name, func() error {
		return kfile.Write(filepath.Join(dir, "cgroup.freeze"), "1")
	}, func() (bool, error) {
		n, err := readKey(filepath.Join(dir, "cgroup.events"), "frozen")
		return n == 1, err
	}, func() error { return thaw2(name, dir) })
}

func thaw2(name, dir string) error {
	err := kfile.Write(filepath.Join(dir, "cgroup.freeze"), "0")
	return classify(err, "thaw cgroup "+name)
}

// EventsFile is the cgroup.events file of g's cgroup2 directory (a v2
// group's own, a hybrid group's unified one), which the kernel marks
// modified (inotify IN_MODIFY) when the group's populated or frozen state
// changes; "" for a v1 group, which has none.
func EventsFile(g Group) string {
	switch g := g.(type) {
	case *v2Group:
		return filepath.Join(g.dir(), "cgroup.events")
	case *hybridGroup:
		return filepath.Join(g.udir(), "cgroup.events")
	}
	return ""
}

// Populated reads whether the group of the cgroup.events file events, or
// one below it, has a process.
func Populated(events string) (bool, error) {
	n, err := readKey(events, "populated")
	return n != 0, err
}

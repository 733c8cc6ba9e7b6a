// Package cgroups gives each sandbox one control group with cpu, memory and
// pids limits, behind one small interface that works on cgroup v1 (and
// hybrid) hosts and on cgroup v2 hosts. Creation, limits and deletion go
// through containerd/cgroups; the few counters read on hot paths (OOM
// kills, memory use) are read directly from their files.
package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	cg "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Root is the mount point of the cgroup filesystem(s).
const Root = "/sys/fs/cgroup"

// Resources are the limits of one sandbox. Zero means unlimited.
type Resources struct {
	CPUMillis   int64
	MemoryBytes int64
	PidsMax     int64
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
	Stats() (Stats, error)
	// OOMKills reads only the OOM-kill counter: one file, for the exec
	// path, which checks it before and after every process.
	OOMKills() (uint64, error)
	// Delete removes the group; it must be empty.
	Delete() error
}

// Stats are the counters the daemon reads.
type Stats struct {
	MemoryBytes uint64
	OOMKills    uint64
	CPUUsage    time.Duration
	Pids        uint64
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

// v1Subsystems are the hierarchies a sandbox joins on v1: only those it
// needs, since every extra hierarchy costs a mkdir and kernel memory per
// sandbox. cpuset is left out because it needs cpus/mems copied in.
var v1Subsystems = map[cgroup1.Name]bool{
	cgroup1.Cpu: true, cgroup1.Cpuacct: true, cgroup1.Memory: true,
	cgroup1.Pids: true, cgroup1.Freezer: true, cgroup1.Devices: true,
}

func v1Hierarchy() ([]cgroup1.Subsystem, error) {
	all, err := cgroup1.Default()
	if err != nil {
		return nil, err
	}
	var out []cgroup1.Subsystem
	for _, s := range all {
		if v1Subsystems[s.Name()] {
			out = append(out, s)
		}
	}
	return out, nil
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

func spec(r Resources) *specs.LinuxResources {
	out := &specs.LinuxResources{Devices: allowedDevices}
	if r.MemoryBytes > 0 {
		out.Memory = &specs.LinuxMemory{Limit: i64(r.MemoryBytes)}
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
		return &v2Group{name: parent + "/" + name, m: m}, nil
	}
	c, err := cgroup1.New(cgroup1.StaticPath(path), spec(r), cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		// cgroup1.New may have created some hierarchies before failing.
		if c2, lerr := cgroup1.Load(cgroup1.StaticPath(path), cgroup1.WithHierarchy(v1Hierarchy)); lerr == nil {
			_ = c2.Delete()
		}
		return nil, classify(err, "create cgroup "+path)
	}
	return &v1Group{name: parent + "/" + name, c: c}, nil
}

// Load opens an existing group.
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
	c, err := cgroup1.Load(cgroup1.StaticPath(path), cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		return nil, classify(err, "load cgroup "+path)
	}
	return &v1Group{name: parent + "/" + name, c: c}, nil
}

// List returns the names of the groups below parent, in any hierarchy.
func List(parent string) ([]string, error) {
	dirs := []string{filepath.Join(Root, parent)}
	if !unified() {
		dirs = nil
		for n := range v1Subsystems {
			dirs = append(dirs, filepath.Join(Root, string(n), parent))
		}
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
	case errors.Is(err, os.ErrNotExist):
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
		time.Sleep(time.Millisecond)
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
	b, err := os.ReadFile(path)
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
func readKey(path, key string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == key {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, nil
}

func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
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

func (g *v1Group) Name() string { return g.name }
func (g *v1Group) dir(sub cgroup1.Name) string {
	return filepath.Join(Root, string(sub), g.name)
}
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
	return freeze(g.name, func() error { return os.WriteFile(state, []byte("FROZEN"), 0) }, func() (bool, error) {
		b, err := os.ReadFile(state)
		return strings.TrimSpace(string(b)) == "FROZEN", err
	}, g.Thaw)
}
func (g *v1Group) Thaw() error {
	err := os.WriteFile(filepath.Join(g.dir(cgroup1.Freezer), "freezer.state"), []byte("THAWED"), 0)
	return classify(err, "thaw cgroup "+g.name)
}
func (g *v1Group) OOMKills() (uint64, error) {
	return readKey(filepath.Join(g.dir(cgroup1.Memory), "memory.oom_control"), "oom_kill")
}

func (g *v1Group) Stats() (Stats, error) {
	var s Stats
	var err error
	mem := g.dir(cgroup1.Memory)
	if s.MemoryBytes, err = readUint(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return s, classify(err, "read cgroup stats")
	}
	s.OOMKills, _ = readKey(filepath.Join(mem, "memory.oom_control"), "oom_kill")
	ns, _ := readUint(filepath.Join(g.dir(cgroup1.Cpuacct), "cpuacct.usage"))
	s.CPUUsage = time.Duration(ns)
	s.Pids, _ = readUint(filepath.Join(g.dir(cgroup1.Pids), "pids.current"))
	return s, nil
}

// Delete removes the group's directory in each hierarchy. A sandbox group
// has no children, so one rmdir each does it (the library's Delete walks
// every hierarchy's tree first, which costs more than the create).
func (g *v1Group) Delete() error {
	var errs []error
	for n := range v1Subsystems {
		dir := g.dir(n)
		var err error
		// rmdir races with the last task's exit (EBUSY): retry briefly.
		for i := 0; i < 500; i++ {
			if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			if !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return classify(errors.Join(errs...), "delete cgroup "+g.name)
	}
	return nil
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
	if err := os.WriteFile(filepath.Join(g.dir(), "cgroup.kill"), []byte("1"), 0); err == nil {
		return killUntilEmpty(g.Procs, nil, nil, timeout)
	}
	return killUntilEmpty(g.Procs, g.m.Freeze, g.m.Thaw, timeout)
}
func (g *v2Group) Freeze() error {
	return freeze(g.name, func() error {
		return os.WriteFile(filepath.Join(g.dir(), "cgroup.freeze"), []byte("1"), 0)
	}, func() (bool, error) {
		n, err := readKey(filepath.Join(g.dir(), "cgroup.events"), "frozen")
		return n == 1, err
	}, g.Thaw)
}
func (g *v2Group) Thaw() error {
	err := os.WriteFile(filepath.Join(g.dir(), "cgroup.freeze"), []byte("0"), 0)
	return classify(err, "thaw cgroup "+g.name)
}
func (g *v2Group) OOMKills() (uint64, error) {
	return readKey(filepath.Join(g.dir(), "memory.events"), "oom_kill")
}

func (g *v2Group) Stats() (Stats, error) {
	var s Stats
	var err error
	if s.MemoryBytes, err = readUint(filepath.Join(g.dir(), "memory.current")); err != nil {
		return s, classify(err, "read cgroup stats")
	}
	s.OOMKills, _ = readKey(filepath.Join(g.dir(), "memory.events"), "oom_kill")
	usec, _ := readKey(filepath.Join(g.dir(), "cpu.stat"), "usage_usec")
	s.CPUUsage = time.Duration(usec) * time.Microsecond
	s.Pids, _ = readUint(filepath.Join(g.dir(), "pids.current"))
	return s, nil
}
func (g *v2Group) Delete() error {
	var err error
	for i := 0; i < 50; i++ {
		if err = g.m.Delete(); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return classify(err, fmt.Sprintf("delete cgroup %s", g.name))
}

package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/cgroups/v3/cgroup1"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/kfile"
)

// QoS is a group's CPU class: how the scheduler weighs its tasks
// against other groups' (docs/ARCHITECTURE.md, "CPU QoS").
type QoS struct {
	// Idle runs the whole group under SCHED_IDLE (cpu.idle, Linux 5.15,
	// on v1 and v2): its tasks get CPU only when no other group's want
	// it, and never preempt them.
	Idle bool
	// Weight is the group's CPU weight on the v2 scale (1..10000, 100 the
	// kernel's default; v1 cpu.shares is weight*1024/100); 0 keeps the
	// default. Ignored with Idle (an idle group has the lowest weight).
	Weight uint64
	// CPUs pins the group to these CPUs (a cpuset cgroup); nil leaves it
	// on every CPU its parent has.
	CPUs []int
}

// DefaultWeight is the kernel's CPU weight of a group (v2 cpu.weight).
const DefaultWeight = 100

// HasIdle reports whether this host's cpu controller has cpu.idle (Linux
// 5.15). Without it a best-effort group gets the lowest weight instead
// (SetQoS).
var HasIdle = sync.OnceValue(func() bool {
	if !unified() {
		_, err := os.Stat(filepath.Join(Root, string(cgroup1.Cpu), "cpu.idle"))
		return err == nil
	}
	// The root of a v2 hierarchy has no cpu files, and a group has them
	// only where the cpu controller is enabled: the kernel's version says.
	b, err := kfile.Read(filepath.Join(Root, "cgroup.controllers"))
	if err != nil || !slices.Contains(strings.Fields(string(b)), "cpu") {
		return false
	}
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 5 || major == 5 && minor >= 15
})

// lowestWeight is the weight of a best-effort group on a kernel without
// cpu.idle: the closest a weight comes (cpu.shares 10 on v1).
const lowestWeight = 1

// degrade is q as this kernel can run it.
func degrade(q QoS) QoS {
	if q.Idle && !HasIdle() {
		return QoS{Weight: lowestWeight, CPUs: q.CPUs}
	}
	return q
}

// SetQoS on v1 and hybrid hosts: cpu.idle and cpu.shares in the group's
// cpu directory, cpuset.cpus in a cpuset directory of its own made on
// first use.
func (g *v1Group) SetQoS(q QoS) error     { return setQoS1(g.name, q) }
func (g *hybridGroup) SetQoS(q QoS) error { return setQoS1(g.name, q) }

func setQoS1(name string, q QoS) error {
	q = degrade(q)
	dir := v1Dir(cgroup1.Cpu, name)
	shares := strconv.FormatUint(sharesOf(q.Weight), 10)
	var ws []limitWrite
	if q.Idle {
		// The kernel refuses cpu.shares on an idle group (EINVAL): the
		// weight goes back to the default first, then the group idles;
		// an idle group only stays so.
		if !idleNow(dir) {
			ws = append(ws, limitWrite{path: filepath.Join(dir, "cpu.shares"), value: "1024"})
		}
		ws = append(ws, limitWrite{path: filepath.Join(dir, "cpu.idle"), value: "1"})
	} else {
		ws = append(ws, limitWrite{path: filepath.Join(dir, "cpu.idle"), value: "0"},
			limitWrite{path: filepath.Join(dir, "cpu.shares"), value: shares})
	}
	if !HasIdle() {
		ws = ws[1:] // an older kernel: only the weight (degrade)
	}
	if err := apply(name, ws); err != nil {
		return err
	}
	return pin1(name, q.CPUs)
}

// idleNow reports whether the group of cpu directory dir idles.
func idleNow(dir string) bool {
	n, err := readUint(filepath.Join(dir, "cpu.idle"))
	return err == nil && n == 1
}

// sharesOf is v1 cpu.shares for a v2 weight (0: the default).
func sharesOf(weight uint64) uint64 {
	if weight == 0 {
		return 1024
	}
	return max(2, weight*1024/DefaultWeight)
}

// pin1 sets the cpuset of group name on a v1 or hybrid host: cpuset is
// not one of the hierarchies a group is made in (it needs cpus and mems
// copied in before a task may join), so a group gets a directory there
// only once pinned, and keeps it (unpinned: every CPU of its parent)
// until Delete.
func pin1(name string, cpus []int) error {
	dir := filepath.Join(Root, string(cgroup1.Cpuset), name)
	if _, err := os.Stat(dir); len(cpus) == 0 && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	parent, _ := splitName(name)
	pdir := filepath.Join(Root, string(cgroup1.Cpuset), parent)
	if err := cpusetDir(pdir); err != nil {
		return classify(err, "create cpuset of cgroup "+parent)
	}
	if err := cpusetDir(dir); err != nil {
		return classify(err, "create cpuset of cgroup "+name)
	}
	want := cpuList(cpus)
	if want == "" {
		b, err := kfile.Read(filepath.Join(pdir, "cpuset.cpus"))
		if err != nil {
			return classify(err, "read cpuset of cgroup "+parent)
		}
		want = strings.TrimSpace(string(b))
	}
	if err := kfile.Write(filepath.Join(dir, "cpuset.cpus"), want); err != nil {
		return errdefs.Wrap(errdefs.Invalid, err, "pin cgroup "+name+" to CPUs "+want)
	}
	// Every task of the group joins (the cpuset hierarchy is its own);
	// the ones they fork from then on inherit it.
	pids, err := readPids(filepath.Join(v1Dir(cgroup1.Cpu, name), "cgroup.procs"))
	if err != nil {
		return classify(err, "list tasks of cgroup "+name)
	}
	for _, pid := range pids {
		if err := writeProcs(dir, pid); err != nil && !errors.Is(err, os.ErrNotExist) {
			return classify(err, "move a task of cgroup "+name+" to its cpuset")
		}
	}
	return nil
}

// cpusetDir makes a v1 cpuset directory ready for tasks: cpus and mems
// copied from its parent, which the kernel leaves empty.
func cpusetDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil
		}
		return err
	}
	for _, f := range []string{"cpuset.mems", "cpuset.cpus"} {
		b, err := kfile.Read(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return err
		}
		if err := kfile.Write(filepath.Join(dir, f), strings.TrimSpace(string(b))); err != nil {
			return err
		}
	}
	return nil
}

// cpuList is the kernel's list format of cpus ("0,2,3"; "" for none).
func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// SetQoS on v2: cpu.idle, cpu.weight and cpuset.cpus in the group's one
// directory. The cpuset controller is enabled for the parent's children
// on first use (the parent's own parent must have it).
func (g *v2Group) SetQoS(q QoS) error {
	q = degrade(q)
	dir := g.dir()
	w := q.Weight
	if w == 0 {
		w = DefaultWeight
	}
	var ws []limitWrite
	if q.Idle {
		if !idleNow(dir) {
			ws = append(ws, limitWrite{path: filepath.Join(dir, "cpu.weight"), value: strconv.Itoa(DefaultWeight)})
		}
		ws = append(ws, limitWrite{path: filepath.Join(dir, "cpu.idle"), value: "1"})
	} else {
		ws = append(ws, limitWrite{path: filepath.Join(dir, "cpu.idle"), value: "0"},
			limitWrite{path: filepath.Join(dir, "cpu.weight"), value: strconv.FormatUint(w, 10)})
	}
	if _, err := os.Stat(filepath.Join(dir, "cpu.weight")); err != nil {
		// containerd enables only the controllers a group's limits use.
		if err := enable2(filepath.Dir(dir), "cpu"); err != nil {
			return err
		}
	}
	if !HasIdle() {
		ws = ws[1:]
	}
	if err := apply(g.name, ws); err != nil {
		return err
	}
	cpusFile := filepath.Join(dir, "cpuset.cpus")
	if _, err := os.Stat(cpusFile); err != nil {
		if len(q.CPUs) == 0 {
			return nil
		}
		if err := enable2(filepath.Dir(dir), "cpuset"); err != nil {
			return err
		}
	}
	// Unpinned: every CPU the parent has, written out. The kernel
	// refuses an empty list for a group with tasks (ENOSPC), and a write
	// of no bytes never reached its parser: an unpinned group stayed
	// pinned (found by TestCgroupV2InAVM).
	cpus := cpuList(q.CPUs)
	if cpus == "" {
		b, err := kfile.Read(filepath.Join(filepath.Dir(dir), "cpuset.cpus.effective"))
		if err != nil {
			return classify(err, "read the CPUs of cgroup "+filepath.Dir(g.name))
		}
		cpus = strings.TrimSpace(string(b))
	}
	if err := kfile.Write(cpusFile, cpus); err != nil {
		return errdefs.Wrap(errdefs.Invalid, err, "pin cgroup "+g.name+" to CPUs "+cpuList(q.CPUs))
	}
	return nil
}

// enable2 turns controller ctl on for the children of v2 directory dir.
func enable2(dir, ctl string) error {
	if err := kfile.Write(filepath.Join(dir, "cgroup.subtree_control"), "+"+ctl); err != nil {
		return errdefs.Wrap(errdefs.Unsupported, err, "enable the "+ctl+" controller below "+dir+" (its parent must have it)")
	}
	return nil
}

// ReadQoS reads back the class files of a group: whether it idles (on a
// kernel without cpu.idle: whether it has the lowest weight), its weight
// on the v2 scale, and its cpuset ("" where it has none of its own).
func ReadQoS(g Group) (idle bool, weight uint64, cpus string, err error) {
	var cpu, set string
	if unified() {
		cpu = filepath.Join(Root, g.Name())
		set = cpu
	} else {
		cpu = v1Dir(cgroup1.Cpu, g.Name())
		set = filepath.Join(Root, string(cgroup1.Cpuset), g.Name())
	}
	n, err := readUint(filepath.Join(cpu, "cpu.idle"))
	if err != nil && !HasIdle() {
		n, err = 0, nil // read from the weight below
	}
	if err != nil {
		return false, 0, "", err
	}
	if unified() {
		weight, err = readUint(filepath.Join(cpu, "cpu.weight"))
	} else {
		var shares uint64
		shares, err = readUint(filepath.Join(cpu, "cpu.shares"))
		weight = shares * DefaultWeight / 1024
	}
	if err != nil {
		return false, 0, "", err
	}
	if b, rerr := kfile.Read(filepath.Join(set, "cpuset.cpus")); rerr == nil {
		cpus = strings.TrimSpace(string(b))
	}
	if !HasIdle() {
		// A best-effort group has the lowest weight (degrade).
		return weight <= lowestWeight, weight, cpus, nil
	}
	return n == 1, weight, cpus, nil
}

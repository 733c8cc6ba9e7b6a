package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/cgroups/v3/cgroup1"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/kfile"
)

// Limits is a change of a group's limits: a nil field is left as it is, 0
// lifts the limit (Resources' meaning).
type Limits struct {
	CPUMillis   *int64
	MemoryBytes *int64
	PidsMax     *int64
}

// cpuPeriod is the CFS period New sets (100 ms, the kernel's default):
// a quota of cpu_millis*100 µs per period is cpu_millis/1000 cores.
const cpuPeriod = 100000

// limitWrite is one limit file and the value that sets it.
type limitWrite struct {
	path, value string
	memory      bool // a memory limit: EBUSY means the group uses more
}

// apply writes ws in order, all or nothing: it reads every file first
// (a group it cannot read changes nothing), and if a write fails it
// restores the files written before, last first.
func apply(name string, ws []limitWrite) error {
	old := make([]string, len(ws))
	for i, w := range ws {
		b, err := kfile.Read(w.path)
		if err != nil {
			return classify(err, "read limit of cgroup "+name)
		}
		old[i] = strings.TrimSpace(string(b))
	}
	for i, w := range ws {
		err := kfile.Write(w.path, w.value)
		if err == nil {
			continue
		}
		var errs []error
		for j := i - 1; j >= 0; j-- {
			if rerr := kfile.Write(ws[j].path, old[j]); rerr != nil {
				errs = append(errs, rerr)
			}
		}
		if len(errs) > 0 {
			// Nothing more can be done; say so rather than pretend.
			return errdefs.Internalf("cgroup %s: %s=%s failed (%v) and restoring the earlier limits failed too: %w",
				name, filepath.Base(w.path), w.value, err, errors.Join(errs...))
		}
		if w.memory && errors.Is(err, syscall.EBUSY) {
			return errdefs.Invalidf("memory limit %s is below what sandbox cgroup %s uses and cannot give back: nothing changed", w.value, name)
		}
		return classify(err, "set "+filepath.Base(w.path)+" of cgroup "+name+" (nothing changed)")
	}
	return nil
}

// v1Writes are the limit files of a group on v1 and hybrid hosts (the
// limits live in the v1 cpu, memory and pids directories in both).
func v1Writes(name string, l Limits) []limitWrite {
	var ws []limitWrite
	if l.CPUMillis != nil {
		v := "-1"
		if *l.CPUMillis > 0 {
			v = strconv.FormatInt(*l.CPUMillis*cpuPeriod/1000, 10)
		}
		ws = append(ws,
			limitWrite{path: filepath.Join(v1Dir(cgroup1.Cpu, name), "cpu.cfs_period_us"), value: strconv.Itoa(cpuPeriod)},
			limitWrite{path: filepath.Join(v1Dir(cgroup1.Cpu, name), "cpu.cfs_quota_us"), value: v})
	}
	if l.MemoryBytes != nil {
		v := "-1"
		if *l.MemoryBytes > 0 {
			v = strconv.FormatInt(*l.MemoryBytes, 10)
		}
		dir := v1Dir(cgroup1.Memory, name)
		mem := limitWrite{path: filepath.Join(dir, "memory.limit_in_bytes"), value: v, memory: true}
		if !v1SwapAccounting() {
			ws = append(ws, mem)
		} else {
			// memory+swap follows memory (v1SwapAccounting); the kernel
			// keeps memory's limit at or below it, so a raise writes it
			// first and a cut last.
			sw := limitWrite{path: filepath.Join(dir, "memory.memsw.limit_in_bytes"), value: v, memory: true}
			cur, err := readUint(mem.path)
			if *l.MemoryBytes <= 0 || err == nil && cur < uint64(*l.MemoryBytes) {
				ws = append(ws, sw, mem)
			} else {
				ws = append(ws, mem, sw)
			}
		}
	}
	if l.PidsMax != nil {
		ws = append(ws, limitWrite{path: filepath.Join(v1Dir(cgroup1.Pids, name), "pids.max"), value: maxOr(*l.PidsMax)})
	}
	return ws
}

// v2Writes are the limit files of a group directory on v2 hosts.
func v2Writes(dir string, l Limits) []limitWrite {
	var ws []limitWrite
	if l.CPUMillis != nil {
		q := "max"
		if *l.CPUMillis > 0 {
			q = strconv.FormatInt(*l.CPUMillis*cpuPeriod/1000, 10)
		}
		ws = append(ws, limitWrite{path: filepath.Join(dir, "cpu.max"), value: q + " " + strconv.Itoa(cpuPeriod)})
	}
	if l.MemoryBytes != nil {
		ws = append(ws, limitWrite{path: filepath.Join(dir, "memory.max"), value: maxOr(*l.MemoryBytes), memory: true})
		if v2SwapFile(dir) {
			// Swap follows the memory limit (v2SwapMax).
			ws = append(ws, limitWrite{path: filepath.Join(dir, "memory.swap.max"), value: v2SwapMax(*l.MemoryBytes)})
		}
	}
	if l.PidsMax != nil {
		ws = append(ws, limitWrite{path: filepath.Join(dir, "pids.max"), value: maxOr(*l.PidsMax)})
	}
	return ws
}

// v2SwapMax is a v2 group's memory.swap.max for memory limit n: none
// while it runs. v2 has no memory+swap limit (v1's memsw, which bounds a
// v1 sandbox: v1SwapAccounting); without this a sandbox past its memory
// limit would go on in the node's swap instead of meeting the OOM killer,
// and could fill it. The pause's reclaim opens it for its run
// (reclaimV2). Unlimited memory: unlimited swap.
func v2SwapMax(n int64) string {
	if n <= 0 {
		return "max"
	}
	return "0"
}

// v2SwapFile: the v2 group directory has memory.swap.max (the kernel
// accounts swap: CONFIG_MEMCG_SWAP, not swapaccount=0).
func v2SwapFile(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "memory.swap.max"))
	return err == nil
}

func maxOr(n int64) string {
	if n <= 0 {
		return "max"
	}
	return strconv.FormatInt(n, 10)
}

func (g *v1Group) SetLimits(l Limits) error     { return apply(g.name, v1Writes(g.name, l)) }
func (g *hybridGroup) SetLimits(l Limits) error { return apply(g.name, v1Writes(g.name, l)) }

// SetLimits on v2: a lower memory.max does not fail like v1's limit (the
// kernel reclaims, then OOM-kills), so the group is first asked to give
// back what is above the new limit (memory.reclaim, Linux 5.19), and a
// group that still uses more is refused before anything changes.
func (g *v2Group) SetLimits(l Limits) error {
	if l.MemoryBytes != nil && *l.MemoryBytes > 0 {
		limit := uint64(*l.MemoryBytes)
		cur, err := readUint(filepath.Join(g.dir(), "memory.current"))
		if err != nil {
			return classify(err, "read memory use of cgroup "+g.name)
		}
		if cur > limit {
			_ = kfile.Write(filepath.Join(g.dir(), "memory.reclaim"), strconv.FormatUint(cur-limit, 10))
			if cur, err = readUint(filepath.Join(g.dir(), "memory.current")); err == nil && cur > limit {
				return errdefs.Invalidf("memory limit %d is below what sandbox cgroup %s uses (%d bytes) and cannot give back: nothing changed", limit, g.name, cur)
			}
		}
	}
	return apply(g.name, v2Writes(g.dir(), l))
}

package cgroups

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/containerd/cgroups/v3/cgroup1"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/kfile"
)

// Memory is what a group's processes hold of the node's memory, in bytes:
// Usage is the group's charge (memory.usage_in_bytes on v1,
// memory.current on v2: page cache, anonymous memory and, with kernel
// accounting, kernel objects); File and Anon are the page cache and the
// anonymous part of it; Swap is what it has out on swap (or zswap).
type Memory struct {
	Usage, File, Anon, Swap uint64
}

// v1SwapAccounting: the v1 memory controller accounts swap
// (memory.memsw.*, swapaccount=1, the default on these kernels). A
// sandbox's memory+swap limit is then its memory limit: on a node with
// swap it may not use more than its limit in memory and swap together
// (without it, a process past the limit would swap instead of meeting
// the OOM killer, and a sandbox could fill the node's swap), while the
// kernel may still move its pages between them: a pause's step-down
// (reclaimAnonV1) pushes anonymous memory out without raising it. On v2
// memory.swap.max is left as the kernel has it (docs/ARCHITECTURE.md,
// "Node swap and zswap").
var v1SwapAccounting = sync.OnceValue(func() bool {
	if unified() {
		return false
	}
	_, err := os.Stat(filepath.Join(Root, "memory", "memory.memsw.limit_in_bytes"))
	return err == nil
})

// SwapTotal is the node's swap (swap files and partitions, which zswap
// fronts), from /proc/meminfo: 0 means anonymous memory cannot be given
// back, only page cache.
func SwapTotal() (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		if v, ok := bytes.CutPrefix(line, []byte("SwapTotal:")); ok {
			f := bytes.Fields(v)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseUint(string(f[0]), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no SwapTotal in /proc/meminfo")
}

// anonFloor is how far Reclaim lowers a v1 limit at most: the group's
// tasks are frozen and touch nothing until they thaw, but the kernel
// keeps some pages it cannot reclaim (page tables, kernel stacks), and a
// limit below them only makes the write fail.
const anonFloor = 4 << 20

// v1Memory reads a v1 memory directory's use.
func v1Memory(dir string) (Memory, error) {
	var m Memory
	var err error
	if m.Usage, err = readUint(filepath.Join(dir, "memory.usage_in_bytes")); err != nil {
		return m, classify(err, "read memory use")
	}
	stat := filepath.Join(dir, "memory.stat")
	m.File, _ = readKey(stat, "total_cache")
	m.Anon, _ = readKey(stat, "total_rss")
	m.Swap, _ = readKey(stat, "total_swap")
	return m, nil
}

// reclaimV1 gives back a v1 group's memory. memory.force_empty reclaims
// every page it can (clean page cache at once, dirty pages after
// writeback; with swap, the kernel's reclaim may take anonymous pages
// too). Anonymous memory is then pushed out by lowering
// memory.limit_in_bytes in steps, each a write the kernel answers by
// reclaiming down to it or refusing (EBUSY: nothing more can go), and
// the limit is put back whatever happened: a v1 limit write never
// OOM-kills.
func reclaimV1(name string) error {
	dir := v1Dir(cgroup1.Memory, name)
	if err := forceEmpty(name, dir); err != nil {
		return err
	}
	if swap, err := SwapTotal(); err != nil || swap == 0 {
		return nil
	}
	return reclaimAnonV1(name, dir)
}

// reclaimAnonV1 lowers the limit of v1 memory directory dir by a quarter
// of the usage at a time (at least 16 MiB), so that each write asks the
// kernel for a bounded amount (one huge step fails whole when a part
// cannot go), down to anonFloor, then restores the limit it found.
func reclaimAnonV1(name, dir string) (err error) {
	limitFile := filepath.Join(dir, "memory.limit_in_bytes")
	b, err := kfile.Read(limitFile)
	if err != nil {
		return classify(err, "read memory limit of cgroup "+name)
	}
	old := string(bytes.TrimSpace(b))
	defer func() {
		if rerr := kfile.Write(limitFile, old); rerr != nil {
			err = errors.Join(err, errdefs.Wrap(errdefs.Internal, rerr, "restore memory limit "+old+" of cgroup "+name+" after reclaim"))
		}
	}()
	for {
		use, err := readUint(filepath.Join(dir, "memory.usage_in_bytes"))
		if err != nil {
			return classify(err, "read memory use of cgroup "+name)
		}
		if use <= anonFloor {
			return nil
		}
		step := max(use/4, 16<<20)
		next := uint64(anonFloor)
		if use > step+anonFloor {
			next = use - step
		}
		if err := kfile.Write(limitFile, strconv.FormatUint(next, 10)); err != nil {
			if errors.Is(err, syscall.EBUSY) {
				return nil // the rest cannot be reclaimed
			}
			return classify(err, "lower memory limit of cgroup "+name)
		}
	}
}

// v2Memory reads a v2 group directory's use.
func v2Memory(dir string) (Memory, error) {
	var m Memory
	var err error
	if m.Usage, err = readUint(filepath.Join(dir, "memory.current")); err != nil {
		return m, classify(err, "read memory use")
	}
	stat := filepath.Join(dir, "memory.stat")
	m.File, _ = readKey(stat, "file")
	m.Anon, _ = readKey(stat, "anon")
	m.Swap, _ = readUint(filepath.Join(dir, "memory.swap.current"))
	return m, nil
}

// reclaimV2 asks memory.reclaim (Linux 5.19) for everything the group
// uses. The kernel reclaims page cache and, where the node has swap and
// the group may use it (memory.swap.max), anonymous memory as its
// swappiness says. It answers EAGAIN when it could not reclaim the whole
// amount, which is the normal case (the frozen tasks' unreclaimable pages
// stay). Lowering memory.max instead would OOM-kill on v2.
func reclaimV2(name, dir string) (err error) {
	use, err := readUint(filepath.Join(dir, "memory.current"))
	if err != nil {
		return classify(err, "read memory use of cgroup "+name)
	}
	// A running sandbox may not swap (v2SwapMax); for the reclaim its
	// anonymous memory may go to swap up to what it uses, and the limit
	// is put back after: what went stays out until touched.
	swapMax := filepath.Join(dir, "memory.swap.max")
	if swap, serr := SwapTotal(); serr == nil && swap > 0 && v2SwapFile(dir) {
		if b, rerr := kfile.Read(swapMax); rerr == nil {
			old := string(bytes.TrimSpace(b))
			if werr := kfile.Write(swapMax, strconv.FormatUint(use, 10)); werr == nil {
				defer func() {
					if rerr := kfile.Write(swapMax, old); rerr != nil {
						err = errors.Join(err, errdefs.Wrap(errdefs.Internal, rerr, "restore memory.swap.max "+old+" of cgroup "+name+" after reclaim"))
					}
				}()
			}
		}
	}
	err = kfile.Write(filepath.Join(dir, "memory.reclaim"), strconv.FormatUint(use, 10))
	if err != nil && !errors.Is(err, syscall.EAGAIN) {
		return classify(err, "reclaim memory of cgroup "+name)
	}
	return nil
}

// Frozen reports whether the v1 freezer's state reads FROZEN.
func (g *v1Group) Frozen() (bool, error) {
	b, err := kfile.Read(filepath.Join(g.dir(cgroup1.Freezer), "freezer.state"))
	if err != nil {
		return false, classify(err, "read freezer state of cgroup "+g.name)
	}
	return string(bytes.TrimSpace(b)) == "FROZEN", nil
}

func frozen2(name, dir string) (bool, error) {
	n, err := readKey(filepath.Join(dir, "cgroup.events"), "frozen")
	if err != nil {
		return false, classify(err, "read frozen state of cgroup "+name)
	}
	return n == 1, nil
}

func (g *hybridGroup) Frozen() (bool, error) { return frozen2(g.name, g.udir()) }
func (g *v2Group) Frozen() (bool, error)     { return frozen2(g.name, g.dir()) }

func (g *v1Group) Memory() (Memory, error)     { return v1Memory(g.dir(cgroup1.Memory)) }
func (g *hybridGroup) Memory() (Memory, error) { return v1Memory(g.dir(cgroup1.Memory)) }
func (g *v2Group) Memory() (Memory, error)     { return v2Memory(g.dir()) }

func (g *v1Group) Reclaim() error     { return reclaimV1(g.name) }
func (g *hybridGroup) Reclaim() error { return reclaimV1(g.name) }
func (g *v2Group) Reclaim() error     { return reclaimV2(g.name, g.dir()) }

// ReclaimIdle gives back what it can of a running group's memory without
// ever risking an OOM kill (the daemon's idle reclaim): on v1 and hybrid,
// memory.force_empty (page cache, and anonymous memory where the node
// has swap: the kernel's reclaim may swap), never the limit step-down of
// Reclaim, under which a task that woke up could meet the OOM killer; on
// v2, memory.reclaim as Reclaim does (it never OOM-kills).
func (g *v1Group) ReclaimIdle() error     { return forceEmpty(g.name, g.dir(cgroup1.Memory)) }
func (g *hybridGroup) ReclaimIdle() error { return forceEmpty(g.name, g.dir(cgroup1.Memory)) }
func (g *v2Group) ReclaimIdle() error     { return reclaimV2(g.name, g.dir()) }

func forceEmpty(name, dir string) error {
	if err := kfile.Write(filepath.Join(dir, "memory.force_empty"), "0"); err != nil {
		return classify(err, "reclaim memory of cgroup "+name)
	}
	return nil
}

// MemoryPressure is the share of the last 10 s in which some of the
// group's tasks stalled on memory (PSI "some avg10" of memory.pressure,
// 0-100): a group reclaiming or faulting back in is not idle. -1 where
// the kernel keeps no PSI for the group (pure v1, or PSI off).
func (g *v1Group) MemoryPressure() float64     { return -1 }
func (g *hybridGroup) MemoryPressure() float64 { return memoryPressure(g.udir()) }
func (g *v2Group) MemoryPressure() float64     { return memoryPressure(g.dir()) }

func memoryPressure(dir string) float64 {
	b, err := kfile.Read(filepath.Join(dir, "memory.pressure"))
	if err != nil {
		return -1
	}
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	for _, f := range bytes.Fields(line) {
		if v, ok := bytes.CutPrefix(f, []byte("avg10=")); ok {
			if p, err := strconv.ParseFloat(string(v), 64); err == nil {
				return p
			}
		}
	}
	return -1
}

// ParentMemory reads the memory charged to every group below parent at
// once, from the parent's own hierarchical counters (v1 memory.stat's
// total_* and the usage files, which count descendants; v2's memory.stat
// and memory.swap.current): one read for a node's thousands of sandboxes
// where summing each group's would cost one read per sandbox. It also
// counts what groups already removed still have charged (page cache the
// kernel has not freed), which is the node's memory all the same. A parent
// with no directory yet (no group was made) reads as zero.
func ParentMemory(parent string) (Stats, error) {
	if err := validParent(parent); err != nil {
		return Stats{}, err
	}
	var s Stats
	var err error
	if unified() {
		s, err = (&v2Group{name: parent}).Stats()
	} else {
		s, err = v1Stats(parent, 0)
	}
	if errors.Is(err, os.ErrNotExist) {
		return Stats{}, nil
	}
	s.CPUUsage, s.Pids, s.OOMKills = 0, 0, 0 // not asked for: the parent's own would mislead
	return s, err
}

func validParent(parent string) error {
	if parent == "" || filepath.IsAbs(parent) || slices.Contains(strings.Split(parent, "/"), "..") {
		return errdefs.Invalidf("bad cgroup parent %q", parent)
	}
	return nil
}

// LeftoverCacheMax is the most page cache a group whose tasks are gone
// may still have charged for Delete to reclaim it before removing the
// group. The kernel frees a memory cgroup only once nothing is charged to
// it: until then the removed group lives on, unseen ("dying"), and keeps
// its kernel structures, of which the largest, its shrinker map, grows
// with every superblock the node has ever had at once (~640 KiB each
// here after a 10,000-sandbox run, docs/BENCHMARKS.md). A deleted
// sandbox leaves little charged: blocks of the node's filesystems its
// writes brought into the cache (~90 KiB), which kept 34 of 40 deleted
// idle sandboxes' groups alive here, and pages of image layers it was
// the first to read, which other sandboxes may be using. Reclaiming a
// few of those is cheaper than the group; more than this stays cached
// (other sandboxes' reads) and the group with it, until the node's own
// reclaim takes them.
const LeftoverCacheMax = 1 << 20

// reclaimLeftoversV1 reclaims group name's page cache (its v1 memory
// directory dir) when that is at most LeftoverCacheMax; memory.stat's
// "cache" is the group's own.
func reclaimLeftoversV1(name, dir string) {
	if cache, err := readKey(filepath.Join(dir, "memory.stat"), "cache"); err == nil && cache > 0 && cache <= LeftoverCacheMax {
		_ = forceEmpty(name, dir)
	}
}

// reclaimLeftoversV2 is reclaimLeftoversV1 on v2 (memory.reclaim answers
// EAGAIN for what it could not take: that stays, as on v1).
func reclaimLeftoversV2(dir string) {
	if file, err := readKey(filepath.Join(dir, "memory.stat"), "file"); err == nil && file > 0 && file <= LeftoverCacheMax {
		_ = kfile.Write(filepath.Join(dir, "memory.reclaim"), strconv.FormatUint(file, 10))
	}
}

// MemoryCgroups is the number of memory cgroups the kernel holds on the
// node, removed ones still charged ("dying", LeftoverCacheMax) included:
// the memory controller's num_cgroups in /proc/cgroups, in any layout.
func MemoryCgroups() (int64, error) {
	b, err := kfile.Read("/proc/cgroups")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "memory" {
			return strconv.ParseInt(f[2], 10, 64)
		}
	}
	return 0, errors.New("/proc/cgroups lists no memory controller")
}

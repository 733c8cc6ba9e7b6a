package container

import (
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// cpuPool places sandboxes with a CPU quota on CPUs: ceil(cpu_millis /
// 1000) of the CPUs the daemon may use, the least used ones first, so
// that what counts CPUs by affinity sizes itself to the quota (views.go)
// and the sandboxes are spread over the node. The quota still bounds
// what the sandbox uses; the affinity only says how many threads can run
// at once, which is what the quota allows anyway. A sandbox may widen
// its own affinity again (no cpuset cgroup holds it): the affinity is a
// view, not a limit.
type cpuPool struct {
	mu     sync.Mutex
	cpus   []int            // the CPUs the daemon may use
	load   map[int]int      // CPU -> sandboxes placed on it
	placed map[string][]int // sandbox -> its CPUs
	next   int              // where ties are broken, moved round the CPUs
}

func newCPUPool() *cpuPool {
	p := &cpuPool{load: map[int]int{}, placed: map[string][]int{}}
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		for c := 0; c < len(set)*64; c++ {
			if set.IsSet(c) {
				p.cpus = append(p.cpus, c)
			}
		}
	}
	return p
}

// cpusFor is how many CPUs a quota of millis asks for; 0 means all
// (no quota, or at least as many as the node has).
func (p *cpuPool) cpusFor(millis int64) int {
	if millis <= 0 {
		return 0
	}
	n := int((millis + 999) / 1000)
	if n >= len(p.cpus) {
		return 0
	}
	return n
}

// place chooses n CPUs for id (replacing any it had) and returns them;
// nil for n == 0 (all CPUs).
func (p *cpuPool) place(id string, n int) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(id)
	if n <= 0 {
		return nil
	}
	chosen := make([]int, 0, n)
	taken := map[int]bool{}
	for len(chosen) < n {
		best := -1
		for i := range p.cpus {
			c := p.cpus[(p.next+i)%len(p.cpus)]
			if !taken[c] && (best < 0 || p.load[c] < p.load[best]) {
				best = c
			}
		}
		taken[best] = true
		chosen = append(chosen, best)
		p.load[best]++
	}
	p.next = (p.next + 1) % len(p.cpus)
	p.placed[id] = chosen
	return chosen
}

// adopt records the CPUs an adopted sandbox's init runs on, if they are
// fewer than all.
func (p *cpuPool) adopt(id string, pid int) {
	var set unix.CPUSet
	if unix.SchedGetaffinity(pid, &set) != nil {
		return
	}
	var cpus []int
	for _, c := range p.cpus {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 || len(cpus) == len(p.cpus) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(id)
	for _, c := range cpus {
		p.load[c]++
	}
	p.placed[id] = cpus
}

func (p *cpuPool) release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(id)
}

func (p *cpuPool) releaseLocked(id string) {
	for _, c := range p.placed[id] {
		p.load[c]--
	}
	delete(p.placed, id)
}

// count is how many CPUs id was placed on (0: all).
func (p *cpuPool) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.placed[id])
}

// cpuSet is cpus as a set; nil means all the pool's.
func (p *cpuPool) cpuSet(cpus []int) unix.CPUSet {
	var set unix.CPUSet
	if cpus == nil {
		cpus = p.cpus
	}
	for _, c := range cpus {
		set.Set(c)
	}
	return set
}

// setAffinity gives pid (every thread of it) the CPUs cpus (nil: all).
// A thread that exits meanwhile is no error.
func (p *cpuPool) setAffinity(pid int, cpus []int) error {
	set := p.cpuSet(cpus)
	tids, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return errdefs.Wrap(errdefs.Internal, err, "list threads")
	}
	for _, t := range tids {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return errdefs.Wrap(errdefs.Internal, err, "sched_setaffinity")
		}
	}
	return nil
}

// placeCPUs gives the new init pid (still waiting for its config) the
// CPUs of its quota, and returns the init stage's "views" config: the
// CPU view files to bind ("" when it runs on all CPUs).
func (b *Backend) placeCPUs(spec backend.Spec, pid int) (string, error) {
	n := b.cpus.cpusFor(spec.CPUMillis)
	if n == 0 || b.opts.NoCPUAffinity {
		return "", nil
	}
	cpus := b.cpus.place(spec.ID, n)
	set := b.cpus.cpuSet(cpus)
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "sched_setaffinity sandbox init")
	}
	online, cpuinfo, err := b.cpuViews(n)
	if err != nil {
		return "", err
	}
	return viewBinds(online, cpuinfo), nil
}

// viewBinds is the init stage's "views" config of the CPU view files.
func viewBinds(online, cpuinfo string) string {
	return online + ">" + cpuOnlinePath + ";" + cpuinfo + ">" + cpuinfoPath
}

// Where the CPU views go, relative to the sandbox's root.
const (
	cpuOnlinePath = "sys/devices/system/cpu/online"
	cpuinfoPath   = "proc/cpuinfo"
)

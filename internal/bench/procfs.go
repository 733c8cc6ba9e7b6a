package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/mountinfo"
)

// memAvailableKiB reads MemAvailable from /proc/meminfo.
func memAvailableKiB() (int64, error) {
	return meminfoKiB("MemAvailable")
}

func meminfoKiB(key string) (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return keyKiB(b, key)
}

// keyKiB finds "key: N kB" in a /proc file.
func keyKiB(b []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && strings.TrimSuffix(f[0], ":") == key {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s not found", key)
}

// meminfoKeys are the /proc/meminfo fields density breaks memory into.
var meminfoKeys = []string{"AnonPages", "Shmem", "Slab", "SUnreclaim", "KernelStack", "PageTables", "Percpu"}

// readMeminfo reads meminfoKeys (KiB).
func readMeminfo() (map[string]int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, k := range meminfoKeys {
		v, err := keyKiB(b, k)
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// dropCaches syncs and drops the page cache, dentries and inodes, so that
// two MemAvailable readings see the same (empty) cache state.
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

// settledMemAvailable drops caches and returns the median of three
// MemAvailable readings taken 200 ms apart.
func settledMemAvailable() (int64, error) {
	if err := dropCaches(); err != nil {
		return 0, fmt.Errorf("drop caches (needs root): %w", err)
	}
	waitMemcgsSettled()
	var vals []int64
	for i := 0; i < 3; i++ {
		if i > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		v, err := memAvailableKiB()
		if err != nil {
			return 0, err
		}
		vals = append(vals, v)
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	return vals[1], nil
}

// procMem is the memory of one process, in KiB.
type procMem struct {
	RSS int64 // VmRSS
	Pss int64 // from smaps_rollup
}

func readProcMem(pid int) (procMem, error) {
	var m procMem
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	if m.RSS, err = keyKiB(st, "VmRSS"); err != nil {
		return m, err
	}
	sr, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return m, err
	}
	m.Pss, err = keyKiB(sr, "Pss")
	return m, err
}

// procStat is the part of /proc/<pid>/stat we use.
type procStat struct {
	Pid, PPid int
	Comm      string
	State     string
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	s := string(b)
	open, closeIdx := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closeIdx < open {
		return procStat{}, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[closeIdx+1:])
	if len(f) < 2 {
		return procStat{}, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	ppid, _ := strconv.Atoi(f[1])
	return procStat{Pid: pid, PPid: ppid, Comm: s[open+1 : closeIdx], State: f[0]}, nil
}

// childrenOf returns the pids whose parent is one of parents.
func childrenOf(parents ...int) ([]int, error) {
	want := map[int]bool{}
	for _, p := range parents {
		want[p] = true
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil {
			continue
		}
		if want[st.PPid] {
			out = append(out, pid)
		}
	}
	return out, nil
}

// sumPss adds up the Pss of pids (those that vanished are skipped) and
// returns it with the number of processes counted.
func sumPss(pids []int) (int64, int) {
	var sum int64
	n := 0
	for _, p := range pids {
		m, err := readProcMem(p)
		if err != nil {
			continue
		}
		sum += m.Pss
		n++
	}
	return sum, n
}

// countFDs counts the open file descriptors of pid.
func countFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// nofileLimit reads the soft and hard "Max open files" of pid.
func nofileLimit(pid int) (soft, hard string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return "?", "?"
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "Max open files") {
			f := strings.Fields(strings.TrimPrefix(l, "Max open files"))
			if len(f) >= 2 {
				return f[0], f[1]
			}
		}
	}
	return "?", "?"
}

// RaiseNofile raises this process's soft RLIMIT_NOFILE to its hard limit
// and returns the new soft limit. Children started afterwards inherit it.
func RaiseNofile() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			return 0, err
		}
	}
	return rl.Cur, nil
}

// socketPeerPID returns the pid of the process serving a unix socket
// (SO_PEERCRED of a fresh connection).
func socketPeerPID(path string) (int, error) {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}

// unixSocketPath returns the socket path of a unix daemon address, or "".
func unixSocketPath(addr string) string {
	switch {
	case strings.HasPrefix(addr, "/"):
		return addr
	case strings.HasPrefix(addr, "unix://"):
		return strings.TrimPrefix(addr, "unix://")
	case strings.HasPrefix(addr, "unix:"):
		return strings.TrimPrefix(addr, "unix:")
	}
	return ""
}

// sandboxInitPid finds the host pid of a sandbox's init among the
// children of the daemon: the one whose cgroup path ends in /<id>.
func sandboxInitPid(daemonPid int, id string) (int, error) {
	kids, err := childrenOf(daemonPid)
	if err != nil {
		return 0, err
	}
	for _, k := range kids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", k))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(l, ":", 3)
			if len(parts) == 3 && filepath.Base(parts[2]) == id {
				return k, nil
			}
		}
	}
	return 0, fmt.Errorf("no child of daemon %d is in a cgroup named %s", daemonPid, id)
}

// mountsUnder lists the mount points below dir (from /proc/self/mountinfo).
func mountsUnder(dir string) []string {
	mounts, _ := mountinfo.Under(dir)
	var out []string
	for _, m := range mounts {
		if m.Point != dir {
			out = append(out, m.Point)
		}
	}
	return out
}

// slabBytes sums active objects x object size over /proc/slabinfo.
func slabBytes() (int64, error) {
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "slabinfo") {
			continue
		}
		n, err1 := strconv.ParseInt(f[1], 10, 64)
		sz, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 == nil && err2 == nil {
			sum += n * sz
		}
	}
	return sum, nil
}

// memcgCostKiB measures the kernel slab one new (empty) v1 memory cgroup
// costs right now: the median of five mkdir/rmdir probes. On recent
// kernels most of it is the per-memcg shrinker bitmap, which grows with
// the number of memcg-aware shrinkers (about one per mounted superblock)
// ever registered at once. -1 when not measurable (no v1 memory
// hierarchy, no /proc/slabinfo).
func memcgCostKiB() float64 {
	base := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(base, "memory.limit_in_bytes")); err != nil {
		return -1
	}
	dir := filepath.Join(base, fmt.Sprintf("warren-bench-probe-%d", os.Getpid()))
	var vals []float64
	for i := 0; i < 5; i++ {
		before, err := slabBytes()
		if err != nil {
			return -1
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			return -1
		}
		after, err := slabBytes()
		_ = os.Remove(dir)
		if err != nil {
			return -1
		}
		vals = append(vals, float64(after-before)/1024)
	}
	sort.Float64s(vals)
	return vals[2]
}

// memcgCount is the number of memory cgroups the kernel holds, offline
// ("dying") ones included, or -1: /proc/cgroups on v1, the root's
// cgroup.stat on v2.
func memcgCount() int64 {
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.stat"); err == nil {
		var live, dying int64 = -1, -1
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 2 && f[0] == "nr_descendants" {
				live, _ = strconv.ParseInt(f[1], 10, 64)
			}
			if len(f) == 2 && f[0] == "nr_dying_descendants" {
				dying, _ = strconv.ParseInt(f[1], 10, 64)
			}
		}
		if live >= 0 && dying >= 0 {
			return live + dying
		}
	}
	if n, err := cgroups.MemoryCgroups(); err == nil {
		return n
	}
	return -1
}

// waitMemcgsSettled waits (up to 30 s) until the kernel stops giving
// memory back on its own: deleted memory cgroups linger until the page
// cache charged to them is dropped and are then freed asynchronously, each
// returning its kernel memory (over 500 KiB on a node whose shrinker map
// is wide), and dead network namespaces are torn down by a work queue. A
// reading taken while that goes on would credit an earlier run's memory
// to the one being measured. Settled: the memory cgroup count and
// MemAvailable (within 2 MiB) unchanged over three readings 300 ms apart.
func waitMemcgsSettled() {
	prevCg := memcgCount()
	prevAv, err := memAvailableKiB()
	if err != nil {
		return
	}
	stable := 0
	for deadline := time.Now().Add(30 * time.Second); stable < 3 && time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		cg := memcgCount()
		av, err := memAvailableKiB()
		if err != nil {
			return
		}
		if cg == prevCg && av-prevAv < 2048 && prevAv-av < 2048 {
			stable++
			continue
		}
		if cg != prevCg {
			_ = dropCaches()
		}
		stable, prevCg, prevAv = 0, cg, av
	}
}

// procCPUTime is a process's user and system CPU time, its ended threads
// included (/proc/PID/stat utime and stime, in clock ticks of 10 ms:
// USER_HZ is 100 on Linux whatever the kernel's HZ).
func procCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command, which may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(u+s) * 10 * time.Millisecond, nil
}

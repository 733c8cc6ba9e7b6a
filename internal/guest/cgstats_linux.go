package guest

import (
	"encoding/json"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
)

// sandboxCgroupDir is the sandbox's cgroup in a microVM's guest
// (sandboxCgroup); a full OS's is under the agent's unit (serviceCgroup).
const sandboxCgroupDir = "/sys/fs/cgroup/sandbox"

// cgroupStats answers the sandbox cgroup's counters. In a full OS (whole)
// they are the commands' cgroup's but for OOM kills, which are the whole
// guest's (its OS is the sandbox's too; they include the cgroup's), and
// a guest without the cgroup answers for the whole guest (guestStats).
func (s *server) cgroupStats(st net.Conn) {
	if s.cg == nil && s.whole {
		s.guestStats(st)
		return
	}
	if s.cg == nil {
		fail(st, errdefs.Unsupported, s.cgErr)
		return
	}
	dir := s.cgDir
	var cs CgroupStats
	cs.OOMKills = keyed(dir+"/memory.events", "oom_kill")
	if s.whole {
		cs.OOMKills = guestOOMKills()
	}
	cs.CPUUsec = keyed(dir+"/cpu.stat", "usage_usec")
	cs.Pids = single(dir + "/pids.current")
	cs.MemoryBytes = single(dir + "/memory.current")
	cs.MemoryMax = single(dir + "/memory.max") // "max" reads 0
	cs.PidsMax = single(dir + "/pids.max")
	b, _ := json.Marshal(cs)
	_ = WriteFrame(st, KindExit, b)
}

// keyed reads "key value" from a cgroup file of such lines (0 if absent).
func keyed(path, key string) uint64 {
	b, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// single reads a cgroup file of one number (0 if absent).
func single(path string) uint64 {
	b, _ := os.ReadFile(path)
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

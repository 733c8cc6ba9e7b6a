package guest

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
)

// sandboxCgroupDir is the sandbox's cgroup in the guest (sandboxCgroup).
const sandboxCgroupDir = "/sys/fs/cgroup/sandbox"

// cgroupStats answers the sandbox cgroup's counters.
func (s *server) cgroupStats(st net.Conn) {
	if s.whole {
		s.guestStats(st)
		return
	}
	if s.ns == nil {
		fail(st, errdefs.Unsupported, errors.New("no sandbox cgroup in a VM without layers"))
		return
	}
	var cs CgroupStats
	cs.OOMKills = keyed(sandboxCgroupDir+"/memory.events", "oom_kill")
	cs.CPUUsec = keyed(sandboxCgroupDir+"/cpu.stat", "usage_usec")
	cs.Pids = single(sandboxCgroupDir + "/pids.current")
	cs.MemoryBytes = single(sandboxCgroupDir + "/memory.current")
	cs.MemoryMax = single(sandboxCgroupDir + "/memory.max") // "max" reads 0
	cs.PidsMax = single(sandboxCgroupDir + "/pids.max")
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

package guest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
)

// setLimits writes the sandbox cgroup's new limits, all or none: the
// files written before a failed one get their values back.
func (s *server) setLimits(st net.Conn, l *Limits) {
	if s.cg == nil {
		fail(st, errdefs.Unsupported, s.cgErr)
		return
	}
	if l == nil {
		fail(st, errdefs.Invalid, errors.New("limits: none given"))
		return
	}
	dir := s.cgDir
	if err := makeRoom(dir, l.MemoryBytes); err != nil {
		fail(st, errdefs.Invalid, err)
		return
	}
	var ws [][2]string // file, value
	if l.MemoryBytes != nil {
		ws = append(ws, [2]string{dir + "/memory.max", maxOr(*l.MemoryBytes)})
	}
	if l.PidsMax != nil {
		ws = append(ws, [2]string{dir + "/pids.max", maxOr(*l.PidsMax)})
	}
	old := make([]string, len(ws))
	for i, w := range ws {
		b, err := os.ReadFile(w[0])
		if err != nil {
			fail(st, errdefs.Internal, err)
			return
		}
		old[i] = strings.TrimSpace(string(b))
	}
	for i, w := range ws {
		if err := os.WriteFile(w[0], []byte(w[1]), 0); err != nil {
			for j := i - 1; j >= 0; j-- {
				_ = os.WriteFile(ws[j][0], []byte(old[j]), 0)
			}
			fail(st, errdefs.Invalid, fmt.Errorf("%s=%s: %w", w[0], w[1], err))
			return
		}
	}
	if s.whole {
		// A restarted agent's cgroup is a new one (systemd removes
		// the unit's when its process ends): it takes these again.
		saveLimits(dir)
	}
	_ = WriteFrame(st, KindExit, []byte("{}"))
}

// maxOr is a cgroup v2 limit: n, or "max" for 0 (no limit).
func maxOr(n int64) string {
	if n <= 0 {
		return "max"
	}
	return strconv.FormatInt(n, 10)
}

// makeRoom asks the sandbox's cgroup (dir) to give back what it uses
// above a new memory limit before the limit is written: a lower
// memory.max does not fail (the kernel reclaims, then OOM-kills), so a cgroup that still
// uses more is refused with nothing changed, as the container backend
// refuses it on a v2 node (cgroups.Group.SetLimits).
func makeRoom(dir string, limit *int64) error {
	if limit == nil || *limit <= 0 {
		return nil
	}
	cur := single(dir + "/memory.current")
	if cur <= uint64(*limit) {
		return nil
	}
	// The guest has no swap: only page cache can go. Asking
	// memory.reclaim for more than that kept a guest's agent in the
	// kernel for minutes (conformance Update, a 100 MB holder).
	if file := keyed(dir+"/memory.stat", "file"); cur-min(file, cur) > uint64(*limit) {
		return fmt.Errorf("memory limit %d is below what the sandbox uses (%d bytes, %d of it page cache) and cannot give back: nothing changed", *limit, cur, file)
	}
	_ = os.WriteFile(dir+"/memory.reclaim", []byte(strconv.FormatUint(cur-uint64(*limit), 10)), 0)
	if cur = single(dir + "/memory.current"); cur > uint64(*limit) {
		return fmt.Errorf("memory limit %d is below what the sandbox uses (%d bytes) and cannot give back: nothing changed", *limit, cur)
	}
	return nil
}

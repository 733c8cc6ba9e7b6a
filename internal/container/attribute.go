package container

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/events"
)

var _ events.Attributor = (*Backend)(nil)

// SandboxOfPid finds the sandbox of a host process by its cgroup (the
// pids or the unified hierarchy's line of /proc/<pid>/cgroup naming
// <parent>/<id>: every sandbox has one of its own there, while other
// controllers may be shared, as devices is on hybrid hosts) and its
// pid inside the sandbox (the last NSpid), for event sources that see
// host pids (events.Attributor). A process gone meanwhile, or of no
// sandbox of this backend, is not found.
func (b *Backend) SandboxOfPid(hostPid int) (string, int, bool) {
	proc := "/proc/" + strconv.Itoa(hostPid)
	cg, err := os.ReadFile(proc + "/cgroup")
	if err != nil {
		return "", 0, false
	}
	prefix := "/" + strings.Trim(b.opts.CgroupParent, "/") + "/"
	id := ""
	for line := range bytes.SplitSeq(cg, []byte{'\n'}) {
		// hierarchy-id:controllers:path; the path may hold colons.
		f := bytes.SplitN(line, []byte{':'}, 3)
		if len(f) != 3 || (len(f[1]) > 0 && !slices.ContainsFunc(bytes.Split(f[1], []byte{','}), isPids)) {
			continue
		}
		if rest, ok := strings.CutPrefix(string(f[2]), prefix); ok {
			id, _, _ = strings.Cut(rest, "/")
			break
		}
	}
	if !backend.ValidID(id) {
		return "", 0, false
	}
	status, err := os.ReadFile(proc + "/status")
	if err != nil {
		return "", 0, false
	}
	for line := range bytes.SplitSeq(status, []byte{'\n'}) {
		if rest, ok := bytes.CutPrefix(line, []byte("NSpid:")); ok {
			f := bytes.Fields(rest)
			if len(f) == 0 {
				break
			}
			pid, err := strconv.Atoi(string(f[len(f)-1]))
			return id, pid, err == nil
		}
	}
	return "", 0, false
}

func isPids(c []byte) bool { return string(c) == "pids" }

package guest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The commands' cgroup in a full OS (ServiceMain). systemd delegates the
// agent's unit's cgroup to it (Delegate=yes in warren-guest.service):
//
//	<unit>/            memory and pids enabled for its children
//	<unit>/agent/      the agent (cgroup v2: no processes beside children
//	                   with controllers, so it moves into a leaf)
//	<unit>/sandbox/    every command, with the sandbox's memory.max and
//	                   pids.max (set by the host's "limits" call)
//
// An OOM kill under the limit takes a command, never the agent, which
// stays outside the cgroup and at oom_score_adj -1000.

// limitsFile keeps the commands' cgroup's limits for a restarted agent:
// systemd removes the unit's cgroups when its process ends, and the new
// agent's cgroup takes them again. /run: gone with the VM, as they are.
const limitsFile = "/run/warren-guest/limits"

// limitFiles are what limitsFile keeps, in the cgroup's names.
var limitFiles = []string{"memory.max", "pids.max"}

// serviceCgroup makes the commands' cgroup under the agent's own and
// returns its directory, open, and its path.
func serviceCgroup() (*os.File, string, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, "", errors.New("no cgroup v2 hierarchy at /sys/fs/cgroup in this guest")
	}
	own, err := ownCgroup()
	if err != nil {
		return nil, "", err
	}
	unit := filepath.Join("/sys/fs/cgroup", own)
	for _, d := range []string{unit + "/agent", unit + "/sandbox"} {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return nil, "", err
		}
	}
	if err := os.WriteFile(unit+"/agent/cgroup.procs", []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return nil, "", fmt.Errorf("move the agent into %s/agent: %w", unit, err)
	}
	if err := os.WriteFile(unit+"/cgroup.subtree_control", []byte("+memory +pids"), 0); err != nil {
		return nil, "", fmt.Errorf("enable memory and pids under %s (is the unit Delegate=yes?): %w", unit, err)
	}
	dir := unit + "/sandbox"
	// The guest has no swap; say so, should it get some.
	_ = os.WriteFile(dir+"/memory.swap.max", []byte("0"), 0)
	if err := loadLimits(dir); err != nil {
		return nil, "", err
	}
	f, err := os.Open(dir)
	return f, dir, err
}

// ownCgroup is this process's cgroup v2 path ("0::/...").
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("the agent is in no cgroup v2 group")
}

// saveLimits writes the limits of cgroup dir to limitsFile ("file value"
// lines).
func saveLimits(dir string) {
	var b strings.Builder
	for _, f := range limitFiles {
		v, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s %s\n", f, strings.TrimSpace(string(v)))
	}
	_ = os.MkdirAll(filepath.Dir(limitsFile), 0o700)
	tmp := limitsFile + ".tmp"
	if os.WriteFile(tmp, []byte(b.String()), 0o600) == nil {
		_ = os.Rename(tmp, limitsFile)
	}
}

// loadLimits sets the limits limitsFile keeps (none: nothing to do) on
// cgroup dir.
func loadLimits(dir string) error {
	b, err := os.ReadFile(limitsFile)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f, v, ok := strings.Cut(line, " ")
		if !ok || !slices.Contains(limitFiles, f) {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0); err != nil {
			return fmt.Errorf("restore %s=%s: %w", f, v, err)
		}
	}
	return nil
}

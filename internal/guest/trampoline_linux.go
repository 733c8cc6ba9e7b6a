package guest

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A process with resource limits of its own starts as the agent again,
// in the trampoline role: it sets the limits and its OOM score on itself
// and executes the command. Go's exec has no step between fork and exec
// (its child is a vfork), and limits set from outside after the start
// would race with the command reading them; the agent's own are not
// lowered (a sandbox's nofile of 16 would starve the agent). The
// trampoline runs with the command's credentials and directory (set by
// Go before it), so it can only lower: the agent raises its own hard
// limits to the most at boot (raiseLimits), and the limits come from
// there. An exec that fails is reported on fd 3, which closes unread on
// success.

const (
	trampolineRole = "WARREN_GUEST_ROLE=exec"
	// trampolineEnv carries the target path and the limits (JSON).
	trampolineEnv = "WARREN_GUEST_EXEC="
)

type trampolineArgs struct {
	Path    string   `json:"path"`
	Rlimits []Rlimit `json:"rlimits"`
}

// IsTrampoline reports whether this process is the exec trampoline.
func IsTrampoline() bool {
	for _, e := range os.Environ() {
		if e == trampolineRole {
			return true
		}
	}
	return false
}

// TrampolineMain sets the limits and executes the command; it returns
// only to exit, after saying why on fd 3.
func TrampolineMain() {
	// The command must not hold it: its close says the exec succeeded.
	unix.CloseOnExec(3)
	report := os.NewFile(3, "exec-error")
	var a trampolineArgs
	var env []string
	for _, e := range os.Environ() {
		switch {
		case e == trampolineRole:
		case strings.HasPrefix(e, trampolineEnv):
			if err := json.Unmarshal([]byte(e[len(trampolineEnv):]), &a); err != nil {
				fmt.Fprintf(report, "bad trampoline arguments: %v", err)
				os.Exit(127)
			}
		default:
			env = append(env, e)
		}
	}
	for _, l := range a.Rlimits {
		if err := unix.Setrlimit(l.Resource, &unix.Rlimit{Cur: l.Soft, Max: l.Hard}); err != nil {
			fmt.Fprintf(report, "set resource limit %d to %d:%d: %v", l.Resource, l.Soft, l.Hard, err)
			os.Exit(127)
		}
	}
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0)
	err := syscall.Exec(a.Path, os.Args, env)
	fmt.Fprintf(report, "%d:exec %s: %v", err.(syscall.Errno), a.Path, err)
	os.Exit(127)
}

// raiseLimits raises the agent's hard limits (root in the guest may) to
// the most, so that its commands' trampolines can set any limit the host
// allowed by lowering alone; the soft ones stay.
func raiseLimits() {
	nrOpen := uint64(1 << 20)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		fmt.Sscan(string(b), &nrOpen)
	}
	for r := 0; r < 16; r++ { // RLIM_NLIMITS
		var l unix.Rlimit
		if unix.Getrlimit(r, &l) != nil {
			continue
		}
		l.Max = unix.RLIM_INFINITY
		if r == unix.RLIMIT_NOFILE {
			l.Max = nrOpen
		}
		l.Cur = min(l.Cur, l.Max)
		_ = unix.Setrlimit(r, &l)
	}
}

package guest

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
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

// The sandbox's limits are on the kernel command line too
// (warren.rlimits=RES:SOFT:HARD,..., "i" for unlimited). At boot the agent
// takes on itself those it can live with (agentMayHold) and executes
// itself again, so that Go's start sees them: Go raises its own soft
// nofile to the hard one and gives its children the soft one back. Its
// commands then inherit them, and need the trampoline only for a limit
// the agent would not hold (a nofile of 16, a finite cpu time): the
// daemon's defaults need none (the trampoline costs an exec and a Go
// start, ~40 ms under TCG).

// limitedEnv marks the agent's second start.
const limitedEnv = "WARREN_GUEST_LIMITED=1"

// agentMayHold reports whether the agent (PID 1: it serves the host) may
// live under l itself.
func agentMayHold(l Rlimit) bool {
	switch l.Resource {
	case unix.RLIMIT_CORE, unix.RLIMIT_NPROC, unix.RLIMIT_MEMLOCK, unix.RLIMIT_LOCKS,
		unix.RLIMIT_SIGPENDING, unix.RLIMIT_MSGQUEUE, unix.RLIMIT_NICE, unix.RLIMIT_RTPRIO:
		return true // root passes nproc; the agent locks no memory, takes no priority
	case unix.RLIMIT_STACK:
		return l.Soft >= 1<<20
	case unix.RLIMIT_NOFILE:
		return l.Hard >= 4096 // Go raises the agent's soft one to it
	}
	return l.Soft == unix.RLIM_INFINITY && l.Hard == unix.RLIM_INFINITY
}

// parseRlimits reads warren.rlimits.
func parseRlimits(v string) []Rlimit {
	var out []Rlimit
	num := func(s string) (uint64, bool) {
		if s == "i" {
			return unix.RLIM_INFINITY, true
		}
		n, err := strconv.ParseUint(s, 10, 64)
		return n, err == nil
	}
	for _, f := range strings.Split(v, ",") {
		p := strings.Split(f, ":")
		if len(p) != 3 {
			continue
		}
		r, err := strconv.Atoi(p[0])
		soft, ok1 := num(p[1])
		hard, ok2 := num(p[2])
		if err == nil && ok1 && ok2 {
			out = append(out, Rlimit{Resource: r, Soft: soft, Hard: hard})
		}
	}
	return out
}

// FormatRlimits is warren.rlimits's value for ls.
func FormatRlimits(ls []Rlimit) string {
	num := func(n uint64) string {
		if n == unix.RLIM_INFINITY {
			return "i"
		}
		return strconv.FormatUint(n, 10)
	}
	var parts []string
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%d:%s:%s", l.Resource, num(l.Soft), num(l.Hard)))
	}
	return strings.Join(parts, ",")
}

// takeLimits takes on the agent the sandbox's limits it may hold and
// returns them (what its commands inherit), executing the agent again
// first if it has not yet.
func takeLimits() (map[int]Rlimit, error) {
	held := map[int]Rlimit{}
	for _, l := range parseRlimits(cmdlineString("rlimits")) {
		if agentMayHold(l) {
			held[l.Resource] = l
		}
	}
	if len(held) == 0 || os.Getenv(strings.Split(limitedEnv, "=")[0]) == "1" {
		return held, nil
	}
	for _, l := range held {
		if err := unix.Setrlimit(l.Resource, &unix.Rlimit{Cur: l.Soft, Max: l.Hard}); err != nil {
			return nil, fmt.Errorf("resource limit %d: %w", l.Resource, err)
		}
	}
	err := syscall.Exec("/proc/self/exe", os.Args, append(os.Environ(), limitedEnv))
	return nil, fmt.Errorf("execute the agent again: %w", err)
}

// raiseLimits raises the agent's hard limits (root in the guest may) that
// it does not hold for the sandbox to the most, so that its commands'
// trampolines can set any limit the host allowed by lowering alone; the
// soft ones stay.
func raiseLimits(held map[int]Rlimit) {
	nrOpen := uint64(1 << 20)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		fmt.Sscan(string(b), &nrOpen)
	}
	for r := 0; r < 16; r++ { // RLIM_NLIMITS
		if _, ok := held[r]; ok {
			continue // (a nofile set here would lose Go's give-back)
		}
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

// needsTrampoline reports whether a command with limits ls must set some
// itself: those its agent holds for the sandbox it inherits.
func needsTrampoline(ls []Rlimit, held map[int]Rlimit) bool {
	for _, l := range ls {
		if held[l.Resource] != l {
			return true
		}
	}
	return false
}

// Package rlimit names the resource limits (setrlimit(2)) of a sandbox's
// processes and decides their values: the defaults of a normal Debian 12
// machine, a create request's overrides, and what the daemon itself may
// grant.
//
// Without it a sandbox's `ulimit -n` and `ulimit -s` were whatever the
// daemon's own parent gave it (a shell, a systemd unit, a test binary),
// so the same task saw different limits on different nodes.
package rlimit

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Infinity is RLIM_INFINITY: no limit.
const Infinity = ^uint64(0)

// Limit is one resource limit of every process of a sandbox.
type Limit struct {
	Name       string // as in Names: "nofile", "stack", ...
	Soft, Hard uint64 // Infinity for unlimited
}

// resource is one row of the kernel's table with Warren's default.
type resource struct {
	name string
	// num is the resource's number in the Linux ABI (asm-generic
	// resource.h: the same on amd64 and arm64).
	num        int
	soft, hard uint64
}

// resources lists every limit the kernel has, in its order (that of
// /proc/self/limits), with the defaults of a Debian 12 machine booted with
// systemd 252 (what a service or login session there gets): a task that
// passes there sees the same limits here. Where the daemon's own hard
// limit is lower, the default is lowered to it (Defaults).
var resources = []resource{
	{"cpu", 0, Infinity, Infinity},
	{"fsize", 1, Infinity, Infinity},
	{"data", 2, Infinity, Infinity},
	// 8 MiB: the kernel's _STK_LIM; glibc sizes threads' stacks from it.
	{"stack", 3, 8 << 20, Infinity},
	// No core files by default, but a process may enable them (`ulimit -c
	// unlimited`), as on Debian.
	{"core", 4, 0, Infinity},
	{"rss", 5, Infinity, Infinity}, // no effect since Linux 2.6
	// RLIMIT_NPROC counts a kernel uid's processes on the whole node (a
	// sandbox has no user namespace: uid 1000 here is uid 1000 of every
	// sandbox), so any finite default would let one sandbox's processes
	// starve another's; the pids cgroup (pids_max) bounds each sandbox.
	// Unlimited is lowered to the daemon's own hard limit.
	{"nproc", 6, Infinity, Infinity},
	// systemd 252's DefaultLimitNOFILE=1024:524288: soft 1024 because
	// select(2) cannot take fds above 1023; hard 512 Ki for programs that
	// raise their own soft limit.
	{"nofile", 7, 1024, 524288},
	// 8 MiB: the kernel's default since 5.16 and systemd's
	// DefaultLimitMEMLOCK=8M (io_uring rings and BPF maps count here).
	{"memlock", 8, 8 << 20, 8 << 20},
	{"as", 9, Infinity, Infinity},
	{"locks", 10, Infinity, Infinity},
	// Per kernel uid on the whole node, like nproc; the kernel sizes it
	// from RAM (96,363 with 24 GiB). Unlimited is lowered to the daemon's.
	{"sigpending", 11, Infinity, Infinity},
	{"msgqueue", 12, 819200, 819200}, // the kernel's MQ_BYTES_MAX
	{"nice", 13, 0, 0},
	{"rtprio", 14, 0, 0},
	{"rttime", 15, Infinity, Infinity},
}

// Names lists the limit names, in the kernel's order.
func Names() []string {
	out := make([]string, len(resources))
	for i, r := range resources {
		out[i] = r.name
	}
	return out
}

func lookup(name string) (int, bool) {
	for i, r := range resources {
		if r.name == name {
			return i, true
		}
	}
	return 0, false
}

// Number returns the Linux resource number of name (RLIMIT_NOFILE for
// "nofile").
func Number(name string) (int, bool) {
	i, ok := lookup(name)
	if !ok {
		return 0, false
	}
	return resources[i].num, true
}

// Ceiling returns this process's hard limit of resource num: what it, and
// so the sandboxes it starts, may grant at most. Raising a hard limit
// needs CAP_SYS_RESOURCE, which Warren does not rely on (root on these
// nodes lacks it).
func Ceiling(num int) uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(num, &r); err != nil {
		return Infinity // the kernel will judge
	}
	return r.Max
}

// Defaults returns the default of every limit, lowered to ceiling where
// the daemon may grant less.
func Defaults(ceiling func(num int) uint64) []Limit {
	out := make([]Limit, len(resources))
	for i, r := range resources {
		hard := min(r.hard, ceiling(r.num))
		out[i] = Limit{Name: r.name, Soft: min(r.soft, hard), Hard: hard}
	}
	return out
}

// Resolve returns the limits of a sandbox: every limit, in the kernel's
// order, with the requested ones over the defaults. A request with an
// unknown or repeated name, soft above hard, or a hard limit above the
// daemon's own (ceiling) is Invalid.
func Resolve(req []Limit, ceiling func(num int) uint64) ([]Limit, error) {
	out := Defaults(ceiling)
	seen := make(map[string]bool, len(req))
	for _, l := range req {
		i, ok := lookup(l.Name)
		switch {
		case !ok:
			return nil, errdefs.Invalidf("unknown rlimit %q (have %s)", l.Name, strings.Join(Names(), ", "))
		case seen[l.Name]:
			return nil, errdefs.Invalidf("rlimit %s given twice", l.Name)
		case l.Soft > l.Hard:
			return nil, errdefs.Invalidf("rlimit %s: soft limit %s above the hard limit %s", l.Name, Format(l.Soft), Format(l.Hard))
		}
		if c := ceiling(resources[i].num); l.Hard > c {
			return nil, errdefs.Invalidf("rlimit %s: hard limit %s above the daemon's own hard limit %s: "+
				"raising a hard limit needs CAP_SYS_RESOURCE, so no sandbox can get more than the daemon has; "+
				"ask for at most %s, or start the daemon with a higher limit (LimitNOFILE= and the like in its systemd unit)",
				l.Name, Format(l.Hard), Format(c), Format(c))
		}
		seen[l.Name] = true
		out[i] = l
	}
	return out, nil
}

// Format writes a limit value as ulimit does: a number or "unlimited".
func Format(v uint64) string {
	if v == Infinity {
		return "unlimited"
	}
	return strconv.FormatUint(v, 10)
}

// ParseValue reads a number or "unlimited" (also "-1" and "infinity").
func ParseValue(s string) (uint64, error) {
	switch s {
	case "unlimited", "infinity", "-1":
		return Infinity, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid rlimit value %q: want a number or unlimited", s)
	}
	return v, nil
}

// Parse reads NAME=SOFT:HARD, or NAME=N for soft and hard N, as
// `docker run --ulimit` takes it: "nofile=1024:4096", "core=unlimited".
func Parse(s string) (Limit, error) {
	name, vals, ok := strings.Cut(s, "=")
	if !ok || name == "" || vals == "" {
		return Limit{}, fmt.Errorf("invalid ulimit %q: want NAME=SOFT[:HARD], e.g. nofile=1024:4096", s)
	}
	if _, ok := lookup(name); !ok {
		return Limit{}, fmt.Errorf("invalid ulimit %q: unknown name %q (have %s)", s, name, strings.Join(Names(), ", "))
	}
	softS, hardS, two := strings.Cut(vals, ":")
	soft, err := ParseValue(softS)
	if err != nil {
		return Limit{}, err
	}
	hard := soft
	if two {
		if hard, err = ParseValue(hardS); err != nil {
			return Limit{}, err
		}
	}
	return Limit{Name: name, Soft: soft, Hard: hard}, nil
}

// procRows are the rows of /proc/PID/limits, by name.
var procRows = map[string]string{
	"Max cpu time": "cpu", "Max file size": "fsize", "Max data size": "data", "Max stack size": "stack",
	"Max core file size": "core", "Max resident set": "rss", "Max processes": "nproc",
	"Max open files": "nofile", "Max locked memory": "memlock", "Max address space": "as",
	"Max file locks": "locks", "Max pending signals": "sigpending", "Max msgqueue size": "msgqueue",
	"Max nice priority": "nice", "Max realtime priority": "rtprio", "Max realtime timeout": "rttime",
}

// ParseProc reads the limits of a process as the kernel shows them in
// /proc/PID/limits, by name.
func ParseProc(text string) (map[string]Limit, error) {
	out := map[string]Limit{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		for i := 2; i+1 < len(f); i++ {
			name, ok := procRows[strings.Join(f[:i], " ")]
			if !ok {
				continue
			}
			soft, err := ParseValue(f[i])
			if err != nil {
				return nil, err
			}
			hard, err := ParseValue(f[i+1])
			if err != nil {
				return nil, err
			}
			out[name] = Limit{Name: name, Soft: soft, Hard: hard}
			break
		}
	}
	if len(out) != len(resources) {
		return nil, fmt.Errorf("limits: %d of %d rows in %q", len(out), len(resources), text)
	}
	return out, nil
}

// InitConfig encodes limits for the container init stage
// (internal/container/init_linux.c): "NUM:SOFT:HARD" entries separated by
// ',', values in decimal (Infinity is 2^64-1, RLIM_INFINITY). Unknown
// names are left out (the daemon validated them).
func InitConfig(ls []Limit) string {
	var b strings.Builder
	for _, l := range ls {
		num, ok := Number(l.Name)
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d:%d:%d", num, l.Soft, l.Hard)
	}
	return b.String()
}

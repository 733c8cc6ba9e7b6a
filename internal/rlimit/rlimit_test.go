package rlimit

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// The numbers the init stage passes to setrlimit are this kernel's.
func TestNumbersAreTheKernels(t *testing.T) {
	want := map[string]int{
		"cpu": unix.RLIMIT_CPU, "fsize": unix.RLIMIT_FSIZE, "data": unix.RLIMIT_DATA,
		"stack": unix.RLIMIT_STACK, "core": unix.RLIMIT_CORE, "rss": unix.RLIMIT_RSS,
		"nproc": unix.RLIMIT_NPROC, "nofile": unix.RLIMIT_NOFILE, "memlock": unix.RLIMIT_MEMLOCK,
		"as": unix.RLIMIT_AS, "locks": unix.RLIMIT_LOCKS, "sigpending": unix.RLIMIT_SIGPENDING,
		"msgqueue": unix.RLIMIT_MSGQUEUE, "nice": unix.RLIMIT_NICE, "rtprio": unix.RLIMIT_RTPRIO,
		"rttime": unix.RLIMIT_RTTIME,
	}
	if len(Names()) != len(want) {
		t.Fatalf("names %v, want %d", Names(), len(want))
	}
	for name, num := range want {
		if got, ok := Number(name); !ok || got != num {
			t.Errorf("Number(%s) = %d, %v; want %d", name, got, ok, num)
		}
	}
	// One row per limit in /proc/self/limits, in the same order.
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		t.Skip(err)
	}
	if rows := strings.Count(string(b), "\n") - 1; rows != len(want) {
		t.Fatalf("/proc/self/limits has %d rows, the table %d", rows, len(want))
	}
	got, err := ParseProc(string(b))
	if err != nil {
		t.Fatal(err)
	}
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_STACK, &r); err != nil {
		t.Fatal(err)
	}
	if l := got["stack"]; l.Soft != r.Cur || l.Hard != r.Max {
		t.Fatalf("stack from /proc/self/limits %+v, getrlimit %+v", l, r)
	}
}

func ceil(hard map[int]uint64) func(int) uint64 {
	return func(num int) uint64 {
		if v, ok := hard[num]; ok {
			return v
		}
		return Infinity
	}
}

func find(t *testing.T, ls []Limit, name string) Limit {
	t.Helper()
	for _, l := range ls {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("no %s in %v", name, ls)
	return Limit{}
}

// The defaults are Debian 12's, lowered to what the daemon may grant.
func TestDefaults(t *testing.T) {
	ls := Defaults(ceil(nil))
	for _, c := range []Limit{
		{"nofile", 1024, 524288}, {"stack", 8 << 20, Infinity}, {"core", 0, Infinity},
		{"memlock", 8 << 20, 8 << 20}, {"nproc", Infinity, Infinity}, {"msgqueue", 819200, 819200},
	} {
		if got := find(t, ls, c.Name); got != c {
			t.Errorf("default %s = %+v, want %+v", c.Name, got, c)
		}
	}
	// A daemon with nofile hard 20000 and nproc hard 96363 (this VM).
	ls = Defaults(ceil(map[int]uint64{unix.RLIMIT_NOFILE: 20000, unix.RLIMIT_NPROC: 96363, unix.RLIMIT_MEMLOCK: 4096}))
	for _, c := range []Limit{{"nofile", 1024, 20000}, {"nproc", 96363, 96363}, {"memlock", 4096, 4096}} {
		if got := find(t, ls, c.Name); got != c {
			t.Errorf("lowered default %s = %+v, want %+v", c.Name, got, c)
		}
	}
}

func TestResolve(t *testing.T) {
	c := ceil(map[int]uint64{unix.RLIMIT_NOFILE: 20000})
	ls, err := Resolve([]Limit{{"nofile", 64, 128}, {"core", Infinity, Infinity}}, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != len(Names()) {
		t.Fatalf("%d limits, want every one", len(ls))
	}
	if got := find(t, ls, "nofile"); got != (Limit{"nofile", 64, 128}) {
		t.Errorf("nofile %+v", got)
	}
	if got := find(t, ls, "core"); got != (Limit{"core", Infinity, Infinity}) {
		t.Errorf("core %+v", got)
	}
	for _, bad := range []struct {
		req  []Limit
		want string
	}{
		{[]Limit{{"files", 1, 1}}, `unknown rlimit "files"`},
		{[]Limit{{"nofile", 2, 1}}, "soft limit 2 above the hard limit 1"},
		{[]Limit{{"nofile", 1, 1}, {"nofile", 2, 2}}, "given twice"},
		{[]Limit{{"nofile", 1024, 20001}}, "above the daemon's own hard limit 20000"},
		{[]Limit{{"nofile", 1024, Infinity}}, "hard limit unlimited above the daemon's own hard limit 20000"},
	} {
		_, err := Resolve(bad.req, c)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Resolve(%+v) = %v, want invalid containing %q", bad.req, err, bad.want)
		}
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Limit{
		"nofile=1024:4096":    {"nofile", 1024, 4096},
		"nofile=4096":         {"nofile", 4096, 4096},
		"core=unlimited":      {"core", Infinity, Infinity},
		"stack=8388608:-1":    {"stack", 8 << 20, Infinity},
		"cpu=10:unlimited":    {"cpu", 10, Infinity},
		"memlock=0:infinity":  {"memlock", 0, Infinity},
		"msgqueue=0:0":        {"msgqueue", 0, 0},
		"sigpending=100:1000": {"sigpending", 100, 1000},
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"nofile", "nofile=", "=1", "files=1", "nofile=x", "nofile=1:y", "nofile=-2"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

func TestInitConfig(t *testing.T) {
	got := InitConfig([]Limit{{"nofile", 1024, 4096}, {"stack", 8 << 20, Infinity}})
	if want := "7:1024:4096,3:8388608:18446744073709551615"; got != want {
		t.Fatalf("InitConfig = %q, want %q", got, want)
	}
}

package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/rlimit"
)

// procLimits reads /proc/self/limits of a process started in sb as uid.
func procLimits(t *testing.T, sb backend.Sandbox, uid uint32) map[string]rlimit.Limit {
	t.Helper()
	r := Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/proc/self/limits"}, UID: uid, GID: uid}, "")
	if r.Status.Code != 0 {
		t.Fatalf("cat /proc/self/limits: %+v", r)
	}
	ls, err := rlimit.ParseProc(r.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// checkLimits fails t unless every limit of want is what a process of sb
// running as uid sees.
func checkLimits(t *testing.T, sb backend.Sandbox, uid uint32, want []rlimit.Limit) {
	t.Helper()
	got := procLimits(t, sb, uid)
	for _, l := range want {
		if got[l.Name] != l {
			t.Errorf("uid %d: %s is %s:%s, want %s:%s", uid, l.Name, rlimit.Format(got[l.Name].Soft), rlimit.Format(got[l.Name].Hard),
				rlimit.Format(l.Soft), rlimit.Format(l.Hard))
		}
	}
}

// rlimits checks that a sandbox's processes start with the resource
// limits of its spec, whoever they run as, and whatever the backend's own
// process has (the daemon's parent chose those); that the backend's
// service of a sandbox (its agent) is not held to the programs' limits;
// and that a limit the backend cannot grant fails the create and leaves
// nothing behind.
func rlimits(t *testing.T, b backend.Backend, h Harness) {
	t.Run("Defaults", func(t *testing.T) {
		defaults := rlimit.Defaults(rlimit.Ceiling)
		sb := create(t, b, h, func(s *backend.Spec) { s.Rlimits = defaults })
		checkLimits(t, sb, 0, defaults)
		checkLimits(t, sb, 65534, defaults)
		// The values of a Debian 12 machine, where the daemon may grant them.
		want := []rlimit.Limit{
			{Name: "nofile", Soft: 1024, Hard: min(524288, rlimit.Ceiling(unix.RLIMIT_NOFILE))},
			{Name: "stack", Soft: 8 << 20, Hard: rlimit.Ceiling(unix.RLIMIT_STACK)},
			{Name: "core", Soft: 0, Hard: rlimit.Ceiling(unix.RLIMIT_CORE)},
		}
		checkLimits(t, sb, 0, want)
	})

	t.Run("Override", func(t *testing.T) {
		limits, err := rlimit.Resolve([]rlimit.Limit{
			{Name: "nofile", Soft: 64, Hard: 128},          // kept by the agent, set in each process
			{Name: "stack", Soft: 4 << 20, Hard: 16 << 20}, // so is stack
			{Name: "cpu", Soft: 1000, Hard: 2000},          // and cpu
			{Name: "core", Soft: 4096, Hard: 8192},         // set on PID 1, inherited
			{Name: "msgqueue", Soft: 1000, Hard: 2000},
		}, rlimit.Ceiling)
		if err != nil {
			t.Fatal(err)
		}
		sb := create(t, b, h, func(s *backend.Spec) { s.Rlimits = limits })
		checkLimits(t, sb, 0, limits)
		checkLimits(t, sb, 65534, limits)
		// A program may raise its soft limit up to the hard one, as on any
		// machine, and no further (root of a whole machine may: it holds
		// CAP_SYS_RESOURCE of its own kernel).
		r := sh(t, sb, "ulimit -n 128 && ulimit -n; ulimit -n 129 2>/dev/null && echo raised")
		if r.Stdout != "128\n" && !(h.WholeMachine && r.Stdout == "128\nraised\n") {
			t.Errorf("ulimit -n 128, then 129 over hard 128: %+v", r)
		}
	})

	t.Run("AgentNotHeld", func(t *testing.T) {
		// 16 descriptors per program; 40 programs run at once, each held
		// until all have started: an agent held to 16 descriptors itself
		// (a socket per running program) could not start them all.
		limits, err := rlimit.Resolve([]rlimit.Limit{{Name: "nofile", Soft: 16, Hard: 16}}, rlimit.Ceiling)
		if err != nil {
			t.Fatal(err)
		}
		sb := create(t, b, h, func(s *backend.Spec) { s.Rlimits = limits; s.PidsMax = 512 })
		const n = 40
		sh(t, sb, "mkdir /tmp/started")
		var wg sync.WaitGroup
		res := make([]Result, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The count is a glob, not ls | wc: 40 pollers forking
				// twice per poll cost a TCG guest most of its CPU.
				script := fmt.Sprintf(`touch /tmp/started/%d; i=0
while set -- /tmp/started/*; [ $# -lt %d ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done
echo $#`, i, n)
				res[i], errs[i] = TryExec(sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", script}}, "")
			}()
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil || strings.TrimSpace(res[i].Stdout) != fmt.Sprint(n) {
				t.Fatalf("program %d of %d running at once under nofile 16: %+v %v", i, n, res[i], errs[i])
			}
		}
		checkLimits(t, sb, 0, []rlimit.Limit{{Name: "nofile", Soft: 16, Hard: 16}})
	})

	t.Run("Refused", func(t *testing.T) {
		base := h.Resources(t)
		for _, name := range []string{"nofile", "memlock"} {
			num, _ := rlimit.Number(name)
			ceil := rlimit.Ceiling(num)
			if ceil == rlimit.Infinity {
				continue // nothing is above it
			}
			limits := rlimit.Defaults(rlimit.Ceiling)
			for i := range limits {
				if limits[i].Name == name {
					limits[i].Hard = ceil + 1
				}
			}
			spec := backend.Spec{ID: newID("rlimit"), Layers: h.Layers(t), MemoryBytes: 256 << 20, PidsMax: 256, Rlimits: limits}
			sb, err := b.Create(context.Background(), spec)
			if err == nil {
				_ = sb.Destroy(context.Background())
				t.Fatalf("%s hard limit %d above the backend's own %d: created", name, ceil+1, ceil)
			}
			if !strings.Contains(err.Error(), name) {
				t.Errorf("%s refused with %v: the error does not name the limit", name, err)
			}
		}
		checkNoLeaks(t, h, base)
	})
}

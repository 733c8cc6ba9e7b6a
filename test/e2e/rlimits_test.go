package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/rlimit"
)

// apiLimits turns Sandbox.rlimits into limits by name.
func apiLimits(t *testing.T, rs []*warrenv1.Rlimit) map[string]rlimit.Limit {
	t.Helper()
	v := func(n int64) uint64 {
		if n == -1 {
			return rlimit.Infinity
		}
		return uint64(n)
	}
	out := map[string]rlimit.Limit{}
	for _, r := range rs {
		out[r.GetName()] = rlimit.Limit{Name: r.GetName(), Soft: v(r.GetSoft()), Hard: v(r.GetHard())}
	}
	if len(out) != len(rlimit.Names()) {
		t.Fatalf("Sandbox.rlimits has %d limits, want all %d: %v", len(out), len(rlimit.Names()), rs)
	}
	return out
}

// sandboxLimits reads /proc/self/limits of a process in sandbox id.
func (e *env) sandboxLimits(id string) map[string]rlimit.Limit {
	e.t.Helper()
	ls, err := rlimit.ParseProc(e.shOK(id, "cat /proc/self/limits"))
	if err != nil {
		e.t.Fatal(err)
	}
	return ls
}

// checkReported fails the test unless sandbox sb's processes run with
// exactly the limits its Sandbox.rlimits reports.
func (e *env) checkReported(sb *warrenv1.Sandbox, when string) map[string]rlimit.Limit {
	e.t.Helper()
	api, seen := apiLimits(e.t, sb.GetRlimits()), e.sandboxLimits(sb.GetId())
	for name, l := range api {
		if seen[name] != l {
			e.t.Errorf("%s: %s %s: reported %+v, a process has %+v", sb.GetId(), when, name, l, seen[name])
		}
	}
	return api
}

// TestSandboxRlimits: a sandbox's processes get the resource limits the
// API states, not what the daemon's parent happened to give the daemon:
// Debian 12's defaults (nofile 1024:524288, stack 8 MiB, core 0), lowered
// to the daemon's own hard limits, unless the create asks for others;
// Sandbox.rlimits reports every one as processes have it, and so it
// stays through a daemon kill -9 and restart (the record and the agent
// keep them). What the kernel would refuse, or that makes no sense, is
// invalid and creates nothing.
func TestSandboxRlimits(t *testing.T) {
	// The daemon inherits this test's hard limits: make its soft nofile
	// one that differs from the default, as a careless parent's would.
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	if nofile.Max <= 1024 {
		t.Skipf("nofile hard limit %d leaves no room to tell the default from the daemon's", nofile.Max)
	}
	e := newEnv(t, envOptions{})

	def := e.create(&warrenv1.CreateRequest{Id: "rl-default"})
	got := e.checkReported(def, "defaults")
	for _, want := range rlimit.Defaults(rlimit.Ceiling) {
		if got[want.Name] != want {
			t.Errorf("default %s: %+v, want %+v", want.Name, got[want.Name], want)
		}
	}
	if l := got["nofile"]; l.Soft != 1024 || l.Hard != min(524288, nofile.Max) {
		t.Errorf("default nofile %+v, want 1024:%d", l, min(524288, nofile.Max))
	}
	if l := got["stack"]; l.Soft != 8<<20 {
		t.Errorf("default stack %+v, want 8 MiB soft", l)
	}
	if l := got["core"]; l.Soft != 0 {
		t.Errorf("default core %+v, want soft 0", l)
	}

	over := e.create(&warrenv1.CreateRequest{Id: "rl-over", Rlimits: []*warrenv1.Rlimit{
		{Name: "nofile", Soft: 64, Hard: 128},
		{Name: "core", Soft: -1, Hard: -1},
		{Name: "stack", Soft: 16 << 20, Hard: 32 << 20},
		{Name: "msgqueue", Soft: 4096, Hard: 4096},
	}})
	got = e.checkReported(over, "overridden")
	for _, want := range []rlimit.Limit{{Name: "nofile", Soft: 64, Hard: 128}, {Name: "core", Soft: rlimit.Infinity, Hard: rlimit.Infinity},
		{Name: "stack", Soft: 16 << 20, Hard: 32 << 20}, {Name: "msgqueue", Soft: 4096, Hard: 4096}} {
		if got[want.Name] != want {
			t.Errorf("requested %s: %+v, want %+v", want.Name, got[want.Name], want)
		}
	}
	if n := e.shOK(over.Id, "ulimit -n"); n != "64\n" {
		t.Errorf("ulimit -n = %q, want 64", n)
	}
	// A background process gets them too.
	p, err := e.c.StartProcess(ctxFor(t, time.Minute), &warrenv1.ExecRequest{SandboxId: over.Id, Shell: "ulimit -n; ulimit -s"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.c.WaitProcess(ctxFor(t, time.Minute), &warrenv1.WaitProcessRequest{SandboxId: over.Id, ProcessId: p.ProcessId})
	if err != nil || string(res.Stdout) != "64\n16384\n" {
		t.Errorf("background process: %q %v, want 64 and 16384 (KiB)", res.GetStdout(), err)
	}

	// The record keeps them, and the agent, which outlives the daemon,
	// gives the next processes the same.
	e.kill9()
	e.start()
	for _, sb := range []*warrenv1.Sandbox{def, over} {
		after, err := e.c.Get(ctxFor(t, time.Minute), sb.Id)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(after.GetRlimits(), sb.GetRlimits(), func(a, b *warrenv1.Rlimit) bool {
			return a.GetName() == b.GetName() && a.GetSoft() == b.GetSoft() && a.GetHard() == b.GetHard()
		}) {
			t.Errorf("%s after restart: rlimits %v, were %v", sb.Id, after.GetRlimits(), sb.GetRlimits())
		}
		e.checkReported(after, "after restart")
	}

	// The CLI: docker's --ulimit syntax, and get shows them.
	if _, stderr, code := e.cli(nil, "sandbox", "create", "--image", imageName, "--id", "rl-cli", "--ulimit", "nofile=100:200", "--ulimit", "core=unlimited"); code != 0 {
		t.Fatalf("sandbox create --ulimit: exit %d: %s", code, stderr)
	}
	if got := e.shOK("rl-cli", "ulimit -n; ulimit -Hn; ulimit -c"); got != "100\n200\nunlimited\n" {
		t.Errorf("--ulimit nofile=100:200 --ulimit core=unlimited: %q", got)
	}
	if out, _, _ := e.cli(nil, "sandbox", "get", "rl-cli"); !strings.Contains(out, "nofile=100:200") || strings.Contains(out, "core=") {
		t.Errorf("sandbox get does not show the limits (core unlimited left out):\n%s", out)
	}
	if _, stderr, code := e.cli(nil, "sandbox", "create", "--image", imageName, "--ulimit", "nofile=9:8"); code == 0 || !strings.Contains(stderr, "soft limit 9 above the hard limit 8") {
		t.Errorf("--ulimit nofile=9:8: exit %d: %s", code, stderr)
	}

	base := e.resources()
	ceiling := rlimit.Format(nofile.Max)
	for _, c := range []struct {
		what string
		r    []*warrenv1.Rlimit
		want string
	}{
		{"unknown name", []*warrenv1.Rlimit{{Name: "files", Soft: 1, Hard: 1}}, `unknown rlimit "files"`},
		{"soft above hard", []*warrenv1.Rlimit{{Name: "nofile", Soft: 100, Hard: 10}}, "soft limit 100 above the hard limit 10"},
		{"negative", []*warrenv1.Rlimit{{Name: "stack", Soft: -5, Hard: -1}}, "negative"},
		{"twice", []*warrenv1.Rlimit{{Name: "core", Soft: 0, Hard: 0}, {Name: "core", Soft: 1, Hard: 1}}, "given twice"},
		{"above the daemon's", []*warrenv1.Rlimit{{Name: "nofile", Soft: 1024, Hard: int64(nofile.Max) + 1}}, "above the daemon's own hard limit " + ceiling},
		{"unlimited above the daemon's", []*warrenv1.Rlimit{{Name: "nofile", Soft: 1024, Hard: -1}}, "CAP_SYS_RESOURCE"},
	} {
		_, err := e.c.Create(ctxFor(t, time.Minute), &warrenv1.CreateRequest{Image: imageName, Id: "rl-bad", Rlimits: c.r})
		wantCategory(t, err, client.CategoryInvalid, c.what)
		if err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to say %q", c.what, err, c.want)
		}
	}
	if extra, _ := diffResources(base, e.resources()); len(extra) > 0 {
		t.Errorf("refused creates left %v", extra)
	}
}

// TestSandboxEnvDefaults: a process whose image and request choose no
// locale gets LANG=C.UTF-8; nothing of the daemon's own environment (its
// TZ, LANG, LC_ALL) reaches a sandbox; the time zone is the image's
// /etc/localtime (UTC without one), whatever the daemon's TZ says.
func TestSandboxEnvDefaults(t *testing.T) {
	zone, err := os.ReadFile("/usr/share/zoneinfo/Asia/Tokyo")
	if err != nil {
		t.Skipf("no zoneinfo on this host: %v", err)
	}
	e := newEnv(t, envOptions{environ: []string{"TZ=America/New_York", "LANG=de_DE.UTF-8", "LC_ALL=de_DE.UTF-8", "WARREN_E2E_DAEMON_ONLY=1"}})
	importVariant(t, e, "tokyo", func(root string) {
		if err := os.WriteFile(filepath.Join(root, "etc", "localtime"), zone, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	plain := e.create(&warrenv1.CreateRequest{Id: "env-plain"})
	env := strings.Split(strings.TrimSpace(e.shOK(plain.Id, "env")), "\n")
	if !slices.Contains(env, "LANG=C.UTF-8") {
		t.Errorf("no LANG=C.UTF-8 where neither image nor request sets a locale: %q", env)
	}
	for _, kv := range env {
		for _, leak := range []string{"TZ=", "LC_ALL=", "LANG=de", "WARREN_E2E_DAEMON_ONLY="} {
			if strings.HasPrefix(kv, leak) {
				t.Errorf("the daemon's %s reached the sandbox: %q", kv, env)
			}
		}
	}
	if z := e.shOK(plain.Id, "date +%Z"); z != "UTC\n" {
		t.Errorf("time zone without /etc/localtime, daemon TZ=America/New_York: %q, want UTC", z)
	}
	tokyo := e.create(&warrenv1.CreateRequest{Id: "env-tokyo", Image: "tokyo", Env: map[string]string{"LC_ALL": "C"}})
	if z := e.shOK(tokyo.Id, "date +%Z"); z != "JST\n" {
		t.Errorf("time zone of an image whose /etc/localtime is Asia/Tokyo: %q, want JST", z)
	}
	if got := e.shOK(tokyo.Id, `echo "LANG=${LANG-unset} LC_ALL=$LC_ALL"`); got != "LANG=unset LC_ALL=C\n" {
		t.Errorf("a sandbox env with LC_ALL: %q, want no LANG added", got)
	}
	res, err := e.c.Exec(ctxFor(t, time.Minute), &warrenv1.ExecRequest{SandboxId: plain.Id, Shell: `echo "$LANG"`, Env: map[string]string{"LANG": "en_US.UTF-8"}})
	if err != nil || string(res.Stdout) != "en_US.UTF-8\n" {
		t.Errorf("an exec's own LANG: %q %v", res.GetStdout(), err)
	}
}

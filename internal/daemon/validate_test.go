package daemon

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// testManager is a Manager with only the configuration, for validation.
func testManager() *Manager {
	cfg := Config{Backends: map[string]backend.Backend{"container": nil}}
	cfg.setDefaults()
	return &Manager{cfg: cfg}
}

func TestValidID(t *testing.T) {
	for _, id := range []string{"a", "0", "sb-1", "x.y_z", strings.Repeat("a", 63), newID()} {
		if !ValidID(id) {
			t.Errorf("%q invalid", id)
		}
	}
	for _, id := range []string{"", "-a", ".a", "_a", "A", "a/b", "a b", strings.Repeat("a", 64), "é"} {
		if ValidID(id) {
			t.Errorf("%q valid", id)
		}
	}
	seen := map[string]bool{}
	for range 1000 {
		id := newID()
		if len(id) != generatedIDLen || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}

func TestValidateCreate(t *testing.T) {
	m := testManager()
	p, err := m.validateCreate(&warrenv1.CreateRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if p.backend != "container" || p.timeout != time.Hour || p.resources.MemoryBytes != 512<<20 ||
		p.resources.PidsMax != 1024 || p.resources.CpuMillis != 0 {
		t.Fatalf("defaults %+v", p)
	}
	p, err = m.validateCreate(&warrenv1.CreateRequest{
		Id: "sb1", Image: "busybox", Workdir: "/work/../app/",
		Resources:      &warrenv1.Resources{CpuMillis: 500, MemoryBytes: 64 << 20, PidsMax: 64},
		TimeoutSeconds: 86400, Env: map[string]string{"A": "1"}, Labels: map[string]string{"k": "v"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.workdir != "/app" || p.timeout != 24*time.Hour || p.resources.MemoryBytes != 64<<20 {
		t.Fatalf("%+v", p)
	}

	bad := []*warrenv1.CreateRequest{
		{Image: "busybox", Id: "Bad"},
		{},
		{Image: "busybox", Backend: "fullvm"},
		{Image: "busybox", Resources: &warrenv1.Resources{CpuMillis: -1}},
		{Image: "busybox", Resources: &warrenv1.Resources{CpuMillis: 5}},
		{Image: "busybox", Resources: &warrenv1.Resources{CpuMillis: 1 << 40}},
		{Image: "busybox", Resources: &warrenv1.Resources{MemoryBytes: -1}},
		{Image: "busybox", Resources: &warrenv1.Resources{MemoryBytes: 1 << 20}},
		{Image: "busybox", Resources: &warrenv1.Resources{MemoryBytes: 1 << 50}},
		{Image: "busybox", Resources: &warrenv1.Resources{PidsMax: 7}},
		{Image: "busybox", Resources: &warrenv1.Resources{PidsMax: -5}},
		{Image: "busybox", Resources: &warrenv1.Resources{PidsMax: 1 << 30}},
		{Image: "busybox", TimeoutSeconds: -1},
		{Image: "busybox", TimeoutSeconds: 86401},
		{Image: "busybox", Env: map[string]string{"A=B": "x"}},
		{Image: "busybox", Env: map[string]string{"": "x"}},
		{Image: "busybox", Env: map[string]string{"A": "x\x00"}},
		{Image: "busybox", Workdir: "relative"},
		{Image: "busybox", Hostname: strings.Repeat("h", 65)},
		{Image: "busybox", Labels: map[string]string{"": "v"}},
	}
	for _, req := range bad {
		if _, err := m.validateCreate(req); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("%v: want Invalid, got %v", req, err)
		}
	}
}

func TestArgvOf(t *testing.T) {
	argv, err := argvOf(&warrenv1.ExecRequest{Shell: "echo hi | wc -c"})
	if err != nil || !slices.Equal(argv, []string{"/bin/sh", "-c", "echo hi | wc -c"}) {
		t.Fatalf("%q %v", argv, err)
	}
	argv, err = argvOf(&warrenv1.ExecRequest{Argv: []string{"ls", "-l"}})
	if err != nil || !slices.Equal(argv, []string{"ls", "-l"}) {
		t.Fatalf("%q %v", argv, err)
	}
	for _, req := range []*warrenv1.ExecRequest{
		{},
		{Argv: []string{"ls"}, Shell: "ls"},
		{Argv: []string{""}},
		{Argv: []string{"a\x00b"}},
	} {
		if _, err := argvOf(req); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("%v: %v", req, err)
		}
	}
}

func TestMergeEnv(t *testing.T) {
	env := mergeEnv(map[string]string{"A": "1", "B": "2"}, map[string]string{"B": "3", "C": "4"}, "/home/x")
	want := []string{"A=1", "B=3", "C=4", "HOME=/home/x", "LANG=C.UTF-8", "PATH=" + defaultPATH}
	if !slices.Equal(env, want) {
		t.Fatalf("%q", env)
	}
	env = mergeEnv(map[string]string{"PATH": "/opt/bin"}, map[string]string{"HOME": "/h", "LANG": "de_DE.UTF-8"}, "/root")
	if !slices.Equal(env, []string{"HOME=/h", "LANG=de_DE.UTF-8", "PATH=/opt/bin"}) {
		t.Fatalf("%q", env)
	}
	if env := mergeEnv(nil, nil, ""); !slices.Contains(env, "HOME=/") {
		t.Fatalf("%q", env)
	}
}

// LANG=C.UTF-8 is the default only where neither the image nor the
// request chose a locale: any LC_* counts (a default LANG would change
// the categories it leaves unset), an empty LANG too.
func TestMergeEnvLocale(t *testing.T) {
	for _, c := range []struct {
		image, req map[string]string
		lang       string // "" = no LANG in the result
	}{
		{nil, nil, "LANG=C.UTF-8"},
		{map[string]string{"LANG": "en_US.UTF-8"}, nil, "LANG=en_US.UTF-8"},
		{nil, map[string]string{"LANG": ""}, "LANG="},
		{map[string]string{"LC_ALL": "C"}, nil, ""},
		{nil, map[string]string{"LC_CTYPE": "fr_FR.UTF-8"}, ""},
		{map[string]string{"LANGUAGE": "de"}, nil, "LANG=C.UTF-8"},
	} {
		var lang string
		for _, kv := range mergeEnv(c.image, c.req, "/root") {
			if strings.HasPrefix(kv, "LANG=") {
				lang = kv
			}
		}
		if lang != c.lang {
			t.Errorf("image %v, request %v: %q, want %q", c.image, c.req, lang, c.lang)
		}
	}
}

func TestLimitsAndTimeouts(t *testing.T) {
	m := testManager()
	if n, err := outputLimit(0); err != nil || n != DefaultOutputLimit {
		t.Fatal(n, err)
	}
	if n, err := outputLimit(MaxOutputLimit); err != nil || n != MaxOutputLimit {
		t.Fatal(n, err)
	}
	for _, n := range []int64{-1, MaxOutputLimit + 1} {
		if _, err := outputLimit(n); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Fatal(n, err)
		}
	}
	if d, err := m.execTimeout(0, DefaultExecTimeout); err != nil || d != 10*time.Minute {
		t.Fatal(d, err)
	}
	if d, err := m.execTimeout(1500, 0); err != nil || d != 1500*time.Millisecond {
		t.Fatal(d, err)
	}
	for _, ms := range []int64{-1, (25 * time.Hour).Milliseconds()} {
		if _, err := m.execTimeout(ms, 0); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Fatal(ms, err)
		}
	}
	if d, err := m.lifetime(0); err != nil || d != time.Hour {
		t.Fatal(d, err)
	}
}

func TestCgroupMode(t *testing.T) {
	dir := t.TempDir()
	const hybrid = `25 1 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/memory rw shared:6 - cgroup cgroup rw,memory
`
	if got := cgroupMode(dir, hybrid); got != "hybrid" {
		t.Fatalf("hybrid: %s", got)
	}
	if got := cgroupMode(dir, strings.ReplaceAll(hybrid, "cgroup2 cgroup2", "cgroup cgroup")); got != "v1" {
		t.Fatalf("v1: %s", got)
	}
	if got := mountPoints(`1 0 0:1 / /a\040b rw - cgroup2 x rw`, "cgroup2"); !slices.Equal(got, []string{"/a b"}) {
		t.Fatalf("escapes: %q", got)
	}
	if err := writeFile(dir+"/cgroup.controllers", "cpu memory\n"); err != nil {
		t.Fatal(err)
	}
	if got := cgroupMode(dir, hybrid); got != "v2" {
		t.Fatalf("v2: %s", got)
	}
	if got := CgroupMode(); got != "v1" && got != "v2" && got != "hybrid" {
		t.Fatalf("host: %s", got)
	}
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }

// A create's rlimits: every limit comes back (the defaults under the
// request's), -1 is unlimited, and what the kernel would refuse is
// invalid before anything is created.
func TestRlimitsOf(t *testing.T) {
	ls, err := rlimitsOf([]*warrenv1.Rlimit{{Name: "nofile", Soft: 64, Hard: 128}, {Name: "core", Soft: -1, Hard: -1}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*warrenv1.Rlimit{}
	for _, r := range rlimitProtos(ls) {
		got[r.GetName()] = r
	}
	if len(got) != 16 || got["nofile"].GetSoft() != 64 || got["nofile"].GetHard() != 128 ||
		got["core"].GetSoft() != -1 || got["stack"].GetSoft() != 8<<20 {
		t.Fatalf("%v", got)
	}
	for _, bad := range [][]*warrenv1.Rlimit{
		{{Name: "nofiles", Soft: 1, Hard: 1}},
		{{Name: "nofile", Soft: 2, Hard: 1}},
		{{Name: "nofile", Soft: -2, Hard: 1}},
		{{Name: "nofile", Soft: 1, Hard: -1}}, // unlimited: above any daemon's nofile
		{{Name: "nofile", Soft: 1, Hard: 1}, {Name: "nofile", Soft: 1, Hard: 1}},
	} {
		if _, err := rlimitsOf(bad); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("%v: %v, want invalid", bad, err)
		}
	}
}

package container

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/testutil"
)

func TestConformance(t *testing.T) {
	testutil.RequireRoot(t)
	initBin := testutil.StaticBinary(t, "./internal/container/testdata/initmain")
	dir := t.TempDir()
	opts := Options{
		StateDir:     filepath.Join(dir, "state"),
		RunDir:       filepath.Join(dir, "run"),
		CgroupParent: fmt.Sprintf("warren-test-%d", os.Getpid()),
		InitBinary:   initBin,
	}
	t.Cleanup(func() {
		b, err := New(opts)
		if err == nil {
			_ = b.Sweep(t.Context(), nil)
		}
		for _, g := range cgroupDirs(opts.CgroupParent) {
			_ = os.Remove(g)
		}
	})
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T) backend.Backend {
			b, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Layers: func(t *testing.T) []string { return []string{testutil.BusyboxRoot(t)} },
		Resources: func(t *testing.T) []string {
			return resources(t, opts)
		},
		Kill: func(t *testing.T, sb backend.Sandbox) {
			var st state
			if err := json.Unmarshal(sb.State(), &st); err != nil {
				t.Fatal(err)
			}
			if err := unix.Kill(st.Pid, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
	})
}

func cgroupDirs(parent string) []string {
	if cgroups.Mode() == "v2" {
		return []string{filepath.Join(cgroups.Root, parent)}
	}
	var out []string
	for n := range v1Names() {
		out = append(out, filepath.Join(cgroups.Root, n, parent))
	}
	return out
}

func v1Names() map[string]bool {
	return map[string]bool{"cpu": true, "cpuacct": true, "memory": true, "pids": true, "freezer": true, "devices": true}
}

// resources lists what sandboxes of this test can leave on the host:
// mounts under its directories, per-sandbox directories, cgroups under its
// parent, and processes in those cgroups.
func resources(t *testing.T, opts Options) []string {
	var out []string
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (strings.HasPrefix(fields[4], opts.RunDir) || strings.HasPrefix(fields[4], opts.StateDir)) {
			out = append(out, "mount "+fields[4])
		}
	}
	f.Close()
	for _, d := range []string{filepath.Join(opts.RunDir, "sb"), filepath.Join(opts.StateDir, "sandboxes")} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			out = append(out, "dir "+filepath.Join(d, e.Name()))
		}
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range backing {
		if b, err := os.ReadFile(p); err == nil && strings.HasPrefix(string(b), opts.StateDir) {
			out = append(out, "loop "+strings.TrimSpace(string(b)))
		}
	}
	disks, _ := os.ReadDir(filepath.Join(opts.StateDir, "disks"))
	for _, e := range disks {
		out = append(out, "disk "+e.Name())
	}
	groups, err := cgroups.List(opts.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		out = append(out, "cgroup "+g)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), "/"+opts.CgroupParent+"/") {
			out = append(out, "process "+filepath.Base(filepath.Dir(p)))
		}
	}
	return out
}

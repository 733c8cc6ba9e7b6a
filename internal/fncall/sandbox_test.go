package fncall

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/container"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestConformance: fncall sandboxes (backend "fncall" on Create) pass the
// suite every backend passes. The harness drains the pools before it
// counts the node's resources: their spare environments are a cache, and
// what must come back to the baseline is everything else.
func TestConformance(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	copts := container.Options{
		StateDir:      filepath.Join(dir, "state"),
		RunDir:        filepath.Join(dir, "run"),
		CgroupParent:  fmt.Sprintf("warren-test-fnsb%d", os.Getpid()),
		NetworkSubnet: testutil.Subnet(t),
	}
	records := filepath.Join(dir, "state", "fncall")
	var (
		mu       sync.Mutex
		services []*Service
		ctrs     []*container.Backend
	)
	t.Cleanup(func() {
		for _, s := range services {
			_ = s.Close()
		}
		if b, err := container.New(copts); err == nil {
			_ = b.Sweep(context.Background(), nil)
			_ = b.Close()
		}
		for _, c := range ctrs {
			_ = c.Close()
		}
		_ = cgroups.RemoveParent(copts.CgroupParent)
	})
	newBackend := func(t *testing.T) backend.Backend {
		c, err := container.New(copts)
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Options{Backend: c})
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.NewBackend(records, nil)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		services, ctrs = append(services, s), append(ctrs, c)
		mu.Unlock()
		return b
	}
	conformance.Run(t, conformance.Harness{
		New:    newBackend,
		Layers: func(t *testing.T) []backend.Layer { return backend.DirLayers(testutil.BusyboxRoot(t)) },
		Resources: func(t *testing.T) []string {
			mu.Lock()
			ss := append([]*Service(nil), services...)
			mu.Unlock()
			for _, s := range ss {
				s.Drain()
			}
			return nodeResources(t, copts, records)
		},
		Kill: func(t *testing.T, sb backend.Sandbox) {
			st := sb.(*sandbox).inner.State()
			var pid struct{ Pid int }
			if err := json.Unmarshal(st, &pid); err != nil || pid.Pid <= 0 {
				t.Fatalf("init pid of %s: %v", sb.ID(), err)
			}
			if err := unix.Kill(pid.Pid, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// nodeResources lists what sandboxes of the test can leave on the node:
// mounts, per-sandbox directories, cgroups, network leftovers, records.
func nodeResources(t *testing.T, o container.Options, records string) []string {
	var out []string
	data, _ := os.ReadFile("/proc/self/mountinfo")
	for _, m := range mountinfo.Parse(string(data)) {
		if strings.HasPrefix(m.Point, o.RunDir) || strings.HasPrefix(m.Point, o.StateDir) {
			out = append(out, "mount "+m.Point)
		}
	}
	for _, d := range []string{filepath.Join(o.RunDir, "sb"), filepath.Join(o.StateDir, "sandboxes"), filepath.Join(o.RunDir, "devfs"), records} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			out = append(out, "dir "+filepath.Join(d, e.Name()))
		}
	}
	groups, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", o.CgroupParent, "*"))
	for _, g := range groups {
		if st, err := os.Stat(g); err == nil && st.IsDir() {
			out = append(out, "cgroup "+g)
		}
	}
	if n, err := netpolicy.New(netpolicy.Options{Name: o.CgroupParent, Subnet: o.NetworkSubnet}); err == nil {
		links, ids, err := n.Leftovers()
		if err != nil {
			t.Errorf("network leftovers: %v", err)
		}
		for name, id := range links {
			out = append(out, "veth "+name+" "+id)
		}
		for _, id := range ids {
			out = append(out, "nft chains of "+id)
		}
		_ = n.Close()
	}
	return out
}

// TestSandboxTakenFromPool: a create of backend "fncall" takes an
// environment the pool made ahead of time (none is made during it), the
// pool makes the next in the background, and delete destroys the
// environment rather than returning it.
func TestSandboxTakenFromPool(t *testing.T) {
	s, img := newService(t, Options{})
	b, err := s.NewBackend(filepath.Join(t.TempDir(), "records"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	spec := func(id string) backend.Spec {
		return backend.Spec{ID: id, Layers: img.Layers, Hostname: id, MemoryBytes: 64 << 20, Etc: etcfiles.Files(id, etcfiles.None)}
	}
	first, err := b.Create(ctx, spec("first"))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Destroy(ctx)
	waitIdle := func() {
		for deadline := time.Now().Add(30 * time.Second); s.Stats().Idle == 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the pool made no spare environment")
			}
		}
	}
	waitIdle()
	ready := map[string]bool{}
	for _, id := range idleEnvs(s) {
		ready[id] = true
	}
	second, err := b.Create(ctx, spec("second"))
	if err != nil {
		t.Fatal(err)
	}
	if env := second.(*sandbox).inner.ID(); !ready[env] {
		t.Errorf("the create made environment %s instead of taking an idle one of %v", env, ready)
	}
	r := conformance.Exec(t, second, backend.ProcSpec{Argv: []string{"sh", "-c", "hostname; cat /etc/hostname"}}, "")
	if r.Stdout != "second\nsecond\n" {
		t.Errorf("hostname: %q", r.Stdout)
	}
	env := second.(*sandbox).inner.ID()
	if err := second.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range idleEnvs(s) {
		if id == env {
			t.Errorf("a deleted sandbox's environment %s went back to the pool", env)
		}
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pidOf(t, second)) + "/root/bin"); err == nil {
		t.Errorf("the deleted sandbox's init still runs")
	}
}

// idleEnvs are the ids of the service's idle environments.
func idleEnvs(s *Service) []string {
	var out []string
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pools {
		p.mu.Lock()
		for _, e := range p.idle {
			out = append(out, e.sb.ID())
		}
		p.mu.Unlock()
	}
	return out
}

func pidOf(t *testing.T, sb backend.Sandbox) int {
	var st struct{ Pid int }
	if err := json.Unmarshal(sb.(*sandbox).inner.State(), &st); err != nil {
		t.Fatal(err)
	}
	return st.Pid
}

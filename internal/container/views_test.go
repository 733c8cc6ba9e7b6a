package container

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/testutil"
)

// limitedSandbox starts a backend of its own (testOptions(t, prefix))
// and on it sandbox id, limited to 64 MiB and half a core, so that it has
// the cgroup and CPU views; both go when the test ends.
func limitedSandbox(t *testing.T, prefix, id string) (Options, backend.Sandbox) {
	t.Helper()
	opts := testOptions(t, prefix)
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	sb, err := b.Create(context.Background(), backend.Spec{ID: id, Layers: backend.DirLayers(testutil.BusyboxRoot(t)),
		MemoryBytes: 64 << 20, CPUMillis: 500})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return opts, sb
}

// TestCgroupView: a sandbox reads its own cgroup, read-only, at
// /sys/fs/cgroup (its memory limit and CPU quota, as JVMs, Go and Node
// read them) and nothing above it; the mounts are views of the host's
// cgroup superblocks, not new ones, and name no host path.
func TestCgroupView(t *testing.T) {
	opts, sb := limitedSandbox(t, "cgview-", "cgv")
	sh := func(script string) string {
		t.Helper()
		r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", script}}, "")
		return r.Stdout + r.Stderr
	}
	mem, quota := "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
	wantQuota := "50000\n"
	if cgroups.Mode() == "v2" {
		mem, quota, wantQuota = "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/cpu.max", "50000 100000\n"
	}
	if got := sh("cat " + mem + " " + quota); got != "67108864\n"+wantQuota {
		t.Errorf("limits read in the sandbox: %q", got)
	}
	if got := sh("(echo 1 > " + mem + ") 2>/dev/null || echo refused; cat " + mem); got != "refused\n67108864\n" {
		t.Errorf("writing its own limit: %q", got)
	}
	// Its group is the root of what it sees: no groups of other
	// sandboxes or the node below it.
	if got := sh("find /sys/fs/cgroup -mindepth 2 -type d | head -3"); got != "" {
		t.Errorf("directories below the sandbox's cgroup views: %q", got)
	}
	mi := sh("cat /proc/self/mountinfo")
	for _, p := range []string{opts.RunDir, opts.StateDir, opts.CgroupParent} {
		if strings.Contains(mi, p) {
			t.Errorf("the sandbox's mountinfo names %s:\n%s", p, mi)
		}
	}
	// The same superblocks as the host's hierarchies.
	hostDevs := map[uint64]bool{}
	for _, v := range cgroups.Views() {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(cgroups.Root, v.Dir), &st); err != nil {
			t.Fatal(err)
		}
		hostDevs[st.Dev] = true
	}
	root := "/proc/" + strconv.Itoa(initPid(t, sb)) + "/root"
	for _, v := range cgroups.Views() {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, "sys/fs/cgroup", v.Dir), &st); err != nil {
			t.Fatal(err)
		}
		if !hostDevs[st.Dev] {
			t.Errorf("the sandbox's /sys/fs/cgroup/%s is a new superblock (dev %d)", v.Dir, st.Dev)
		}
	}
}

// TestSysAndProcBindsReadOnly: every mount of /sys and below it (the
// node's sysfs, the masks, the cgroup view, the CPU view) and the masked
// and read-only /proc directories and the cpuinfo view are read-only,
// nosuid, nodev and noexec; the init makes the /sys tree so with one
// mount_setattr after binding it all, so a bind added below /sys without
// it shows here.
func TestSysAndProcBindsReadOnly(t *testing.T) {
	_, sb := limitedSandbox(t, "robinds-", "ro")
	text := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/proc/self/mountinfo"}}, "").Stdout
	procRO := map[string]bool{"/proc/acpi": true, "/proc/scsi": true, "/proc/bus": true, "/proc/fs": true,
		"/proc/irq": true, "/proc/sys": true, "/proc/cpuinfo": true}
	seen := 0
	for _, m := range mountinfo.Parse(text) {
		if m.Point != "/sys" && !strings.HasPrefix(m.Point, "/sys/") && !procRO[m.Point] {
			continue
		}
		seen++
		for _, want := range []string{"ro", "nosuid", "nodev", "noexec"} {
			if !slices.Contains(m.MountOptions, want) {
				t.Errorf("%s (%s) is mounted %v: not %s", m.Point, m.FSType, m.MountOptions, want)
			}
		}
	}
	// /sys, 4 masks below it, the skeleton and its hierarchies or v2's
	// one, the CPU view; 6 of /proc and cpuinfo (a kernel without
	// /proc/acpi or /proc/scsi has fewer).
	if seen < 12 {
		t.Errorf("%d mounts of /sys and the read-only /proc paths, want >= 12:\n%s", seen, text)
	}
	r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c",
		"for f in /sys/fs/cgroup/x /sys/firmware/x /sys/devices/system/cpu/online; do (echo 1 > $f) 2>/dev/null && echo wrote $f; done; true"}}, "")
	if r.Stdout != "" {
		t.Errorf("writes below /sys: %q", r.Stdout)
	}
}

// TestCPUSpread: sandboxes of one core each are put on different CPUs
// (the least used first), and a deleted sandbox's CPU is used again.
func TestCPUSpread(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("the node has one CPU")
	}
	opts := testOptions(t, "cpus-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	allowed := func(sb backend.Sandbox) string {
		t.Helper()
		buf, err := os.ReadFile("/proc/" + strconv.Itoa(initPid(t, sb)) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(buf), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatal("no Cpus_allowed_list")
		return ""
	}
	mk := func(id string) backend.Sandbox {
		sb, err := b.Create(context.Background(), backend.Spec{ID: id, Layers: backend.DirLayers(testutil.BusyboxRoot(t)), CPUMillis: 1000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		return sb
	}
	a, c := mk("spa"), mk("spc")
	ca, cc := allowed(a), allowed(c)
	if ca == cc || strings.ContainsAny(ca, ",-") || strings.ContainsAny(cc, ",-") {
		t.Fatalf("two one-core sandboxes on CPUs %q and %q, want one different CPU each", ca, cc)
	}
	if err := a.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if runtime.NumCPU() == 2 {
		if got := allowed(mk("spd")); got != ca {
			t.Errorf("after deleting the sandbox on CPU %s, a new one went to %s", ca, got)
		}
	}
}

func TestCPUInfoFor(t *testing.T) {
	host := []byte("processor\t: 0\nvendor_id\t: X\ncore id\t\t: 0\ncpu cores\t: 4\nsiblings\t: 4\n\nprocessor\t: 1\nvendor_id\t: X\ncore id\t\t: 1\ncpu cores\t: 4\nsiblings\t: 4\n\nprocessor\t: 2\nvendor_id\t: X\ncore id\t\t: 2\ncpu cores\t: 4\nsiblings\t: 4\n\n")
	got := string(cpuinfoFor(host, 2))
	want := "processor\t: 0\nvendor_id\t: X\ncore id\t\t: 0\ncpu cores\t: 2\nsiblings\t: 2\n\nprocessor\t: 1\nvendor_id\t: X\ncore id\t\t: 1\ncpu cores\t: 2\nsiblings\t: 2\n\n"
	if got != want {
		t.Errorf("cpuinfoFor:\n%q\nwant\n%q", got, want)
	}
	// A format it does not know is kept whole.
	odd := []byte("Processor\t: ARM\nprocessor\t: 0\nprocessor\t: 1\n")
	if got := cpuinfoFor(odd, 1); string(got) != string(odd) {
		t.Errorf("unknown format changed: %q", got)
	}
}

// TestDevShmCharged: what a sandbox puts in /dev/shm (POSIX shared memory,
// multiprocessing's semaphores) is charged to its memory cgroup and so
// bounded by its memory limit: filling it fails inside that sandbox and
// leaves the node's shared devfs usable by the others.
func TestDevShmCharged(t *testing.T) {
	opts := testOptions(t, "shm-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mk := func(id string) backend.Sandbox {
		sb, err := b.Create(context.Background(), backend.Spec{ID: id, Layers: backend.DirLayers(testutil.BusyboxRoot(t)), MemoryBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		return sb
	}
	a, c := mk("shma"), mk("shmc")
	used := func() int64 {
		t.Helper()
		st, err := a.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return int64(st.MemoryBytes)
	}
	before := used()
	r := conformance.Exec(t, a, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", "dd if=/dev/zero of=/dev/shm/x bs=1M count=32 2>/dev/null; ls -s /dev/shm/x"}}, "")
	if grew := used() - before; grew < 30<<20 {
		t.Errorf("32 MiB in /dev/shm charged %d bytes to the sandbox (%+v)", grew, r)
	}
	// Past the limit: the sandbox's own writer fails or is killed.
	r, _ = conformance.TryExec(a, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", "dd if=/dev/zero of=/dev/shm/y bs=1M count=256 2>&1; echo rc=$?"}}, "")
	if strings.Contains(r.Stdout, "rc=0") {
		t.Errorf("256 MiB into /dev/shm of a 64 MiB sandbox succeeded: %+v", r)
	}
	if r := conformance.Exec(t, c, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", "dd if=/dev/zero of=/dev/shm/z bs=1M count=16 2>/dev/null && echo ok"}}, ""); r.Stdout != "ok\n" {
		t.Errorf("another sandbox's /dev/shm after one filled its own: %+v", r)
	}
}

// TestDirPool: creates take ready-made state directories from the pool
// (which the filler tops up), a sandbox made from one gets its /etc
// files like any other, and what a crash leaves in the pool (a half-made
// entry, an entry with something in it) is removed at the next start.
func TestDirPool(t *testing.T) {
	opts := testOptions(t, "pool-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(opts.StateDir, "pool")
	entries := func() int {
		ents, _ := os.ReadDir(pool)
		return len(ents)
	}
	waitN := func(n int) {
		t.Helper()
		for range 500 {
			if entries() == n {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("pool has %d entries, want %d", entries(), n)
	}
	waitN(poolSize)
	sb, err := b.Create(context.Background(), backend.Spec{ID: "pooled", Layers: backend.DirLayers(testutil.BusyboxRoot(t)),
		Etc: etcfiles.Files("pooled", etcfiles.None)})
	if err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/etc/hostname"}}, ""); r.Stdout != "pooled\n" {
		t.Errorf("/etc/hostname of a sandbox from the pool: %+v", r)
	}
	// keep_etc from the pool: no etc of Warren's in its upper directory.
	keep, err := b.Create(context.Background(), backend.Spec{ID: "pooled2", Layers: backend.DirLayers(testutil.BusyboxRoot(t))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(opts.StateDir, "sandboxes", "pooled2", "upper", "etc")); !os.IsNotExist(err) {
		t.Errorf("a sandbox without /etc files kept the pool's etc: %v", err)
	}
	waitN(poolSize)
	for _, s := range []backend.Sandbox{sb, keep} {
		if err := s.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// What a crash can leave: a half-made entry and a spoiled one.
	if err := os.MkdirAll(filepath.Join(pool, "tmp-999", "upper"), 0o755); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(pool)
	spoiled := filepath.Join(pool, ents[0].Name(), "upper", "etc", "hosts")
	if err := os.WriteFile(spoiled, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if _, err := os.Stat(filepath.Join(pool, "tmp-999")); !os.IsNotExist(err) {
		t.Errorf("half-made pool entry kept: %v", err)
	}
	if _, err := os.Stat(spoiled); !os.IsNotExist(err) {
		t.Errorf("spoiled pool entry kept: %v", err)
	}
	waitN(poolSize)
}

package container

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/testutil"
)

// testOptions gives a test its own directories and cgroup parent, and
// removes every sandbox, the shared sysfs and the cgroups when it ends.
func testOptions(t *testing.T, name string) Options {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	opts := Options{
		StateDir:     filepath.Join(dir, "state"),
		RunDir:       filepath.Join(dir, "run"),
		CgroupParent: fmt.Sprintf("warren-test-%s%d", name, os.Getpid()),
		// Its own: tests of other packages may run at the same time.
		NetworkSubnet: testutil.Subnet(t),
	}
	t.Cleanup(func() {
		// Fillers of backends the test never closed, before the
		// directory goes (this cleanup runs before TempDir's).
		livePools.Range(func(k, _ any) bool {
			if p := k.(*dirPool); strings.HasPrefix(p.dir, dir) {
				p.close()
			}
			return true
		})
	})
	t.Cleanup(func() {
		if b, err := New(opts); err == nil {
			_ = b.Sweep(t.Context(), nil)
			_ = b.Close()
		}
		_ = cgroups.RemoveParent(opts.CgroupParent)
	})
	return opts
}

func TestConformance(t *testing.T) {
	opts := testOptions(t, "")
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T) backend.Backend {
			b, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Layers: func(t *testing.T) []backend.Layer { return backend.DirLayers(testutil.BusyboxRoot(t)) },
		Resources: func(t *testing.T) []string {
			return resources(t, opts)
		},
		Kill: func(t *testing.T, sb backend.Sandbox) {
			if err := unix.Kill(initPid(t, sb), unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// resources lists what sandboxes of this test can leave on the host:
// mounts under its directories, per-sandbox directories, cgroups under its
// parent, and processes in those cgroups.
func resources(t *testing.T, opts Options) []string {
	var out []string
	for _, m := range mountPoints(t) {
		if strings.HasPrefix(m, opts.RunDir) || strings.HasPrefix(m, opts.StateDir) {
			out = append(out, "mount "+m)
		}
	}
	for _, d := range []string{filepath.Join(opts.RunDir, "sb"), filepath.Join(opts.StateDir, "sandboxes"), filepath.Join(opts.StateDir, "trash"), filepath.Join(opts.RunDir, "devfs")} {
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
	out = append(out, conformance.NetworkResources(t, netpolicy.Options{Name: opts.CgroupParent, Subnet: opts.NetworkSubnet})...)
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

// TestDev: a sandbox's /dev holds working device nodes, a pty
// multiplexer and a private /dev/shm, refuses new device nodes, and lives
// in the sandbox's own directory on the node's one shared devfs tmpfs,
// which shows no usage, is reused across restarts, and is unmounted by
// Close once no sandbox is left on it.
func TestDev(t *testing.T) {
	opts := testOptions(t, "dev-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	devfs := filepath.Join(opts.RunDir, "devfs")
	countMounts := func() int {
		n := 0
		for _, m := range mountPoints(t) {
			if m == devfs {
				n++
			}
		}
		return n
	}
	a, _ := runningSandbox(t, b, "deva")
	c, _ := runningSandbox(t, b, "devc")
	r := conformance.Exec(t, a, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", `
set -e
echo x > /dev/null
test "$(head -c 3 /dev/zero | od -An -tx1 | tr -d ' ')" = 000000
test "$(head -c 16 /dev/urandom | wc -c)" -eq 16
if echo x > /dev/full 2>/dev/null; then echo "full accepted a write"; fi
test -c /dev/tty -a -c /dev/random -a -L /dev/ptmx -a -L /dev/fd -a -L /dev/stdin
exec 3<>/dev/ptmx
ls /dev/pts
echo secret > /dev/shm/a
if mknod /dev/sda b 8 0 2>/dev/null; then echo "mknod allowed"; fi
stat -f -c 'blocks=%b files=%c' /dev
stat -c '%a' /dev /dev/shm
`}}, "")
	if r.Status.Code != 0 || r.Stdout != "0\nptmx\nblocks=0 files=0\n755\n1777\n" {
		t.Errorf("/dev in a sandbox: %+v", r)
	}
	if r := conformance.Exec(t, c, backend.ProcSpec{Argv: []string{"ls", "-A", "/dev/shm"}}, ""); r.Stdout != "" {
		t.Errorf("another sandbox's /dev/shm shows %q", r.Stdout)
	}
	if n := countMounts(); n != 1 {
		t.Fatalf("%d mounts at %s, want 1", n, devfs)
	}
	if _, err := os.Stat(filepath.Join(devfs, "deva", "shm", "a")); err != nil {
		t.Errorf("the sandbox's /dev is not its directory on the shared devfs: %v", err)
	}
	// A restart keeps the mount; Close leaves it while sandboxes use it.
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Close(); err != nil {
		t.Fatal(err)
	}
	if n := countMounts(); n != 1 {
		t.Fatalf("after a restart and a Close with live sandboxes: %d mounts at %s, want 1", n, devfs)
	}
	for _, sb := range []backend.Sandbox{a, c} {
		if err := sb.Destroy(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(devfs); len(ents) != 0 {
		t.Errorf("left on the shared devfs after delete: %v", ents)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if n := countMounts(); n != 0 {
		t.Errorf("after the last Close: %d mounts at %s, want 0", n, devfs)
	}
}

// TestSharedSysfs: one sysfs mount serves every sandbox, survives a
// backend restart, is remounted if someone unmounts it, and goes with
// Close; it never shows the host's network devices.
func TestSharedSysfs(t *testing.T) {
	opts := testOptions(t, "sysfs-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	sysfs := filepath.Join(opts.RunDir, "sysfs")
	countMounts := func() int {
		n := 0
		for _, m := range mountPoints(t) {
			if m == sysfs {
				n++
			}
		}
		return n
	}
	if n := countMounts(); n != 1 {
		t.Fatalf("%d mounts at %s, want 1", n, sysfs)
	}
	if ents, _ := os.ReadDir(filepath.Join(sysfs, "class/net")); len(ents) > 1 || len(ents) == 1 && ents[0].Name() != "lo" {
		t.Errorf("shared sysfs shows network devices: %v", ents)
	}
	// A second backend (a daemon restart) keeps the same mount.
	if _, err := New(opts); err != nil {
		t.Fatal(err)
	}
	if n := countMounts(); n != 1 {
		t.Fatalf("after a restart: %d mounts at %s, want 1", n, sysfs)
	}
	// Unmounted behind our back: the next create mounts it again and the
	// sandbox sees a full /sys.
	if err := unix.Unmount(sysfs, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	sb, _ := runningSandbox(t, b, "sysfs1")
	if n := countMounts(); n != 1 {
		t.Errorf("after a create: %d mounts at %s, want 1", n, sysfs)
	}
	r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", "cat /sys/devices/system/cpu/online; grep ' /sys ' /proc/self/mountinfo"}}, "")
	if !strings.Contains(r.Stdout, "0") || !strings.Contains(r.Stdout, " ro,") {
		t.Errorf("sandbox /sys: %+v", r)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// A sandbox is left: the mount stays for the next daemon (CRIU
	// finds the sandbox's bind by the node's mount of that superblock).
	if n := countMounts(); n != 1 {
		t.Errorf("after Close with a sandbox left: %d mounts at %s, want 1", n, sysfs)
	}
	// The sandbox keeps its own bind.
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/sys/devices/system/cpu/online"}}, ""); r.Stdout == "" {
		t.Errorf("sandbox lost /sys after Close: %+v", r)
	}
	// Once no sandbox is left, a daemon's Close unmounts it.
	if err := sb.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Close(); err != nil {
		t.Fatal(err)
	}
	if n := countMounts(); n != 0 {
		t.Errorf("after the last sandbox and Close: %d mounts at %s, want 0", n, sysfs)
	}
}

func mountPoints(t *testing.T) []string {
	t.Helper()
	mounts, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		out = append(out, m.Point)
	}
	return out
}

// TestStandaloneAgent: PID 1 is the small agent from the memfd.
func TestStandaloneAgent(t *testing.T) {
	opts := testOptions(t, "standalone-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	sb, pid := runningSandbox(t, b, "standalone1")
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	// It runs from the node's agent tmpfs, bound into the sandbox
	// (agentfs.go): nothing maps the memfd it was exec'd from.
	if !strings.Contains(string(maps), agentExeSandboxPath) || strings.Contains(string(maps), "memfd:") {
		t.Errorf("PID 1 is not the standalone agent run from %s:\n%s", agentExeSandboxPath, maps)
	}
	// The sandbox's cgroup namespace is rooted at its own groups (the
	// shared devices group on hybrid hosts too).
	r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/proc/self/cgroup"}}, "")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	want := []string{"0::/"}
	if cgroups.Mode() != "v2" {
		want = []string{"memory:/", "cpu:/", "pids:/"}
		if cgroups.Mode() == "hybrid" {
			want = append(want, "0::/", "devices:/")
		}
	}
	for _, w := range want {
		if !slices.ContainsFunc(lines, func(l string) bool {
			_, rest, _ := strings.Cut(l, ":")
			ctl, path, _ := strings.Cut(rest, ":")
			wctl, wpath, _ := strings.Cut(w, ":")
			if w == "0::/" {
				return l == w
			}
			return path == wpath && slices.Contains(strings.Split(ctl, ","), wctl)
		}) {
			t.Errorf("/proc/self/cgroup in a sandbox has no %q line:\n%s", w, r.Stdout)
		}
	}
	// Seen from the host, PID 1 is in the sandbox's groups.
	host, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	own := "/" + opts.CgroupParent + "/standalone1"
	for _, w := range map[string][]string{
		"v2":     {"0::" + own},
		"hybrid": {":memory:" + own, ":pids:" + own, "0::" + own, ":devices:/" + opts.CgroupParent + "\n"},
		"v1":     {":memory:" + own, ":pids:" + own, ":devices:" + own, ":freezer:" + own},
	}[cgroups.Mode()] {
		if !strings.Contains(string(host)+"\n", w) {
			t.Errorf("sandbox PID 1 on the host: no %q in\n%s", w, host)
		}
	}
}

// TestAgentFromFile: where the kernel refuses executable memfds
// (vm.memfd_noexec=2, in a pid namespace of the test's own) the backend
// says so and sandboxes exec the agent from its verified copy in the
// state directory, and work the same; Adopt after a restart too.
func TestAgentFromFile(t *testing.T) {
	if !testutil.RunWithNoexecMemfd(t) {
		return
	}
	opts := testOptions(t, "file-")
	var warned []string
	opts.Warn = func(msg string, args ...any) { warned = append(warned, fmt.Sprint(append([]any{msg}, args...)...)) }
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	agentDir := filepath.Join(opts.StateDir, "agent")
	if !slices.ContainsFunc(warned, func(w string) bool { return strings.Contains(w, agentDir) }) {
		t.Errorf("no warning names %s: %q", agentDir, warned)
	}
	sb, pid := runningSandbox(t, b, "file1")
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Exec'd from that copy, it then moves onto the sandbox's view of
	// the node's agent tmpfs, as from a memfd (agentfs.go).
	if exe != agentExeSandboxPath {
		t.Errorf("PID 1 runs %s, want %s", exe, agentExeSandboxPath)
	}
	r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/proc/1/cmdline"}}, "")
	if r.Stdout != "warren-init\x00" {
		t.Errorf("/proc/1/cmdline in the sandbox: %q", r.Stdout)
	}
	// A second daemon on the same directories adopts it.
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	sb2, err := b2.Adopt(t.Context(), "file1", sb.State())
	if err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb2, backend.ProcSpec{Argv: []string{"echo", "adopted"}}, ""); r.Stdout != "adopted\n" {
		t.Errorf("exec after adopt: %+v", r)
	}
}

// TestMountinfoNamesNoHostPath: a sandbox's mountinfo names none of the
// node's directories (state, run, the image layer): the overlay names its
// directories by descriptor and every bind's source is a filesystem's
// root, a /proc entry, in the sandbox's own /dev, or a view file.
func TestMountinfoNamesNoHostPath(t *testing.T) {
	opts := testOptions(t, "mi-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	id := "mi"
	sb, _ := runningSandbox(t, b, id)
	text := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/proc/self/mountinfo"}}, "").Stdout
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		for _, p := range []string{filepath.Dir(opts.StateDir), testutil.BusyboxRoot(t), "/layers/", "/empty", "/upper"} {
			if strings.Contains(line, p) {
				t.Errorf("mountinfo line names %s: %s", p, line)
			}
		}
	}
	ms := mountinfo.Parse(text)
	if len(ms) < 10 {
		t.Fatalf("not a sandbox's mountinfo:\n%s", text)
	}
	for _, m := range ms {
		// The node's views tmpfs (views.go) names its files for what
		// they are: the cgroup skeleton and the CPU view files.
		view := m.FSType == "tmpfs" && (m.Root == "/cgroup" || strings.HasPrefix(m.Root, "/cpu/"))
		// The agent's file (agentfs.go) is named for its content.
		view = view || m.FSType == "tmpfs" && m.Point == agentExeSandboxPath && strings.HasPrefix(m.Root, "/warren-agent-")
		if m.Root != "/" && m.FSType != "proc" && !strings.HasPrefix(m.Root+"/", "/"+id+"/") && !view {
			t.Errorf("%s shows its source as %s (%s)", m.Point, m.Root, m.FSType)
		}
	}
}

// TestTooManyLayers: more layers than the init stage names in a page of
// mount data are refused before anything starts.
func TestTooManyLayers(t *testing.T) {
	b, err := New(testOptions(t, "layers-"))
	if err != nil {
		t.Fatal(err)
	}
	layers := make([]string, maxOverlayLayers+1)
	for i := range layers {
		layers[i] = testutil.BusyboxRoot(t)
	}
	_, err = b.Create(t.Context(), backend.Spec{ID: "many", Layers: backend.DirLayers(layers...)})
	if errdefs.CategoryOf(err) != errdefs.Invalid || !strings.Contains(err.Error(), "too many image layers") {
		t.Fatalf("create with %d layers: %v", len(layers), err)
	}
}

// TestNoInheritedFDs: an fd the daemon inherited without close-on-exec does
// not reach PID 1 of a sandbox, which holds only its own.
func TestNoInheritedFDs(t *testing.T) {
	opts := testOptions(t, "fds-")
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil { // no O_CLOEXEC, like an inherited fd
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// An answered exec means the agent's loop (and its fds) is set up.
	_, pid := runningSandbox(t, b, "fds1")
	// stdin/out/err (/dev/null), the signalfd, the listening socket, the
	// epoll set; the exec's connection goes once the agent has seen the
	// client close it.
	var ents []os.DirEntry
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if ents, err = os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err != nil {
			t.Fatal(err)
		}
		if len(ents) == 6 || time.Now().After(deadline) {
			break
		}
	}
	if len(ents) != 6 {
		var names []string
		for _, e := range ents {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
			names = append(names, e.Name()+" -> "+l)
		}
		t.Errorf("sandbox PID 1 holds %d fds, want 6: %v", len(ents), names)
	}
}

// TestSmallFDTable: PID 1 of a sandbox gets an fd table sized for its own
// few fds, not the daemon's, which holds one pidfd per sandbox: without
// the unshare in the init stage, a daemon with fds above 4,096 gave every
// new sandbox a 32 KiB fd array of kernel memory.
func TestSmallFDTable(t *testing.T) {
	opts := testOptions(t, "fdsize-")
	// Like a daemon with thousands of sandboxes: a high fd, close-on-exec.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 5000 {
		t.Skipf("RLIMIT_NOFILE %d: need 5000 fds", lim.Cur)
	}
	fd, err := unix.FcntlInt(0, unix.F_DUPFD_CLOEXEC, 4500)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	_, pid := runningSandbox(t, b, "fdsize1")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "FDSize:"); ok {
			if n, _ := strconv.Atoi(strings.TrimSpace(v)); n == 0 || n > 64 {
				t.Errorf("sandbox PID 1 has an fd table of %d slots, want <= 64 (the daemon's reaches fd %d)", n, fd)
			}
			return
		}
	}
	t.Fatal("no FDSize in /proc/PID/status")
}

// runningSandbox creates sandbox id on b, waits until its agent has
// answered an exec, and returns it with the host pid of its PID 1. It is
// destroyed when the test ends.
func runningSandbox(t *testing.T, b *Backend, id string) (backend.Sandbox, int) {
	t.Helper()
	sb, err := b.Create(t.Context(), backend.Spec{ID: id, Layers: backend.DirLayers(testutil.BusyboxRoot(t)), MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"echo", "ok"}}, ""); r.Stdout != "ok\n" {
		t.Fatalf("exec: %+v", r)
	}
	return sb, initPid(t, sb)
}

// initPid is the host pid of sb's PID 1, from its backend state.
func initPid(t *testing.T, sb backend.Sandbox) int {
	t.Helper()
	var st state
	if err := json.Unmarshal(sb.State(), &st); err != nil {
		t.Fatal(err)
	}
	return st.Pid
}

// TestAuditSandboxByLoginUID: a sandbox's processes carry its init's host
// pid as audit login uid, and AuditSandbox maps that back to the sandbox
// while it lives, and to nothing once it is gone.
func TestAuditSandboxByLoginUID(t *testing.T) {
	if !hasLoginUID() {
		t.Skip("this kernel has no /proc/self/loginuid (CONFIG_AUDIT off)")
	}
	b, err := New(testOptions(t, "auid-"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sb, err := b.Create(context.Background(), backend.Spec{ID: "auid", Layers: backend.DirLayers(testutil.BusyboxRoot(t))})
	if err != nil {
		t.Fatal(err)
	}
	pid := initPid(t, sb)
	r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/proc/self/loginuid"}}, "")
	if got := strings.TrimSpace(string(r.Stdout)); got != strconv.Itoa(pid) {
		t.Errorf("loginuid of a sandbox process = %q, want the init's pid %d", got, pid)
	}
	if id, ok := b.AuditSandbox(uint32(pid)); !ok || id != "auid" {
		t.Errorf("AuditSandbox(%d) = %q, %v; want auid", pid, id, ok)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if id, ok := b.AuditSandbox(uint32(pid)); ok {
		t.Errorf("AuditSandbox(%d) after destroy = %q", pid, id)
	}
}

// TestCreateRefusedNearTheFileLimit: a create that would leave the daemon
// fewer than fdReserve descriptors under its open-file limit is refused
// Exhausted, naming the limit, before anything is made (past the limit
// every call of the daemon, deletes included, would fail with "too many
// open files"); a sandbox holds one descriptor while it lives, and
// deleting it makes room again.
//
// Only sandboxes watched through a pidfd hold one: those of hosts without
// a cgroup2 directory per sandbox (pure v1), whose path this test takes.
func TestCreateRefusedNearTheFileLimit(t *testing.T) {
	watchByGroup = false
	defer func() { watchByGroup = true }()
	opts := testOptions(t, "fdl-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// Room for one sandbox beside whatever else this process holds.
	lim := old
	lim.Cur = uint64(b.mon.count()) + fdReserve + 1
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
	spec := func(id string) backend.Spec {
		return backend.Spec{ID: id, Layers: backend.DirLayers(testutil.BusyboxRoot(t)), MemoryBytes: 64 << 20}
	}
	sb, err := b.Create(t.Context(), spec("fd1"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Create(t.Context(), spec("fd2"))
	if errdefs.CategoryOf(err) != errdefs.Exhausted || !strings.Contains(err.Error(), "open-file limit") {
		t.Fatalf("a create past the descriptor room: %v, want exhausted naming the open-file limit", err)
	}
	if err := sb.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	sb2, err := b.Create(t.Context(), spec("fd2"))
	if err != nil {
		t.Fatalf("a create once the first sandbox was deleted: %v", err)
	}
	if err := sb2.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestLiveSandboxesHoldNoDescriptor: a live sandbox whose group has a
// cgroup2 directory holds none of the daemon's descriptors, created or
// adopted by a restarted daemon, and its exit is still seen. Each one the
// daemon holds made every later create slower (the fork copies the file
// table, the exec closes the copy: 66 creates/s at 10,000 sandboxes,
// docs/BENCHMARKS.md); with a pidfd per sandbox this fails.
func TestLiveSandboxesHoldNoDescriptor(t *testing.T) {
	opts := testOptions(t, "nofd-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 6
	before := openFDs(t)
	var sbs []backend.Sandbox
	for i := range n {
		sb, err := b.Create(t.Context(), backend.Spec{ID: fmt.Sprintf("nofd%d", i), Layers: backend.DirLayers(testutil.BusyboxRoot(t)), MemoryBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	if cgroups.EventsFile(sbs[0].(*sandbox).grp) == "" {
		t.Skip("no cgroup2 directory per sandbox on this host (pure cgroup v1): a pidfd each")
	}
	// A few may be the runtime's or the pools' (a netns taken, a pipe).
	if after := openFDs(t); after-before >= n {
		t.Fatalf("%d live sandboxes: the daemon went from %d to %d descriptors, want fewer than %d more", n, before, after, n)
	}
	// A daemon restart adopts them, still without a descriptor each.
	blobs := make([][]byte, n)
	for i, sb := range sbs {
		blobs[i] = sb.State()
	}
	before = openFDs(t)
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	var adopted []backend.Sandbox
	for i := range n {
		sb, err := b2.Adopt(t.Context(), fmt.Sprintf("nofd%d", i), blobs[i])
		if err != nil {
			t.Fatal(err)
		}
		adopted = append(adopted, sb)
	}
	if after := openFDs(t); after-before >= n+8 { // b2's own: epoll, inotify, ...
		t.Fatalf("a second backend adopting %d sandboxes: %d to %d descriptors", n, before, after)
	}
	// Their exits are seen by both: the init killed from outside.
	pid := sbs[0].(*sandbox).st.Pid
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []backend.Sandbox{sbs[0], adopted[0]} {
		select {
		case <-sb.Exited().Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the init's exit was not seen")
		}
	}
	if _, err := unix.Wait4(pid, nil, unix.WNOHANG, nil); err != unix.ECHILD {
		t.Errorf("the killed init %d: wait4 err %v, want ECHILD (reaped)", pid, err)
	}
	for _, sb := range adopted {
		if err := sb.Destroy(t.Context()); err != nil {
			t.Error(err)
		}
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

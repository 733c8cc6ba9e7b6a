package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/testutil"
)

// imageName is the busybox image every daemon of these tests imports.
const imageName = "bb"

var envSeq atomic.Int64

// env is one daemon under test with its private directories and cgroup
// parent. The daemon can be stopped, killed and restarted on the same
// directories.
type env struct {
	t        *testing.T
	bin      string
	root     string // everything of this env lives below it
	stateDir string
	runDir   string
	sock     string
	parent   string // cgroup parent
	logPath  string
	extra    []string   // extra flags of `warren serve`
	files    []*os.File // fds the daemon inherits from 3 on
	environ  []string   // added to the daemon's environment
	netns    *os.File   // the daemon's network namespace (nil: the test's)

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	c       *client.Client

	// baseline is what the node held before the first sandbox.
	baseline []resource

	// subnet is the daemon's sandbox subnet (its own: envs run at once),
	// and net reads what of its networking is on the node.
	subnet netip.Prefix
	net    *netpolicy.Node
}

// withUffdDefault: o's flags of warren serve, with
// --unprivileged-userfaultfd=false unless o keeps the default or names
// the flag itself.
func withUffdDefault(o envOptions) []string {
	args := slices.Clone(o.serveArgs)
	if o.nodeUffd || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--unprivileged-userfaultfd") }) {
		return args
	}
	return append(args, "--unprivileged-userfaultfd=false")
}

type envOptions struct {
	// serveArgs are added to `warren serve`.
	serveArgs []string
	// nodeUffd leaves `warren serve` its default of setting the node's
	// vm.unprivileged_userfaultfd=1 at start. Other daemons of the suite
	// run with --unprivileged-userfaultfd=false: tests that hold the
	// setting (holdUffdKnob) must see it as they set it.
	nodeUffd bool
	// beforeStart runs once the directories are chosen and before the
	// daemon first starts (e.g. to mount a small tmpfs on stateDir).
	beforeStart func(e *env)
	// inherit are open files the daemon inherits (fd 3, 4, ...), as from a
	// careless parent.
	inherit []*os.File
	// bin is the daemon binary (default: the static build of ./cmd/warren).
	bin string
	// environ is added to the daemon's environment ("K=V"), which is
	// otherwise the test's.
	environ []string
	// netns, when set, is the network namespace the daemon runs in (a
	// test host's, entered with nsenter).
	netns *os.File
	// noImport skips importing the busybox image (a node of a shared
	// image store another node imported it into).
	noImport bool
}

// newEnv starts a daemon with private directories and a unique cgroup
// parent, imports the busybox image and records the node's baseline. At
// the end of the test every sandbox is deleted, the daemon stopped, the
// node checked against the baseline and then swept by force.
func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	testutil.RequireRoot(t)
	bin := o.bin
	if bin == "" {
		bin = testutil.StaticBinary(t, "./cmd/warren")
	}
	// Short paths: agent sockets live below the run dir and unix socket
	// paths are limited to 108 bytes.
	root, err := os.MkdirTemp("", "we2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	e := &env{
		t:        t,
		bin:      bin,
		root:     root,
		stateDir: filepath.Join(root, "state"),
		runDir:   filepath.Join(root, "run"),
		sock:     filepath.Join(root, "warren.sock"),
		parent:   fmt.Sprintf("warren-e2e-%d-%d", os.Getpid(), envSeq.Add(1)),
		logPath:  filepath.Join(root, "daemon.log"),
		extra:    withUffdDefault(o),
		files:    o.inherit,
		environ:  o.environ,
		netns:    o.netns,
	}
	e.subnet = testutil.Subnet(t)
	if e.net, err = netpolicy.New(netpolicy.Options{Name: e.parent, Subnet: e.subnet}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.forceClean) // runs last
	if o.beforeStart != nil {
		o.beforeStart(e)
	}
	e.start()
	t.Cleanup(e.cleanup)
	if !o.noImport {
		ctx := ctxFor(t, 60*time.Second)
		if _, err := e.c.ImportImage(ctx, imageName, testutil.BusyboxRoot(t)); err != nil {
			t.Fatalf("import busybox image: %v", err)
		}
	}
	e.baseline = e.resources()
	return e
}

// ctxFor returns a context that ends after d or with the test.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) addr() string { return "unix://" + e.sock }

// start starts the daemon and waits until it answers.
func (e *env) start() {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd != nil {
		select {
		case <-e.exited:
		default:
			e.t.Fatal("daemon already running")
		}
	}
	args := append([]string{"serve",
		"--state-dir", e.stateDir, "--run-dir", e.runDir, "--socket", e.sock,
		"--cgroup-parent", e.parent, "--log-level", "debug", "--network-subnet", e.subnet.String()}, e.extra...)
	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.t.Fatal(err)
	}
	fmt.Fprintf(logf, "=== e2e: starting daemon at %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(e.bin, args...)
	cmd.ExtraFiles = e.files
	if e.netns != nil {
		// nsenter enters the namespace (its fd follows the daemon's
		// inherited ones) and execs the daemon there.
		fd := 3 + len(e.files)
		cmd = exec.Command("nsenter", append([]string{fmt.Sprintf("--net=/proc/self/fd/%d", fd), "--", e.bin}, args...)...)
		cmd.ExtraFiles = append(slices.Clone(e.files), e.netns)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(e.environ) > 0 {
		cmd.Env = append(os.Environ(), e.environ...)
	}
	// The daemon must not outlive a test binary that dies; its sandboxes
	// do by design and are swept by forceClean.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		e.t.Fatalf("start daemon: %v", err)
	}
	logf.Close()
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		e.mu.Lock()
		e.waitErr = err
		e.mu.Unlock()
		close(exited)
	}()
	e.cmd, e.exited = cmd, exited
	if e.c != nil {
		e.c.Close()
	}
	c, err := client.New(e.addr(), client.WithToken(""))
	if err != nil {
		e.t.Fatal(err)
	}
	e.c = c
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			e.t.Fatalf("daemon exited during start-up:\n%s", e.logTail(40))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.Version(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("daemon not ready after 30s: %v\n%s", err, e.logTail(40))
		}
		time.Sleep(30 * time.Millisecond)
	}
}

func (e *env) running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd == nil {
		return false
	}
	select {
	case <-e.exited:
		return false
	default:
		return true
	}
}

// kill9 kills the daemon with SIGKILL and waits for it to be gone.
func (e *env) kill9() {
	e.t.Helper()
	e.mu.Lock()
	cmd, exited := e.cmd, e.exited
	e.mu.Unlock()
	if cmd == nil {
		e.t.Fatal("no daemon to kill")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		e.t.Fatal("daemon did not die after SIGKILL")
	}
}

// stop shuts the daemon down with SIGTERM and reports whether it exited
// cleanly (status 0) in time.
func (e *env) stop() error {
	e.mu.Lock()
	cmd, exited := e.cmd, e.exited
	e.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		return errors.New("daemon did not stop within 30s of SIGTERM")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.waitErr != nil {
		return fmt.Errorf("daemon exited with %v after SIGTERM", e.waitErr)
	}
	return nil
}

// daemonFDs counts the daemon process's open file descriptors.
func (e *env) daemonFDs() int {
	e.mu.Lock()
	pid := e.cmd.Process.Pid
	e.mu.Unlock()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		e.t.Fatal(err)
	}
	return len(ents)
}

// goroutines reads go_goroutines of the daemon from /metrics.
func (e *env) goroutines(t *testing.T) int {
	t.Helper()
	m, _ := e.scrape(t)
	v, ok := m.get("go_goroutines")
	if !ok {
		t.Fatal("no go_goroutines in /metrics")
	}
	return int(v)
}

// logTail returns the last n lines of the daemon log.
func (e *env) logTail(n int) string {
	b, _ := os.ReadFile(e.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cleanup deletes every sandbox, stops the daemon and checks the node is
// back at its baseline.
func (e *env) cleanup() {
	t := e.t
	if !e.running() {
		// A test that killed the daemon and failed before restarting it:
		// restart it so that it adopts and sweeps.
		e.start()
	}
	if e.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		sbs, err := e.c.List(ctx, nil)
		if err != nil {
			t.Errorf("cleanup: list sandboxes: %v", err)
		}
		var wg sync.WaitGroup
		for _, sb := range sbs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.c.Delete(ctx, sb.Id); err != nil && !client.IsNotFound(err) {
					t.Errorf("cleanup: delete %s: %v", sb.Id, err)
				}
			}()
		}
		wg.Wait()
		cancel()
		// A daemon that stops leaves what its reaper had not yet removed
		// in the trash for the next start (tested on its own); a test's
		// last daemon has no next start, so wait for the reaper here (a
		// writable layer with 19,000 files outlived a stop 8 ms after
		// its delete in CI).
		// The reaper runs at nice 19, so a CI machine whose cores are
		// busy with TCG guests starves it: a 20,000-level tree and the
		// entry behind it were still there after 60 s once. The bound is
		// for a reaper that is stuck, not for one that is slow.
		t0 := time.Now()
		if !e.trashDrained(4 * time.Minute) {
			t.Errorf("cleanup: trash still holds %v after 4m", e.trashEntries())
		} else if d := time.Since(t0); d > 10*time.Second {
			t.Logf("cleanup: the reaper took %v to empty the trash", d.Round(time.Second))
		}
		if err := e.stop(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	if e.c != nil {
		e.c.Close()
	}
	if e.baseline != nil {
		e.expectBaseline("after deleting every sandbox and stopping the daemon")
	}
	if t.Failed() || os.Getenv("WARREN_E2E_LOG") != "" {
		t.Logf("daemon log (tail):\n%s", e.logTail(80))
	}
}

// forceClean removes whatever is left, whatever the daemon did: processes
// in the test's cgroups, mounts below its root, the cgroups, the files.
func (e *env) forceClean() {
	if e.running() {
		e.kill9()
	}
	for range 100 {
		procs := e.procs()
		if len(procs) == 0 {
			break
		}
		for pid := range procs {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mounts := e.mounts()
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	for _, g := range e.cgroupParents() {
		// Children first.
		var dirs []string
		_ = filepath.WalkDir(g, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
	_ = e.net.Sweep(map[string]bool{})
	_ = e.net.RemoveUnused()
	_ = e.net.Close()
	_ = os.RemoveAll(e.root)
}

// resource is one thing a sandbox can hold on the node.
type resource struct {
	kind string // mount, dir, cgroup, process, netns
	id   string // the sandbox it belongs to ("" when unknown)
	what string
}

func (r resource) String() string { return r.kind + " " + r.what + " [" + r.id + "]" }

// resources lists what sandboxes of this env hold on the node: mounts
// below its root, per-sandbox directories, cgroups under its parent,
// processes in those cgroups and the network namespaces of those
// processes.
func (e *env) resources() []resource {
	var out []resource
	// Layer mounts (<run>/layers/<hex>) are the node's cache, shared by
	// sandboxes: an unused one stays for a grace period while the daemon
	// runs, and the daemon unmounts them when it stops. They count only
	// once it stopped.
	// So are the shared sysfs (<run>/sysfs), empty tmpfs (<run>/empty),
	// views tmpfs (<run>/views), agent tmpfs (<run>/agentfs) and devfs
	// (<run>/devfs) that sandboxes bind; the devfs stays after a
	// stop while sandboxes live.
	layers := filepath.Join(e.runDir, "layers") + "/"
	sysfs, devfs, empty := filepath.Join(e.runDir, "sysfs"), filepath.Join(e.runDir, "devfs"), filepath.Join(e.runDir, "empty")
	views, agentfs := filepath.Join(e.runDir, "views"), filepath.Join(e.runDir, "agentfs")
	running := e.running()
	devs, _ := os.ReadDir(devfs)
	for _, m := range e.mounts() {
		if running && (strings.HasPrefix(m, layers) || m == sysfs || m == empty || m == views || m == agentfs) || m == devfs && (running || len(devs) > 0) {
			continue
		}
		out = append(out, resource{"mount", e.idOfPath(m), m})
	}
	for _, d := range []string{filepath.Join(e.runDir, "sb"), filepath.Join(e.stateDir, "sandboxes"), devfs} {
		ents, _ := os.ReadDir(d)
		for _, ent := range ents {
			out = append(out, resource{"dir", ent.Name(), filepath.Join(d, ent.Name())})
		}
	}
	// Deleted sandboxes' state directories wait here (<id>.<n>) until the
	// daemon's reaper has removed them.
	trash := filepath.Join(e.stateDir, "trash")
	ents, _ := os.ReadDir(trash)
	for _, ent := range ents {
		id := ent.Name()
		if i := strings.LastIndexByte(id, '.'); i > 0 {
			id = id[:i]
		}
		out = append(out, resource{"trash", id, filepath.Join(trash, ent.Name())})
	}
	for _, g := range e.cgroupParents() {
		ents, _ := os.ReadDir(g)
		for _, ent := range ents {
			if ent.IsDir() {
				out = append(out, resource{"cgroup", ent.Name(), filepath.Join(g, ent.Name())})
			}
		}
	}
	netns := map[string]string{}
	for pid, id := range e.procs() {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		out = append(out, resource{"process", id, fmt.Sprintf("%d (%s)", pid, strings.TrimSpace(string(comm)))})
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil {
			netns[ns] = id
		}
	}
	for ns, id := range netns {
		out = append(out, resource{"netns", id, ns})
	}
	// Sandboxes' networks: the host ends of their veths (named for the
	// sandbox by their alias) and their nftables chains; the daemon's
	// table itself once it stopped (it removes it when no sandbox is
	// left with rules).
	links, ids, err := e.net.Leftovers()
	if err != nil {
		e.t.Errorf("list network leftovers: %v", err)
	}
	for name, id := range links {
		out = append(out, resource{"veth", id, name})
	}
	for _, id := range ids {
		out = append(out, resource{"nft", id, "chains of " + id})
	}
	groups, err := e.net.Groups()
	if err != nil {
		e.t.Errorf("list network groups: %v", err)
	}
	for g, addrs := range groups {
		out = append(out, resource{"nft", "", fmt.Sprintf("group %s of %d", g, len(addrs))})
	}
	if !running && e.net.HasTable() {
		out = append(out, resource{"nft", "", "table " + e.net.Table()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// resourcesOf lists the resources of one sandbox.
func (e *env) resourcesOf(id string) []resource {
	var out []resource
	for _, r := range e.resources() {
		if r.id == id {
			out = append(out, r)
		}
	}
	return out
}

// procsOf lists the processes in sandbox id's cgroup.
func (e *env) procsOf(id string) []string {
	var out []string
	for _, r := range e.resourcesOf(id) {
		if r.kind == "process" {
			out = append(out, r.what)
		}
	}
	return out
}

// waitProcs polls until the number of processes in sandbox id's cgroup
// satisfies ok.
func (e *env) waitProcs(id string, ok func(int) bool, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		procs := e.procsOf(id)
		if ok(len(procs)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s has %d processes: %v", id, len(procs), procs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// netnsCount counts the distinct network namespaces of the processes in
// the env's cgroups.
func (e *env) netnsCount() int {
	n := 0
	for _, r := range e.resources() {
		if r.kind == "netns" {
			n++
		}
	}
	return n
}

// idOfPath names the sandbox a path below the run or state dir belongs to.
func (e *env) idOfPath(p string) string {
	for _, d := range []string{filepath.Join(e.runDir, "sb"), filepath.Join(e.stateDir, "sandboxes")} {
		if rel, err := filepath.Rel(d, p); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			return strings.Split(rel, "/")[0]
		}
	}
	return ""
}

// mounts lists mount points at or below the env's root.
func (e *env) mounts() []string {
	mounts, err := mountinfo.Under(e.root)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		out = append(out, m.Point)
	}
	return out
}

// cgroupParents lists the env's parent cgroup in every hierarchy.
func (e *env) cgroupParents() []string {
	var out []string
	if fi, err := os.Stat(filepath.Join("/sys/fs/cgroup", e.parent)); err == nil && fi.IsDir() {
		out = append(out, filepath.Join("/sys/fs/cgroup", e.parent))
	}
	ms, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", e.parent))
	return append(out, ms...)
}

// procs maps the pid of every process in the env's cgroups to the
// sandbox id of its cgroup.
func (e *env) procs() map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	prefix := "/" + e.parent
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + ent.Name() + "/cgroup")
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 {
				continue
			}
			p := parts[2]
			if p == prefix || strings.HasPrefix(p, prefix+"/") {
				rest := strings.TrimPrefix(strings.TrimPrefix(p, prefix), "/")
				out[pid] = strings.Split(rest, "/")[0]
				// The parent itself is the devices group all sandboxes
				// share on hybrid hosts: another line names the sandbox.
				if out[pid] != "" {
					break
				}
			}
		}
		// An orphaned zombie (of a killed daemon, not yet reaped by the
		// host's init) holds nothing but its pid; cgroup2 still names its
		// removed group. A daemon that does not reap its own still shows.
		if _, ok := out[pid]; ok {
			if st, err := os.ReadFile("/proc/" + ent.Name() + "/stat"); err == nil {
				if f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:])); len(f) > 1 && f[0] == "Z" && f[1] == "1" {
					delete(out, pid)
				}
			}
		}
	}
	return out
}

// diffResources returns what cur has beyond base and what it lacks,
// comparing kind and description (a baseline holds no processes, so pids
// never need to match).
func diffResources(base, cur []resource) (extra, missing []string) {
	in := func(rs []resource, r resource) bool {
		return slices.ContainsFunc(rs, func(x resource) bool { return x.kind == r.kind && x.what == r.what })
	}
	for _, r := range cur {
		if !in(base, r) {
			extra = append(extra, r.String())
		}
	}
	for _, r := range base {
		if !in(cur, r) {
			missing = append(missing, r.String())
		}
	}
	return extra, missing
}

// expectBaseline waits up to 15 s for the node to be back at the
// baseline and fails the test if it is not.
func (e *env) expectBaseline(when string) {
	e.t.Helper()
	var extra, missing []string
	deadline := time.Now().Add(15 * time.Second)
	for {
		extra, missing = diffResources(e.baseline, e.resources())
		if len(extra) == 0 && len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Errorf("%s: node not back at baseline:\n  left behind: %v\n  missing: %v", when, extra, missing)
}

// expectNoResources waits up to 15 s until sandbox id holds nothing.
func (e *env) expectNoResources(id, when string) {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		rs := e.resourcesOf(id)
		if len(rs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Errorf("%s: sandbox %s still holds %v", when, id, rs)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// initPid finds the init (pid 1 of its namespace) of sandbox id from the
// host.
func (e *env) initPid(id string) int {
	e.t.Helper()
	for pid, sid := range e.procs() {
		if sid != id {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[0] == "NSpid:" && f[len(f)-1] == "1" {
				return pid
			}
		}
	}
	e.t.Fatalf("no init process found for sandbox %s", id)
	return 0
}

// create creates a sandbox of the busybox image and fails the test if it
// cannot.
func (e *env) create(req *warrenv1.CreateRequest) *warrenv1.Sandbox {
	e.t.Helper()
	if req.Image == "" {
		req.Image = imageName
	}
	sb, err := e.c.Create(ctxFor(e.t, 60*time.Second), req)
	if err != nil {
		e.t.Fatalf("create %q: %v", req.Id, err)
	}
	return sb
}

// sh runs a shell command and fails the test if the call fails.
func (e *env) sh(id, cmd string) *warrenv1.ExecResult {
	e.t.Helper()
	res, err := e.c.Exec(ctxFor(e.t, 60*time.Second), &warrenv1.ExecRequest{SandboxId: id, Shell: cmd})
	if err != nil {
		e.t.Fatalf("exec %q in %s: %v", cmd, id, err)
	}
	return res
}

// shOK runs a shell command that must exit 0 and returns its stdout.
func (e *env) shOK(id, cmd string) string {
	e.t.Helper()
	res := e.sh(id, cmd)
	if res.ExitCode != 0 || res.Signal != 0 || res.TimedOut {
		e.t.Fatalf("exec %q in %s: exit %d signal %d timed out %v, stderr %q", cmd, id, res.ExitCode, res.Signal, res.TimedOut, res.Stderr)
	}
	return string(res.Stdout)
}

// cli runs the warren binary as a client of the env's daemon.
func (e *env) cli(stdin io.Reader, args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	return runCLI(e.t, e.bin, nil, stdin, append([]string{"--addr", e.addr()}, args...)...)
}

func runCLI(t *testing.T, bin string, extraEnv []string, stdin io.Reader, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	var o, se bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &o, &se, stdin
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run %v: %v", args, err)
	}
	return o.String(), se.String(), code
}

// wantCategory fails the test unless err has category want.
func wantCategory(t *testing.T, err error, want client.Category, what string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: succeeded, want a %s error", what, want)
		return
	}
	if got := client.CategoryOf(err); got != want {
		t.Errorf("%s: category %s (%v), want %s", what, got, err, want)
	}
}

// rawHTTP returns an HTTP/1.1 client that dials the env's unix socket.
func (e *env) rawHTTP() *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", e.sock)
			},
		},
	}
}

// waitGone polls until Get of id is not_found.
func (e *env) waitGone(id string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		_, err := e.c.Get(ctxFor(e.t, 10*time.Second), id)
		if client.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("sandbox %s still there after %v: %v", id, within, err)
			}
			return fmt.Errorf("sandbox %s still there after %v", id, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitState polls until sandbox id is in state st and returns it.
func (e *env) waitState(id string, st warrenv1.SandboxState, within time.Duration) (*warrenv1.Sandbox, error) {
	deadline := time.Now().Add(within)
	for {
		sb, err := e.c.Get(ctxFor(e.t, 10*time.Second), id)
		if err == nil && sb.State == st {
			return sb, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("sandbox %s: %v", id, err)
			}
			return sb, fmt.Errorf("sandbox %s in state %v after %v, want %v", id, sb.State, within, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// trashEntries lists what waits in the daemon's trash.
func (e *env) trashEntries() []string {
	ents, err := os.ReadDir(filepath.Join(e.stateDir, "trash"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	var out []string
	for _, ent := range ents {
		out = append(out, ent.Name())
	}
	return out
}

// waitTrashEmpty waits until the reaper (a nice-19 thread, so slow on a
// busy machine) has removed every deleted sandbox's files.
func (e *env) waitTrashEmpty(within time.Duration) {
	e.t.Helper()
	if !e.trashDrained(within) {
		e.t.Fatalf("trash still holds %v after %v:\n%s", e.trashEntries(), within, e.logTail(20))
	}
}

// trashDrained reports whether the trash became empty within the time.
func (e *env) trashDrained(within time.Duration) bool {
	for deadline := time.Now().Add(within); len(e.trashEntries()) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

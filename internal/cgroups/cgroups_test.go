package cgroups

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/testutil"
)

// These tests run on the host's real cgroups, each below a parent of its
// own that is removed when it ends.

var parentSeq atomic.Int64

func testParent(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	if Mode() == "unavailable" {
		t.Skip("no cgroups")
	}
	parent := fmt.Sprintf("warren-cgtest-%d-%d", os.Getpid(), parentSeq.Add(1))
	t.Cleanup(func() { removeParent(t, parent) })
	return parent
}

// parentDirs are parent's directories in every hierarchy.
func parentDirs(parent string) []string {
	out, _ := filepath.Glob(filepath.Join(Root, "*", parent))
	if fi, err := os.Stat(filepath.Join(Root, parent)); err == nil && fi.IsDir() {
		out = append(out, filepath.Join(Root, parent))
	}
	return out
}

// removeParent kills what is left in parent's cgroups and removes them.
func removeParent(t *testing.T, parent string) {
	for _, p := range parentDirs(parent) {
		var dirs []string
		_ = filepath.WalkDir(p, func(d string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, d)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.WriteFile(filepath.Join(dirs[i], "cgroup.freeze"), []byte("0"), 0)
			_ = os.WriteFile(filepath.Join(dirs[i], "freezer.state"), []byte("THAWED"), 0)
			for range 200 {
				pids, _ := readPids(filepath.Join(dirs[i], "cgroup.procs"))
				if len(pids) == 0 {
					break
				}
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
}

// groupDirs lists the directories named parent/name in any hierarchy.
func groupDirs(parent, name string) []string {
	out, _ := filepath.Glob(filepath.Join(Root, "*", parent, name))
	if _, err := os.Stat(filepath.Join(Root, parent, name)); err == nil {
		out = append(out, filepath.Join(Root, parent, name))
	}
	slices.Sort(out)
	return out
}

func hierarchiesOf(parent, name string) []string {
	var out []string
	for _, d := range groupDirs(parent, name) {
		rel, _ := filepath.Rel(Root, d)
		out = append(out, strings.Split(rel, "/")[0])
	}
	return out
}

// child starts argv; it is killed and reaped when the test ends. done is
// closed once it has exited.
func child(t *testing.T, argv ...string) (cmd *exec.Cmd, done chan struct{}) {
	t.Helper()
	cmd = exec.Command(argv[0], argv[1:]...)
	return cmd, startReaped(t, cmd)
}

// startReaped starts cmd and kills and reaps it when the test ends; the channel
// is closed once it has exited.
func startReaped(t *testing.T, cmd *exec.Cmd) chan struct{} {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return done
}

// gated starts the shell script as a process that waits until start is
// called, so that it runs (and forks) only once it is in group g. done is
// closed once it has exited.
func gated(t *testing.T, g Group, script string, stdout *strings.Builder) (cmd *exec.Cmd, start func(), done chan struct{}) {
	t.Helper()
	cmd = exec.Command("sh", "-c", "read x; "+script)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if stdout != nil {
		cmd.Stdout = stdout
	}
	done = startReaped(t, cmd)
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return cmd, func() { _, _ = in.Write([]byte("\n")); in.Close() }, done
}

// runIn runs the shell script in group g and returns its output.
func runIn(t *testing.T, g Group, script string) string {
	t.Helper()
	var out strings.Builder
	_, start, done := gated(t, g, script, &out)
	start()
	<-done
	return out.String()
}

// cgroupsOf maps each controller of /proc/pid/cgroup ("" for the unified
// hierarchy) to the process's group.
func cgroupsOf(t *testing.T, pid int) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(mustRead(t, fmt.Sprintf("/proc/%d/cgroup", pid)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			out[c] = f[2]
		}
	}
	return out
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// procTicks is the user+system CPU time of pid in clock ticks.
func procTicks(t *testing.T, pid int) int {
	t.Helper()
	s := mustRead(t, fmt.Sprintf("/proc/%d/stat", pid))
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	u, _ := strconv.Atoi(f[11])
	k, _ := strconv.Atoi(f[12])
	return u + k
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNewLimitsAndLayout(t *testing.T) {
	parent := testParent(t)
	g, err := New(parent, "sb1", Resources{CPUMillis: 500, MemoryBytes: 64 << 20, PidsMax: 50})
	if err != nil {
		t.Fatal(err)
	}
	if g.Name() != parent+"/sb1" {
		t.Errorf("name %q", g.Name())
	}
	switch Mode() {
	case "v2":
		dir := filepath.Join(Root, parent, "sb1")
		if got := mustRead(t, filepath.Join(dir, "memory.max")); got != strconv.Itoa(64<<20) {
			t.Errorf("memory.max %s", got)
		}
		if got := mustRead(t, filepath.Join(dir, "cpu.max")); got != "50000 100000" {
			t.Errorf("cpu.max %s", got)
		}
		if got := mustRead(t, filepath.Join(dir, "pids.max")); got != "50" {
			t.Errorf("pids.max %s", got)
		}
	default:
		if got := mustRead(t, filepath.Join(Root, "memory", parent, "sb1", "memory.limit_in_bytes")); got != strconv.Itoa(64<<20) {
			t.Errorf("memory.limit_in_bytes %s", got)
		}
		if got := mustRead(t, filepath.Join(Root, "cpu", parent, "sb1", "cpu.cfs_quota_us")); got != "50000" {
			t.Errorf("cpu.cfs_quota_us %s", got)
		}
		if got := mustRead(t, filepath.Join(Root, "pids", parent, "sb1", "pids.max")); got != "50" {
			t.Errorf("pids.max %s", got)
		}
	}
	want := map[string][]string{
		"v2":     {parent},
		"hybrid": {"cpu", "memory", "pids", "unified"},
		"v1":     {"cpu", "cpuacct", "devices", "freezer", "memory", "pids"},
	}[Mode()]
	if got := hierarchiesOf(parent, "sb1"); !slices.Equal(got, want) {
		t.Errorf("the group has directories in %v, want %v", got, want)
	}
	deleteGroup(t, g, parent, "sb1")
	if Mode() == "hybrid" {
		if _, err := os.Stat(filepath.Join(Root, "devices", parent, "devices.list")); err != nil {
			t.Errorf("Delete removed the shared devices cgroup: %v", err)
		}
	}
}

// deleteGroup deletes g, the group parent/name, and checks that none of
// its directories is left.
func deleteGroup(t *testing.T, g Group, parent, name string) {
	t.Helper()
	if err := g.Delete(); err != nil {
		t.Fatalf("delete %s: %v", name, err)
	}
	if left := groupDirs(parent, name); len(left) > 0 {
		t.Errorf("left after Delete of %s: %v", name, left)
	}
}

// TestNewRollback: a create that fails leaves no directory behind.
func TestNewRollback(t *testing.T) {
	parent := testParent(t)
	// A CFS quota below 1 ms is refused by the kernel.
	if _, err := New(parent, "bad", Resources{CPUMillis: 1, MemoryBytes: 64 << 20}); err == nil {
		t.Fatal("New with a 100 µs CPU quota succeeded")
	}
	if left := groupDirs(parent, "bad"); len(left) > 0 {
		t.Errorf("left after a failed New: %v", left)
	}
}

// TestProcsDevicesFreezeStats: a process added to the group is listed,
// sits in the shared devices cgroup with its whitelist, stops while
// frozen, and its CPU time shows in Stats.
func TestProcsDevicesFreezeStats(t *testing.T) {
	parent := testParent(t)
	g, err := New(parent, "sb1", Resources{MemoryBytes: 64 << 20, PidsMax: 50})
	if err != nil {
		t.Fatal(err)
	}
	sleeper, _ := child(t, "sleep", "100")
	busy, _ := child(t, "sh", "-c", "while :; do :; done")
	for _, c := range []*exec.Cmd{sleeper, busy} {
		if err := g.AddProc(c.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	pids, err := g.Procs()
	if err != nil || !slices.Contains(pids, sleeper.Process.Pid) || !slices.Contains(pids, busy.Process.Pid) || len(pids) != 2 {
		t.Errorf("Procs %v %v, want %d and %d", pids, err, sleeper.Process.Pid, busy.Process.Pid)
	}
	in := cgroupsOf(t, sleeper.Process.Pid)
	if Mode() != "v2" {
		for _, h := range []string{"memory", "cpu", "pids"} {
			if in[h] != "/"+parent+"/sb1" {
				t.Errorf("in %s group %q", h, in[h])
			}
		}
	}
	if Mode() == "hybrid" {
		if in[""] != "/"+parent+"/sb1" {
			t.Errorf("in unified group %q", in[""])
		}
		if in["devices"] != "/"+parent {
			t.Errorf("in devices group %q, want the shared one", in["devices"])
		}
		if in["freezer"] != "/" || in["cpuacct"] != "/" {
			t.Errorf("moved into freezer %q, cpuacct %q", in["freezer"], in["cpuacct"])
		}
		shared := filepath.Join(Root, "devices", parent)
		in, err := readPids(filepath.Join(shared, "cgroup.procs"))
		if err != nil || !slices.Contains(in, sleeper.Process.Pid) {
			t.Errorf("the shared devices cgroup holds %v %v, want %d", in, err, sleeper.Process.Pid)
		}
		list := strings.Split(mustRead(t, filepath.Join(shared, "devices.list")), "\n")
		slices.Sort(list)
		want := []string{"c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 136:* rwm", "c 5:0 rwm", "c 5:2 rwm"}
		slices.Sort(want)
		if !slices.Equal(list, want) {
			t.Errorf("shared devices.list %q, want %q", list, want)
		}
	}
	if Mode() != "v2" {
		// The whitelist confines: a device outside it cannot be opened.
		out := runIn(t, g, "if true </dev/kmsg; then echo kmsg opened; fi 2>/dev/null; true </dev/full && echo full opened")
		if out != "full opened\n" {
			t.Errorf("opening /dev/kmsg (not allowed) and /dev/full (allowed) in the group: %q", out)
		}
	}

	// Memory charged before a process joined stays with its old group (v1
	// does not move charges), so put 1 MiB of tmpfs pages in the group to
	// make the usage non-zero for certain.
	shm, err := os.CreateTemp("/dev/shm", "warren-cgtest-")
	if err != nil {
		t.Fatal(err)
	}
	shm.Close()
	t.Cleanup(func() { os.Remove(shm.Name()) })
	runIn(t, g, "head -c 1048576 /dev/zero >"+shm.Name())
	s0, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s0.Pids != 2 || s0.MemoryBytes < 1<<20 {
		t.Errorf("stats %+v", s0)
	}
	// The busy loop's CPU time shows in the group's usage: 100 ms of it,
	// however long a loaded machine takes to give it that much.
	var s1 Stats
	for deadline := time.Now().Add(20 * time.Second); ; {
		if s1, err = g.Stats(); err != nil {
			t.Fatal(err)
		}
		if s1.CPUUsage-s0.CPUUsage >= 100*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU usage grew by %v in 20 s of a busy loop (%v -> %v)", s1.CPUUsage-s0.CPUUsage, s0.CPUUsage, s1.CPUUsage)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	switch Mode() {
	case "v1":
		if got := mustRead(t, filepath.Join(Root, "freezer", parent, "sb1", "freezer.state")); got != "FROZEN" {
			t.Errorf("freezer.state %s", got)
		}
	default:
		dir := filepath.Join(Root, parent, "sb1")
		if Mode() == "hybrid" {
			dir = filepath.Join(Root, "unified", parent, "sb1")
		}
		if ev := mustRead(t, filepath.Join(dir, "cgroup.events")); !strings.Contains(ev, "frozen 1") {
			t.Errorf("cgroup.events after Freeze: %q", ev)
		}
	}
	t0 := procTicks(t, busy.Process.Pid)
	time.Sleep(300 * time.Millisecond)
	if t1 := procTicks(t, busy.Process.Pid); t1 != t0 {
		t.Errorf("a frozen busy loop ran %d ticks", t1-t0)
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the thawed loop to run", 5*time.Second, func() bool { return procTicks(t, busy.Process.Pid) > t0+5 })

	if err := g.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	deleteGroup(t, g, parent, "sb1")
}

// TestKillForkingChild: Kill gets a process that keeps forking, and every
// child it forked.
func TestKillForkingChild(t *testing.T) {
	parent := testParent(t)
	g, err := New(parent, "bomb", Resources{MemoryBytes: 256 << 20, PidsMax: 300})
	if err != nil {
		t.Fatal(err)
	}
	_, start, done := gated(t, g, "while :; do sleep 1 & done", nil)
	start()
	waitFor(t, "the forks", 10*time.Second, func() bool {
		s, err := g.Stats()
		return err == nil && s.Pids >= 20
	})
	if err := g.Kill(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the forking shell survived Kill")
	}
	if pids, err := g.Procs(); err != nil || len(pids) != 0 {
		t.Errorf("after Kill: Procs %v %v", pids, err)
	}
	// Killed orphans are reaped by the host's init; then none is charged.
	waitFor(t, "pids.current 0", 10*time.Second, func() bool {
		s, err := g.Stats()
		return err == nil && s.Pids == 0
	})
	deleteGroup(t, g, parent, "bomb")
	// Kill and Delete of a group that is gone succeed.
	if err := g.Kill(time.Second); err != nil {
		t.Errorf("Kill of a deleted group: %v", err)
	}
	if err := g.Delete(); err != nil {
		t.Errorf("Delete of a deleted group: %v", err)
	}
}

// TestLoadOldLayout: a group an older version made (cpu, cpuacct,
// memory, pids, freezer and devices each) is loaded, frozen, killed and
// deleted in that layout; while it exists its parent's devices cgroup
// cannot be shared, so new groups take the old layout too, and once it is
// gone new groups take the hybrid one.
func TestLoadOldLayout(t *testing.T) {
	parent := testParent(t)
	if Mode() == "v2" {
		t.Skip("no v1 hierarchies")
	}
	sleeper, done := child(t, "sleep", "100")
	for _, h := range legacySubsystems {
		dir := filepath.Join(Root, string(h), parent, "old")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	g, err := Load(parent, "old")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := g.(*v1Group); !ok {
		t.Errorf("old layout loaded as %T", g)
	}
	if pids, err := g.Procs(); err != nil || !slices.Equal(pids, []int{sleeper.Process.Pid}) {
		t.Errorf("Procs %v %v", pids, err)
	}
	if s, err := g.Stats(); err != nil || s.Pids != 1 {
		t.Errorf("Stats %+v %v", s, err)
	}
	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, filepath.Join(Root, "freezer", parent, "old", "freezer.state")); got != "FROZEN" {
		t.Errorf("freezer.state %s", got)
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}

	legacy := []string{"cpu", "cpuacct", "devices", "freezer", "memory", "pids"}
	next, err := New(parent, "next", Resources{MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got := hierarchiesOf(parent, "next"); !slices.Equal(got, legacy) {
		t.Errorf("a group next to an old one has directories in %v, want %v", got, legacy)
	}
	if out := runIn(t, next, "if true </dev/kmsg; then echo kmsg opened; fi 2>/dev/null; true </dev/full && echo full opened"); out != "full opened\n" {
		t.Errorf("devices in the old layout: %q", out)
	}

	if err := g.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the process survived Kill")
	}
	deleteGroup(t, g, parent, "old")
	deleteGroup(t, next, parent, "next")
	if _, err := os.Stat(filepath.Join(Root, "devices", parent)); err != nil {
		t.Errorf("the parent's devices cgroup went with its groups: %v", err)
	}
	if Mode() != "hybrid" {
		return
	}
	after, err := New(parent, "after", Resources{MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hierarchiesOf(parent, "after"), []string{"cpu", "memory", "pids", "unified"}; !slices.Equal(got, want) {
		t.Errorf("a group after the old ones are gone has directories in %v, want %v", got, want)
	}
	if err := after.Delete(); err != nil {
		t.Fatal(err)
	}
}

// TestListAndHalfCreated: List finds groups in every hierarchy a group may
// use, never the shared devices cgroup, and a group of which only the
// unified directory exists (a crash inside New) loads and deletes.
func TestListAndHalfCreated(t *testing.T) {
	parent := testParent(t)
	if Mode() != "hybrid" {
		t.Skip("hybrid layout only")
	}
	if _, err := New(parent, "full", Resources{}); err != nil {
		t.Fatal(err)
	}
	for dir, name := range map[string]string{"unified": "half", "freezer": "oldhalf"} {
		if err := os.MkdirAll(filepath.Join(Root, dir, parent, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	names, err := List(parent)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if want := []string{"full", "half", "oldhalf"}; !slices.Equal(names, want) {
		t.Errorf("List %v, want %v", names, want)
	}
	for _, n := range names {
		g, err := Load(parent, n)
		if err != nil {
			t.Fatalf("load %s: %v", n, err)
		}
		if _, ok := g.(*hybridGroup); ok != (n != "oldhalf") {
			t.Errorf("%s loaded as %T", n, g)
		}
		if err := g.Kill(time.Second); err != nil {
			t.Errorf("kill %s: %v", n, err)
		}
		deleteGroup(t, g, parent, n)
	}
	if names, err := List(parent); err != nil || len(names) != 0 {
		t.Errorf("List after deleting all: %v %v", names, err)
	}
	if _, err := Load(parent, "none"); err == nil {
		t.Errorf("Load of a group that does not exist succeeded")
	}
}

// TestSharedDevicesSetup: concurrent creates set the shared devices
// cgroup up once; a later create (as after a daemon restart) keeps it, and
// repairs it if it was opened.
func TestSharedDevicesSetup(t *testing.T) {
	parent := testParent(t)
	if Mode() != "hybrid" {
		t.Skip("hybrid layout only")
	}
	var wg sync.WaitGroup
	groups := make([]Group, 8)
	for i := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := New(parent, fmt.Sprintf("c%d", i), Resources{PidsMax: 10})
			if err != nil {
				t.Error(err)
				return
			}
			groups[i] = g
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	shared := filepath.Join(Root, "devices", parent)
	check := func(when string) {
		t.Helper()
		if ok, err := whitelisted(shared); err != nil || !ok {
			t.Errorf("%s: devices.list %q %v", when, mustRead(t, filepath.Join(shared, "devices.list")), err)
		}
	}
	check("after concurrent creates")
	sleeper, _ := child(t, "sleep", "100")
	if err := groups[0].AddProc(sleeper.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := New(parent, "later", Resources{}); err != nil {
		t.Fatal(err)
	}
	check("after a create with a process inside")
	if err := os.WriteFile(filepath.Join(shared, "devices.allow"), []byte("a *:* rwm"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := New(parent, "repair", Resources{}); err != nil {
		t.Fatal(err)
	}
	check("after a create found it opened")
	if in, _ := readPids(filepath.Join(shared, "cgroup.procs")); !slices.Contains(in, sleeper.Process.Pid) {
		t.Errorf("the process left the shared devices cgroup: %v", in)
	}
}

func TestReadKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("oom_kill_disable 0\nunder_oom 1\noom_kill 17\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]uint64{"oom_kill": 17, "under_oom": 1, "oom": 0, "missing": 0} {
		if got, err := readKey(p, key); err != nil || got != want {
			t.Errorf("readKey %s = %d, %v; want %d", key, got, err, want)
		}
	}
}

// TestPidsRefused: forks the pids limit refuses are counted (the
// daemon's pids_limit security event reads this counter).
func TestPidsRefused(t *testing.T) {
	parent := testParent(t)
	g, err := New(parent, "forks", Resources{PidsMax: 5})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := g.PidsRefused(); err != nil || n != 0 {
		t.Fatalf("before: %d %v", n, err)
	}
	runIn(t, g, "for i in 1 2 3 4 5 6 7 8; do sleep 0.5 & done 2>/dev/null; wait")
	if n, err := g.PidsRefused(); err != nil || n == 0 {
		t.Fatalf("after forking past the limit: %d %v", n, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s, err := g.Stats()
		if err == nil && s.Pids == 0 {
			break
		}
		if time.Now().After(deadline) {
			procs, perr := g.Procs()
			t.Fatalf("pids.current %d (%v) 10 s after the forks ended; the group's processes: %v %v", s.Pids, err, procs, perr)
		}
	}
	deleteGroup(t, g, parent, "forks")
}

// uncachedFile writes a file of size bytes on the disk (not tmpfs, whose
// pages are not page cache that can be dropped) and evicts it from the
// page cache, so that its pages are charged to whichever group reads it
// next.
func uncachedFile(t *testing.T, size int) string {
	t.Helper()
	f, err := os.CreateTemp("/var/tmp", "warren-cgtest-cache-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for left := size; left > 0; left -= len(buf) {
		if _, err := f.Write(buf[:min(left, len(buf))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return f.Name()
}

// TestFreezeReclaimThaw: a frozen group's counter stops and resumes where
// it stopped once thawed; Reclaim on the frozen group gives back its page
// cache (and its anonymous memory where the node has swap) and the
// processes survive it.
func TestFreezeReclaimThaw(t *testing.T) {
	parent := testParent(t)
	g, err := New(parent, "sb1", Resources{MemoryBytes: 512 << 20, PidsMax: 50})
	if err != nil {
		t.Fatal(err)
	}
	counter := filepath.Join(t.TempDir(), "count")
	big := uncachedFile(t, 64<<20)
	script := "cat " + big + " >/dev/null; i=0; while :; do i=$((i+1)); echo $i >" + counter + ".tmp; mv " + counter + ".tmp " + counter + "; sleep 0.01; done"
	_, start, _ := gated(t, g, script, nil)
	// 32 MiB of anonymous memory, touched, held.
	anon, _ := child(t, "sh", "-c", anonHolder(t, 32, true))
	if err := g.AddProc(anon.Process.Pid); err != nil {
		t.Fatal(err)
	}
	start()
	count := func() int {
		b, _ := os.ReadFile(counter)
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	waitFor(t, "the counter to count", 10*time.Second, func() bool { return count() > 5 })
	// The python child allocated before it joined: its pages stay charged
	// to the test's group on v1. Only what it touches from now counts, so
	// the anonymous part is checked on the cgroup's own numbers only.
	waitFor(t, "the file to be in the page cache", 10*time.Second, func() bool {
		m, err := g.Memory()
		return err == nil && m.File >= 60<<20
	})

	if frozen, err := g.Frozen(); err != nil || frozen {
		t.Fatalf("Frozen before Freeze: %v %v", frozen, err)
	}
	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	if frozen, err := g.Frozen(); err != nil || !frozen {
		t.Fatalf("Frozen after Freeze: %v %v", frozen, err)
	}
	c0 := count()
	before, err := g.Memory()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Reclaim(); err != nil {
		t.Fatal(err)
	}
	after, err := g.Memory()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory before %+v after %+v", before, after)
	if after.File > 4<<20 || before.Usage-after.Usage < 56<<20 {
		t.Errorf("Reclaim left %d bytes of page cache and gave back %d bytes (of %d), want the 64 MiB file's pages back",
			after.File, int64(before.Usage)-int64(after.Usage), before.Usage)
	}
	if swap, _ := SwapTotal(); swap == 0 {
		t.Logf("the node has no swap: anonymous memory stays (%d bytes)", after.Anon)
	} else if after.Anon > before.Anon/2 {
		t.Errorf("with %d bytes of swap on the node, Reclaim left %d of %d bytes of anonymous memory", swap, after.Anon, before.Anon)
	}
	time.Sleep(200 * time.Millisecond)
	if c := count(); c != c0 {
		t.Errorf("the counter went from %d to %d while frozen", c0, c)
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	if frozen, err := g.Frozen(); err != nil || frozen {
		t.Fatalf("Frozen after Thaw: %v %v", frozen, err)
	}
	waitFor(t, "the thawed counter to count on", 10*time.Second, func() bool { return count() > c0+5 })
	if c := count(); c > c0+1000 {
		t.Errorf("the counter jumped from %d to %d: it restarted or ran while frozen", c0, c)
	}
	if err := anon.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the process holding anonymous memory did not survive the reclaim: %v", err)
	}
	if err := g.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	deleteGroup(t, g, parent, "sb1")
}

// TestReclaimAnonV1RestoresLimit: the v1 step-down that pushes anonymous
// memory to swap lowers the limit only while the kernel can reclaim, never
// OOM-kills (a v1 limit write refuses with EBUSY instead), and puts back
// the limit it found, exactly. Without swap on the node the kernel cannot
// take anonymous pages: the steps end at the first refusal, which is what
// this node checks; with swap the anonymous memory must also go.
func TestReclaimAnonV1RestoresLimit(t *testing.T) { testReclaimAnonV1(t) }

// TestReclaimAnonV1PushesToSwap: the same on a node with swap (a swap file
// the test turns on for its run where the node has none): the step-down
// moves at least half of the anonymous memory out, within the group's
// memory+swap limit, and the process finds its memory intact after.
func TestReclaimAnonV1PushesToSwap(t *testing.T) {
	withSwap(t)
	testReclaimAnonV1(t)
}

// TestReclaimV2PushesToSwap: on a v2 node with swap, the reclaim of a
// frozen group moves at least half of its anonymous memory out although
// the running group may not swap (memory.swap.max 0), and puts that limit
// back after. This machine's memory
// controller is v1's (hybrid), so it runs on v2 nodes only.
func TestReclaimV2PushesToSwap(t *testing.T) {
	parent := testParent(t)
	if Mode() != "v2" {
		t.Skipf("the memory controller is on cgroup v1 here (%s layout): memory.swap.max and memory.reclaim are v2's", Mode())
	}
	withSwap(t)
	g, err := New(parent, "sb1", Resources{MemoryBytes: 256 << 20, PidsMax: 50})
	if err != nil {
		t.Fatal(err)
	}
	// The holder sleeps: killed first (never run before on a v2 node,
	// where it left the group busy: TestCgroupV2InAVM).
	defer func() {
		if err := g.Kill(5 * time.Second); err != nil {
			t.Error(err)
		}
		deleteGroup(t, g, parent, "sb1")
	}()
	var out strings.Builder
	_, start, _ := gated(t, g, anonHolder(t, 48, true), &out)
	start()
	waitFor(t, "the memory to be held", 20*time.Second, func() bool { m, _ := g.Memory(); return m.Anon >= 48<<20 })
	swapMax := filepath.Join(Root, g.Name(), "memory.swap.max")
	if got := mustRead(t, swapMax); got != "0" {
		t.Fatalf("memory.swap.max %s while running, want 0", got)
	}
	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	before, _ := g.Memory()
	if err := g.Reclaim(); err != nil {
		t.Fatal(err)
	}
	after, _ := g.Memory()
	t.Logf("before %+v after %+v", before, after)
	if after.Swap < before.Anon/2 {
		t.Errorf("%d bytes out on swap of %d bytes of anonymous memory", after.Swap, before.Anon)
	}
	if got := mustRead(t, swapMax); got != "0" {
		t.Errorf("memory.swap.max %s after the reclaim, want 0 back", got)
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	if oom, _ := g.OOMKills(); oom != 0 {
		t.Errorf("%d OOM kills", oom)
	}
}

// TestMemoryLimitBoundsSwap: on a node with swap, a group's memory limit
// bounds its memory and swap together: a process that outgrows it meets
// the OOM killer instead of going on in swap (and filling the node's).
func TestMemoryLimitBoundsSwap(t *testing.T) {
	parent := testParent(t)
	withSwap(t)
	g, err := New(parent, "sb1", Resources{MemoryBytes: 64 << 20, PidsMax: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer deleteGroup(t, g, parent, "sb1")
	// What bounds swap: v1's memory+swap limit at the memory limit, v2's
	// swap limit at 0 while the sandbox runs.
	swapFile, want := filepath.Join(v1Dir("memory", g.Name()), "memory.memsw.limit_in_bytes"), func(n int64) string { return strconv.FormatInt(n, 10) }
	if Mode() == "v2" {
		swapFile, want = filepath.Join(Root, g.Name(), "memory.swap.max"), func(int64) string { return "0" }
	}
	if sw := mustRead(t, swapFile); sw != want(64<<20) {
		t.Fatalf("%s %s, want %s", filepath.Base(swapFile), sw, want(64<<20))
	}
	var out strings.Builder
	cmd, start, done := gated(t, g, anonHolder(t, 160, false), &out)
	start()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		m, _ := g.Memory()
		t.Fatalf("a process past a 64 MiB limit still runs after 60 s: memory %+v", m)
	}
	if strings.Contains(out.String(), "held") || cmd.ProcessState.Success() {
		t.Fatalf("a process held 160 MiB under a 64 MiB limit (in memory and swap): %v %q", cmd.ProcessState, out.String())
	}
	if oom, _ := g.OOMKills(); oom == 0 {
		t.Errorf("the process ended (%v) without an OOM kill", cmd.ProcessState)
	}
	// Raised and cut again, memory+swap follows.
	for _, n := range []int64{128 << 20, 32 << 20} {
		if err := g.SetLimits(Limits{MemoryBytes: &n}); err != nil {
			t.Fatal(err)
		}
		if got := mustRead(t, swapFile); got != want(n) {
			t.Errorf("%s %s after setting %d, want %s", filepath.Base(swapFile), got, n, want(n))
		}
	}
}

// withSwap gives the node swap for the test's run: a swap file on the
// disk, turned off and removed after, unless the node has swap already.
func withSwap(t *testing.T) {
	t.Helper()
	if swap, _ := SwapTotal(); swap > 0 {
		return
	}
	if _, err := exec.LookPath("mkswap"); err != nil {
		t.Skipf("no mkswap (util-linux) to make a swap file: %v", err)
	}
	f := filepath.Join(t.TempDir(), "swap")
	if out, err := exec.Command("sh", "-c", "dd if=/dev/zero of="+f+" bs=1M count=128 status=none && chmod 600 "+f+" && mkswap "+f).CombinedOutput(); err != nil {
		t.Fatalf("make a swap file: %v: %s", err, out)
	}
	if out, err := exec.Command("swapon", f).CombinedOutput(); err != nil {
		t.Fatalf("swapon: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("swapoff", f).CombinedOutput(); err != nil {
			t.Errorf("swapoff: %v: %s", err, out)
		}
	})
	if swap, _ := SwapTotal(); swap == 0 {
		t.Fatal("swapon succeeded and the node still has no swap")
	}
}

func testReclaimAnonV1(t *testing.T) {
	parent := testParent(t)
	if Mode() == "v2" {
		t.Skip("v2 reclaims through memory.reclaim, not v1 limit steps")
	}
	g, err := New(parent, "sb1", Resources{MemoryBytes: 256 << 20, PidsMax: 50})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	_, start, _ := gated(t, g, anonHolder(t, 48, true), &out)
	start()
	waitFor(t, "the memory to be held", 20*time.Second, func() bool { m, _ := g.Memory(); return m.Anon >= 48<<20 })
	pids, _ := g.Procs()
	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	dir := v1Dir("memory", g.Name())
	limit := mustRead(t, filepath.Join(dir, "memory.limit_in_bytes"))
	before, _ := g.Memory()
	t0 := time.Now()
	if err := reclaimAnonV1(g.Name(), dir); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	after, _ := g.Memory()
	t.Logf("step-down took %v: before %+v after %+v", took, before, after)
	if got := mustRead(t, filepath.Join(dir, "memory.limit_in_bytes")); got != limit {
		t.Errorf("limit %s after the step-down, want %s back", got, limit)
	}
	if oom, _ := g.OOMKills(); oom != 0 {
		t.Errorf("%d OOM kills during the step-down", oom)
	}
	if swap, _ := SwapTotal(); swap > 0 && after.Anon > before.Anon/2 {
		t.Errorf("with %d bytes of swap, %d of %d bytes of anonymous memory stayed", swap, after.Anon, before.Anon)
	} else if swap > 0 && after.Swap < before.Anon/2 {
		t.Errorf("with %d bytes of swap, the group has %d bytes out on swap of %d bytes of anonymous memory", swap, after.Swap, before.Anon)
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	now, _ := g.Procs()
	if !slices.Equal(now, pids) {
		t.Errorf("processes %v after the step-down, want %v", now, pids)
	}
	if err := g.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	deleteGroup(t, g, parent, "sb1")
}

// residentPages counts the pages of file in the page cache (mincore on a
// mapping, which reads nothing).
func residentPages(t *testing.T, file string) int {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	vec := make([]byte, (len(mem)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestDeleteReclaimsLeftovers: a group whose tasks are gone but which
// still has a little page cache charged (a file one of its tasks read)
// gives it back on Delete, so that the kernel frees the memory cgroup
// rather than keeping it, dying, for as long as those pages stay cached;
// a group with more than LeftoverCacheMax charged keeps its pages (other
// sandboxes may be reading them: a shared layer's). The file is on disk
// (/var/tmp): tmpfs pages cannot be reclaimed without swap.
func TestDeleteReclaimsLeftovers(t *testing.T) {
	parent := testParent(t)
	for _, c := range []struct {
		name    string
		size    int
		evicted bool
	}{
		{"small", 256 << 10, true},
		{"large", LeftoverCacheMax + 4<<20, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := New(parent, c.name, Resources{MemoryBytes: 256 << 20, PidsMax: 20})
			if err != nil {
				t.Fatal(err)
			}
			file := uncachedFile(t, c.size)
			pages := c.size / os.Getpagesize()
			if n := residentPages(t, file); n != 0 {
				t.Fatalf("%d pages of the new file already cached", n)
			}
			// Read by a task of the group, which then exits: its pages
			// stay cached, charged to the group.
			runIn(t, g, "cat "+file+" >/dev/null")
			if n := residentPages(t, file); n != pages {
				t.Fatalf("%d of the file's %d pages cached after the group's task read it", n, pages)
			}
			if m, err := g.Memory(); err != nil || m.File < uint64(c.size) {
				t.Fatalf("the group's page cache: %+v %v, want at least the file's %d bytes", m, err, c.size)
			}
			deleteGroup(t, g, parent, c.name)
			n := residentPages(t, file)
			t.Logf("%d of %d pages cached after Delete", n, pages)
			if c.evicted && n != 0 {
				t.Errorf("Delete left %d of the file's %d pages charged to the removed group (a dying memory cgroup)", n, pages)
			}
			if !c.evicted && n != pages {
				t.Errorf("Delete of a group with %d bytes of page cache (over LeftoverCacheMax) evicted %d of its %d pages", c.size, pages-n, pages)
			}
		})
	}
}

// anonHolder is a shell command that execs this test binary as a process
// holding mib MiB of anonymous memory, every page touched, which says
// "held" once it does and then sleeps (hold) or exits. No python3: the
// tests also run in a VM whose root is busybox (TestCgroupV2InAVM).
func anonHolder(t *testing.T, mib int, hold bool) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("WARREN_TEST_HOLD_MIB=%d WARREN_TEST_HOLD_SLEEP=%v exec %s -test.run='^TestHelperHoldAnon$' -test.count=1", mib, hold, exe)
}

// TestHelperHoldAnon is not a test: anonHolder's process. Its memory is
// a mapping of its own, not the Go heap (which the race detector would
// shadow, several times over).
func TestHelperHoldAnon(t *testing.T) {
	mib, _ := strconv.Atoi(os.Getenv("WARREN_TEST_HOLD_MIB"))
	if mib == 0 {
		t.Skip("helper process of the memory tests (anonHolder)")
	}
	mem, err := unix.Mmap(-1, 0, mib<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(mem); i += os.Getpagesize() {
		mem[i] = 1
	}
	fmt.Println("held")
	if os.Getenv("WARREN_TEST_HOLD_SLEEP") == "true" {
		time.Sleep(10 * time.Minute)
	}
}

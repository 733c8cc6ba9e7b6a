package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// lazyHolder keeps ~130 MiB of random text in a shell variable and
// writes its checksum to /tmp/s1 once, and to /tmp/s2 when /tmp/go
// appears.
const lazyHolder = `x=$(head -c 100000000 /dev/urandom | base64 -w0); echo "$x" | md5sum > /tmp/s1.t && mv /tmp/s1.t /tmp/s1
while :; do if [ -e /tmp/go ]; then rm /tmp/go; echo "$x" | md5sum > /tmp/s2.t; mv /tmp/s2.t /tmp/s2; fi; sleep 0.05; done`

// TestLazyForkSurvivesSourceDeleteAndDaemonKill: with lazy restore the
// daemon's default (--lazy-pages), forks whose source is deleted right
// after the fork and whose daemon is killed -9 while their memory is
// still being filled keep all of it (the checksum of a 130 MiB buffer
// taken before the fork matches in each), run on under the restarted
// daemon, and leave nothing (no lazy-pages process, socket or
// directory) once deleted.
func TestLazyForkSurvivesSourceDeleteAndDaemonKill(t *testing.T) {
	t.Parallel()
	testLazyFork(t, false, false)
}

// TestLazyForkSurvivesSourceDeleteAndDaemonKillUserNS: the same for
// sandboxes in a user namespace (the default), under warren serve's
// default, which on a node where vm.unprivileged_userfaultfd was 0 (the
// kernel's) sets it to 1 so that their tasks may have a userfaultfd (the
// test puts the setting back).
func TestLazyForkSurvivesSourceDeleteAndDaemonKillUserNS(t *testing.T) {
	t.Parallel()
	holdUffdKnob(t, "0")
	e := testLazyFork(t, true, true)
	if v := readUffdKnob(t); v != "1" {
		t.Errorf("after warren serve, vm.unprivileged_userfaultfd is %s, want 1 (its default)", v)
	}
	if !strings.Contains(e.logTail(1<<20), "set vm.unprivileged_userfaultfd=1 (was 0)") {
		t.Error("the daemon did not say that it set vm.unprivileged_userfaultfd=1")
	}
}

// TestUserNSRestoreSaysWhyEager: on a node that keeps the kernel's
// default vm.unprivileged_userfaultfd=0 (warren serve
// --unprivileged-userfaultfd=false), a sandbox in a user namespace restores
// its memory eagerly, and Resume and Fork say so and why; one without a
// user namespace restores lazily on the same node; a restore asked to be
// eager gives no reason.
func TestUserNSRestoreSaysWhyEager(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4.2 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	holdUffdKnob(t, "0")
	e := newEnv(t, envOptions{serveArgs: []string{"--lazy-pages"}})
	ctx := ctxFor(t, 3*time.Minute)
	const why = "vm.unprivileged_userfaultfd is 0"
	for _, userns := range []bool{true, false} {
		id := map[bool]string{true: "uns", false: "nouns"}[userns]
		e.create(&warrenv1.CreateRequest{Id: id, UserNamespace: proto.Bool(userns)})
		if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done"}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.Hibernate(ctx, id); err != nil {
			t.Fatal(err)
		}
		r, err := e.c.Resume(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if userns && (r.GetLazyPages() || !strings.Contains(r.GetEagerReason(), why)) {
			t.Errorf("resume of a user-namespace sandbox: lazy %v, reason %q; want eager, saying %q", r.GetLazyPages(), r.GetEagerReason(), why)
		}
		if !userns && (!r.GetLazyPages() || r.GetEagerReason() != "") {
			t.Errorf("resume of a sandbox without a user namespace: lazy %v, reason %q; want lazy", r.GetLazyPages(), r.GetEagerReason())
		}
		e.shOK(id, "test -s /tmp/n")
		f, err := e.c.Fork(ctx, &warrenv1.ForkRequest{Id: id, Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		if f.GetLazyPages() != r.GetLazyPages() || f.GetEagerReason() != r.GetEagerReason() {
			t.Errorf("fork of %s: lazy %v, reason %q; its resume said %v, %q", id, f.GetLazyPages(), f.GetEagerReason(), r.GetLazyPages(), r.GetEagerReason())
		}
		e.shOK(f.GetSandboxes()[0].GetId(), "test -s /tmp/n")
	}
	// Eager because asked: nothing to explain.
	if _, err := e.c.Hibernate(ctx, "uns"); err != nil {
		t.Fatal(err)
	}
	r, err := e.c.ResumeLazy(ctx, "uns", false)
	if err != nil {
		t.Fatal(err)
	}
	if r.GetLazyPages() || r.GetEagerReason() != "" {
		t.Errorf("resume asked to be eager: lazy %v, reason %q", r.GetLazyPages(), r.GetEagerReason())
	}
	// The node's restores by how the memory came back: for each
	// sandbox its resume, its fork, and its own restore after the fork
	// (a running source is put back as it was); eager, the user-
	// namespace sandbox's three and the resume asked to be eager.
	m, _ := e.scrape(t)
	for memory, want := range map[string]float64{"eager": 4, "lazy": 3} {
		if n, _ := m.get(`warren_sandbox_restore_seconds_count{memory="` + memory + `"}`); n != want {
			t.Errorf("warren_sandbox_restore_seconds_count{memory=%q} = %v, want %v", memory, n, want)
		}
	}
	if !strings.Contains(e.logTail(1<<20), "sandboxes in a user namespace restore their memory eagerly") {
		t.Error("the daemon did not say at its start that user-namespace sandboxes restore eagerly on this node")
	}
}

// uffdKnobMu serialises the tests that set the node's
// vm.unprivileged_userfaultfd.
var uffdKnobMu sync.Mutex

const uffdKnob = "/proc/sys/vm/unprivileged_userfaultfd"

// holdUffdKnob sets vm.unprivileged_userfaultfd to v for the test's run,
// the only test to change it meanwhile, and puts it back after.
func holdUffdKnob(t *testing.T, v string) {
	t.Helper()
	old, err := os.ReadFile(uffdKnob)
	if err != nil {
		t.Skipf("the kernel has no %s: %v", uffdKnob, err)
	}
	uffdKnobMu.Lock()
	t.Cleanup(func() {
		_ = os.WriteFile(uffdKnob, old, 0)
		uffdKnobMu.Unlock()
	})
	if err := os.WriteFile(uffdKnob, []byte(v), 0); err != nil {
		t.Fatal(err)
	}
}

func readUffdKnob(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(uffdKnob)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// testLazyFork runs the test on a daemon of its own; nodeUffd: as
// envOptions.nodeUffd.
func testLazyFork(t *testing.T, userns, nodeUffd bool) *env {
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4.2 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	e := newEnv(t, envOptions{serveArgs: []string{"--lazy-pages"}, nodeUffd: nodeUffd})
	ctx := ctxFor(t, 4*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "lz", UserNamespace: proto.Bool(userns), Resources: &warrenv1.Resources{MemoryBytes: 1 << 30}})
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "lz", Shell: lazyHolder}); err != nil {
		t.Fatal(err)
	}
	var sum string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if r := e.sh("lz", "cat /tmp/s1"); r.GetExitCode() == 0 {
			sum = string(r.GetStdout())
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder wrote no checksum in a minute")
		}
	}
	f, err := e.c.Fork(ctx, &warrenv1.ForkRequest{Id: "lz", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !f.GetLazyPages() || f.GetEagerReason() != "" {
		t.Errorf("fork: lazy %v, reason %q; want lazy", f.GetLazyPages(), f.GetEagerReason())
	}
	var forks []string
	for _, sb := range f.GetSandboxes() {
		forks = append(forks, sb.GetId())
		// The daemon's default restored it lazily: its server's log.
		if _, err := os.Stat(filepath.Join(e.runDir, "sb", sb.GetId(), "lazy-pages.log")); err != nil {
			t.Errorf("fork %s: no lazy-pages server was started: %v", sb.GetId(), err)
		}
	}
	// The source, and with it the checkpoint, goes at once; the daemon
	// dies while the forks' memory is still coming in.
	if err := e.c.Delete(ctx, "lz"); err != nil {
		t.Fatal(err)
	}
	e.kill9()
	e.start()
	for _, id := range forks {
		e.shOK(id, "touch /tmp/go")
	}
	for _, id := range forks {
		var got string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			if r := e.sh(id, "cat /tmp/s2"); r.GetExitCode() == 0 {
				got = string(r.GetStdout())
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("fork %s wrote no checksum in a minute", id)
			}
		}
		if got != sum {
			t.Errorf("fork %s: checksum %q after a lazy restore, %q before", id, got, sum)
		}
	}
	for _, id := range forks {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		e.expectNoResources(id, "delete")
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left := lazyServersUnder(e.stateDir)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("lazy-pages servers left after delete: %v", left)
			break
		}
	}
	e.expectBaseline("lazily forked sandboxes deleted")
	return e
}

// lazyServersUnder lists the pids of CRIU lazy-pages processes reading
// images under dir.
func lazyServersUnder(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, p := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cl := string(b)
		if strings.Contains(cl, "\x00lazy-pages\x00--images-dir\x00"+dir) {
			out = append(out, p.Name()+": "+strings.ReplaceAll(cl, "\x00", " "))
		}
	}
	return out
}

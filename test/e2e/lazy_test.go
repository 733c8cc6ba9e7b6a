package e2e

import (
	"os"
	"path/filepath"
	"strings"
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
	testLazyFork(t, false)
}

// TestLazyForkSurvivesSourceDeleteAndDaemonKillUserNS: the same for
// sandboxes in a user namespace (the default), on a node whose operator
// allowed their tasks a userfaultfd (vm.unprivileged_userfaultfd=1,
// which the test sets for its run and puts back).
func TestLazyForkSurvivesSourceDeleteAndDaemonKillUserNS(t *testing.T) {
	t.Parallel()
	const knob = "/proc/sys/vm/unprivileged_userfaultfd"
	old, err := os.ReadFile(knob)
	if err != nil {
		t.Skipf("the kernel has no %s: %v", knob, err)
	}
	if err := os.WriteFile(knob, []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(knob, old, 0) })
	testLazyFork(t, true)
}

func testLazyFork(t *testing.T, userns bool) {
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4.2 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	e := newEnv(t, envOptions{serveArgs: []string{"--lazy-pages"}})
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

package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

const stateHibernated = warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED

// TestHibernateAcrossKill9AndFork: through the CLI, a sandbox hibernated
// to disk holds nothing on the node, survives a kill -9 of the daemon,
// and resumes with its counter going on from the saved value; a fork of
// it makes copies that count on too; deleting everything leaves nothing.
func TestHibernateAcrossKill9AndFork(t *testing.T) {
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "hb", UserNamespace: proto.Bool(false)})
	e.shOK("hb", "echo kept > /root/f")
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "hb",
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /count.tmp; mv /count.tmp /count; sleep 0.01; done"}); err != nil {
		t.Fatal(err)
	}
	e.waitCount("hb", 5)
	out, errOut, code := e.cli(nil, "sandbox", "hibernate", "hb")
	if code != 0 || !strings.Contains(out, "hb hibernated") {
		t.Fatalf("cli hibernate: %d %q %q", code, out, errOut)
	}
	e.expectNoResources("hb", "hibernated")
	b, err := os.ReadFile(filepath.Join(e.stateDir, "checkpoints", "hb", "upper", "count"))
	if err != nil {
		t.Fatal(err)
	}
	saved, _ := strconv.Atoi(strings.TrimSpace(string(b)))

	e.kill9()
	e.start()
	sb, err := e.c.Get(ctx, "hb")
	if err != nil || sb.GetState() != stateHibernated {
		t.Fatalf("after kill -9 and restart: %v %v", sb.GetState(), err)
	}
	// Eagerly (the daemon's default is lazy: TestLazyForkSurvives...).
	out, errOut, code = e.cli(nil, "sandbox", "resume", "--lazy-pages=false", "hb")
	if code != 0 || !strings.Contains(out, "hb restored") {
		t.Fatalf("cli resume: %d %q %q", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(e.runDir, "sb", "hb", "lazy-pages.log")); err == nil {
		t.Errorf("resume --lazy-pages=false started a lazy-pages server")
	}
	if c := e.counterOf("hb"); c < saved || c > saved+100 {
		t.Fatalf("counter %d after the restore, %d saved: restarted or lost", c, saved)
	}
	e.waitCount("hb", saved+5)
	if got := e.shOK("hb", "cat /root/f"); got != "kept\n" {
		t.Fatalf("file after restore: %q", got)
	}

	out, errOut, code = e.cli(nil, "sandbox", "fork", "hb", "-n", "2")
	if code != 0 {
		t.Fatalf("cli fork: %d %q %q", code, out, errOut)
	}
	forks := strings.Fields(out)
	if len(forks) != 2 {
		t.Fatalf("fork printed %q", out)
	}
	for _, id := range forks {
		c := e.counterOf(id)
		e.waitCount(id, c+5)
		if got := e.shOK(id, "cat /root/f"); got != "kept\n" {
			t.Fatalf("fork %s: %q", id, got)
		}
	}
	if sb, err := e.c.Get(ctx, "hb"); err != nil || sb.GetState() != stateRunning {
		t.Fatalf("the source after the fork: %v %v", sb.GetState(), err)
	}
	m, _ := e.scrape(t)
	if n, _ := m.get("warren_sandbox_restore_seconds_count"); n < 4 {
		t.Errorf("restores counted %v, want 4 (resume, 2 forks, the source put back)", n)
	}
	for _, id := range append(forks, "hb") {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		e.expectNoResources(id, "delete")
	}
	// Checkpoints are removed in the background.
	for _, d := range []string{"checkpoints", "bases"} {
		deadline := time.Now().Add(15 * time.Second)
		for {
			ents, _ := os.ReadDir(filepath.Join(e.stateDir, d))
			if len(ents) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s left: %v", d, ents)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	e.expectBaseline("hibernated and forked sandboxes deleted")
}

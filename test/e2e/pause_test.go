package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

const statePaused = warrenv1.SandboxState_SANDBOX_STATE_PAUSED

// counterOf reads sandbox id's /count from the host, through its init's
// root (the file calls refuse a paused sandbox).
func (e *env) counterOf(id string) int {
	e.t.Helper()
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/root/count", e.initPid(id)))
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func (e *env) waitCount(id string, above int) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for e.counterOf(id) <= above {
		if time.Now().After(deadline) {
			e.t.Fatalf("sandbox %s: the counter stays at %d", id, e.counterOf(id))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPauseResumeAcrossKill9AndByLabel: `warren sandbox pause --reclaim`
// freezes a counter and gives back the sandbox's page cache (its cgroup's
// usage says so); exec is refused while paused; the sandbox stays paused
// (the counter still) across a kill -9 of the daemon and is resumed by
// label with the counter going on; pause by label streams one line per
// sandbox; the metrics count pauses and reclaimed bytes; paused sandboxes
// delete to the node's baseline.
func TestPauseResumeAcrossKill9AndByLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	batch := map[string]string{"batch": "pz"}
	e.create(&warrenv1.CreateRequest{Id: "pz", Labels: batch})
	e.create(&warrenv1.CreateRequest{Id: "pz2", Labels: batch})
	e.shOK("pz", "head -c 64000000 /dev/zero > /cache && sync && cat /cache > /dev/null")
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "pz",
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /count.tmp; mv /count.tmp /count; sleep 0.01; done"}); err != nil {
		t.Fatal(err)
	}
	e.waitCount("pz", 5)
	before := e.memoryUsage("pz")
	out, errOut, code := e.cli(nil, "sandbox", "pause", "pz", "--reclaim")
	if code != 0 || !strings.Contains(out, "pz paused") {
		t.Fatalf("cli pause: %d %q %q", code, out, errOut)
	}
	if after := e.memoryUsage("pz"); before-after < 60_000_000 {
		t.Errorf("cgroup usage %d before the pause, %d after: want the 64 MB of page cache given back", before, after)
	}
	c0 := e.counterOf("pz")
	_, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "pz", Argv: []string{"true"}})
	wantCategory(t, err, client.CategoryConflict, "exec while paused")
	if err == nil || !strings.Contains(err.Error(), "PAUSED") {
		t.Fatalf("exec while paused: %v, want it to say PAUSED", err)
	}

	e.kill9()
	e.start()
	sb, err := e.c.Get(ctx, "pz")
	if err != nil || sb.GetState() != statePaused {
		t.Fatalf("after kill -9 and restart: %v %v", sb.GetState(), err)
	}
	time.Sleep(200 * time.Millisecond)
	if c := e.counterOf("pz"); c != c0 {
		t.Fatalf("the counter went from %d to %d while paused across the restart", c0, c)
	}
	out, errOut, code = e.cli(nil, "sandbox", "resume", "--label", "batch=pz")
	if code != 0 || !strings.Contains(out, "[1/1] pz resumed") {
		t.Fatalf("cli resume by label: %d %q %q", code, out, errOut)
	}
	e.waitCount("pz", c0+5)

	out, errOut, code = e.cli(nil, "--json", "sandbox", "pause", "--label", "batch=pz", "--reclaim", "--parallel", "2")
	if code != 0 {
		t.Fatalf("cli pause by label: %d %q %q", code, out, errOut)
	}
	ids := map[string]bool{}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var ev struct {
			SandboxID string `json:"sandboxId"`
			Error     string `json:"error"`
			Total     int    `json:"total"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Error != "" || ev.Total != 2 {
			t.Fatalf("event line %q: %v", line, err)
		}
		ids[ev.SandboxID] = true
	}
	if len(ids) != 2 || !ids["pz"] || !ids["pz2"] {
		t.Fatalf("paused by label: %v", ids)
	}
	m, _ := e.scrape(t)
	if n, _ := m.get(`warren_sandbox_pause_seconds_count{reclaim="true"}`); n != 2 {
		t.Errorf("pause count with reclaim %v, want 2 since the restart", n)
	}
	if n, _ := m.get("warren_sandbox_reclaimed_bytes_total"); n <= 0 {
		t.Errorf("reclaimed bytes %v", n)
	}
	if n, _ := m.get("warren_sandbox_resume_seconds_count"); n != 1 {
		t.Errorf("resume count %v, want 1 since the restart", n)
	}
	for _, id := range []string{"pz", "pz2"} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatalf("delete paused %s: %v", id, err)
		}
		e.expectNoResources(id, "delete of a paused sandbox")
	}
	e.expectBaseline("paused sandboxes deleted")
}

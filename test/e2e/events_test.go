package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestSecurityEventsSurviveDaemonKill9: a sandbox's security events are
// in the audit file (a JSON line with the sandbox id) as soon as they are
// listed, and a daemon killed with SIGKILL comes back listing the same
// events, through the API and `warren sandbox events`.
func TestSecurityEventsSurviveDaemonKill9(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "ev"})
	res, err := e.c.Exec(ctxFor(t, time.Minute), &warrenv1.ExecRequest{SandboxId: "ev", Shell: "head -c 100 /dev/zero", OutputLimitBytes: 10})
	if err != nil || res.StdoutDroppedBytes != 90 {
		t.Fatalf("exec: %v %v", res, err)
	}
	before := e.waitEvent("ev", "output_cap", time.Second)

	f, err := os.Open(filepath.Join(e.stateDir, "events", "events.log"))
	if err != nil {
		t.Fatal(err)
	}
	var line struct {
		Sandbox, Kind, Detail string
		Seq                   uint64
	}
	sc := bufio.NewScanner(f)
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &line) != nil || line.Sandbox != "ev" || line.Kind != "output_cap" || line.Seq != 1 {
		t.Errorf("audit file line %q: %+v", sc.Text(), line)
	}
	f.Close()

	e.kill9()
	e.start()
	after := e.waitEvent("ev", "output_cap", time.Second)
	if after.Seq != before.Seq || after.Detail != before.Detail || after.TimeUnixMs != before.TimeUnixMs {
		t.Errorf("after kill -9: %v, before %v", after, before)
	}
	out, stderr, code := e.cli(nil, "sandbox", "events", "ev")
	if code != 0 || !strings.Contains(out, "output_cap") || !strings.Contains(out, "wrote 90 bytes") {
		t.Errorf("sandbox events: code %d, stdout %q, stderr %q", code, out, stderr)
	}
	out, _, code = e.cli(nil, "--json", "sandbox", "events", "ev")
	var page warrenv1.ListSandboxEventsResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &page) != nil || len(page.Events) != 1 {
		t.Errorf("sandbox events --json: code %d, %q", code, out)
	}
	if _, stderr, code := e.cli(nil, "sandbox", "events", "nosuch"); code == 0 || !strings.Contains(stderr, "not found") {
		t.Errorf("events of an unknown sandbox: code %d, %q", code, stderr)
	}
}

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/cgroups"
)

// pidsMaxOf reads a sandbox's pids limit from its cgroup file.
func (e *env) pidsMaxOf(id string) string {
	e.t.Helper()
	p := filepath.Join(cgroups.Root, "pids", e.parent, id, "pids.max")
	if cgroups.Mode() == "v2" {
		p = filepath.Join(cgroups.Root, e.parent, id, "pids.max")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestSandboxUpdate: `warren sandbox update` and the Go client's Update
// change a running sandbox's limits (the cgroup file says so), labels and
// lifetime; the change survives a kill -9 of the daemon; an invalid update
// changes nothing and an update of a stopped sandbox is a conflict.
func TestSandboxUpdate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "upd", Resources: &warrenv1.Resources{PidsMax: 100},
		Labels: map[string]string{"drop": "1", "keep": "1"}})
	if got := e.pidsMaxOf("upd"); got != "100" {
		t.Fatalf("pids.max at create %s", got)
	}
	out, errOut, code := e.cli(nil, "sandbox", "update", "upd", "--pids", "64", "--label", "add=2", "--remove-label", "drop", "--timeout", "2h")
	if code != 0 || !strings.Contains(out, "add=2,keep=1") {
		t.Fatalf("cli update: %d %q %q", code, out, errOut)
	}
	if got := e.pidsMaxOf("upd"); got != "64" {
		t.Fatalf("pids.max after update %s", got)
	}
	cpu := int64(1500)
	sb, err := e.c.Update(ctx, "upd", client.SandboxUpdate{CPUMillis: &cpu})
	if err != nil || sb.GetResources().GetCpuMillis() != 1500 || sb.GetResources().GetPidsMax() != 64 {
		t.Fatalf("client update: %v %v", sb, err)
	}
	bad := int64(3)
	if _, err := e.c.Update(ctx, "upd", client.SandboxUpdate{PidsMax: &bad, SetLabels: map[string]string{"x": "y"}}); !client.IsInvalid(err) {
		t.Fatalf("pids 3: %v, want invalid", err)
	}

	e.kill9()
	e.start()
	sb, err = e.c.Get(ctx, "upd")
	if err != nil {
		t.Fatal(err)
	}
	r := sb.GetResources()
	if r.GetPidsMax() != 64 || r.GetCpuMillis() != 1500 || len(sb.GetLabels()) != 2 || sb.GetLabels()["add"] != "2" ||
		time.Until(time.UnixMilli(sb.GetExpiresAtUnixMs())) < 110*time.Minute {
		t.Fatalf("after restart: %v", sb)
	}
	if got := e.pidsMaxOf("upd"); got != "64" {
		t.Fatalf("pids.max after restart %s", got)
	}

	if err := unix.Kill(e.initPid("upd"), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := e.waitState("upd", stateStopped, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Update(ctx, "upd", client.SandboxUpdate{SetLabels: map[string]string{"x": "y"}})
	if !client.IsConflict(err) || !strings.Contains(err.Error(), "is STOPPED") {
		t.Fatalf("update of a stopped sandbox: %v", err)
	}
	if err := e.c.Delete(ctx, "upd"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Update(ctx, "upd", client.SandboxUpdate{PidsMax: &cpu}); !client.IsNotFound(err) {
		t.Fatalf("update of a deleted sandbox: %v", err)
	}
}

package e2e

import (
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestPlainGoBuild: a plain `go build ./cmd/warren`, no tags or linker
// flags, is a working daemon, both as the default build (cgo on: linked
// dynamically against the host's libc) and with CGO_ENABLED=0: sandboxes
// get their init and agent from the embedded standalone binary only.
// Before, the daemon refused a dynamic binary and a cgo-less one had no
// init to fall back to.
func TestPlainGoBuild(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct {
		name    string
		env     string
		dynamic bool
	}{
		{"default", "CGO_ENABLED=1", true},
		{"nocgo", "CGO_ENABLED=0", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			bin := testutil.Binary(t, "./cmd/warren", c.env)
			if dyn := isDynamic(t, bin); dyn != c.dynamic {
				t.Fatalf("%s build: dynamically linked %v, want %v", c.env, dyn, c.dynamic)
			}
			e := newEnv(t, envOptions{bin: bin})
			e.create(&warrenv1.CreateRequest{Id: "plain-" + c.name})
			if out := e.shOK("plain-"+c.name, `echo hello; tr -d '\000' </proc/1/cmdline`); out != "hello\nwarren-init" {
				t.Errorf("exec: %q", out)
			}
			// A restarted daemon adopts it.
			if err := e.stop(); err != nil {
				t.Fatal(err)
			}
			e.start()
			if out := e.shOK("plain-"+c.name, "echo again"); out != "again\n" {
				t.Errorf("exec after restart: %q", out)
			}
			if log, _ := os.ReadFile(e.logPath); strings.Contains(string(log), "memfd") {
				t.Errorf("the daemon fell back from the memfd agent:\n%s", e.logTail(20))
			}
		})
	}
}

// TestWrongArchAgentRefused: a daemon whose embedded agent is for another
// machine (the arm64 agent in an amd64 build, swapped in with go build
// -overlay) refuses to start and says what is wrong and what to do;
// before, only the ELF magic was checked and every create would have
// failed at exec.
func TestWrongArchAgentRefused(t *testing.T) {
	testutil.RequireRoot(t)
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	if other == "" {
		t.Skipf("no agent is built for linux/%s", runtime.GOARCH)
	}
	dir := t.TempDir()
	agents := filepath.Join(testutil.ModuleRoot(), "internal", "agentbin")
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {
		filepath.Join(agents, "warren-agent-"+runtime.GOARCH): filepath.Join(agents, "warren-agent-"+other),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "overlay.json"), overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "warren")
	build := exec.Command("go", "build", "-overlay", filepath.Join(dir, "overlay.json"), "-o", bin, "./cmd/warren")
	build.Dir = testutil.ModuleRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	_, stderr, code := runCLI(t, bin, nil, nil, "serve",
		"--state-dir", filepath.Join(dir, "state"), "--run-dir", filepath.Join(dir, "run"),
		"--socket", filepath.Join(dir, "s.sock"), "--cgroup-parent", "warren-e2e-wrongarch")
	for _, want := range []string{"built for linux/" + other, "this daemon is linux/" + runtime.GOARCH, "go generate ./internal/agentbin"} {
		if code == 0 || !strings.Contains(stderr, want) {
			t.Errorf("serve with the %s agent: exit %d, stderr lacks %q:\n%s", other, code, want, stderr)
		}
	}
}

func isDynamic(t *testing.T, path string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

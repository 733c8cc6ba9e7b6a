package e2e

import (
	"archive/zip"
	"debug/elf"
	"encoding/json"
	"errors"
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

// TestGoInstall: `go install github.com/warrenrl/warren/cmd/warren@latest`
// builds, from what a module proxy serves (a zip of the module's tracked
// files, here this tree's, behind a file:// proxy in front of the local
// module cache's), a daemon whose sandboxes work: the agents the build
// embeds are in the module, and nothing needs a replace directive, cgo
// or a linker flag.
func TestGoInstall(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	const version = "v0.0.1"
	proxy := filepath.Join(dir, "proxy")
	at := filepath.Join(proxy, "github.com", "warrenrl", "warren", "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	root := testutil.ModuleRoot()
	files, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	zf, err := os.Create(filepath.Join(at, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(zf)
	for _, name := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		w, err := zw.Create("github.com/warrenrl/warren@" + version + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	zf.Close()
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		version + ".mod":  string(mod),
		version + ".info": `{"Version":"` + version + `","Time":"2026-01-01T00:00:00Z"}`,
		"list":            version + "\n",
	} {
		if err := os.WriteFile(filepath.Join(at, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	gobin := filepath.Join(dir, "bin")
	install := exec.Command("go", "install", "github.com/warrenrl/warren/cmd/warren@latest")
	install.Dir = dir
	install.Env = append(os.Environ(), "GOBIN="+gobin, "GOMODCACHE="+filepath.Join(dir, "modcache"),
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(strings.TrimSpace(string(cache)), "cache", "download"),
		"GOSUMDB=off", "GOFLAGS=-modcacherw", "GOTOOLCHAIN=local")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install: %v\n%s", err, out)
	}
	e := newEnv(t, envOptions{bin: filepath.Join(gobin, "warren")})
	e.create(&warrenv1.CreateRequest{Id: "installed"})
	if out := e.shOK("installed", "echo installed"); out != "installed\n" {
		t.Errorf("exec: %q", out)
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

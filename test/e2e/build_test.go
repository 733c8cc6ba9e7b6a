package e2e

import (
	"debug/elf"
	"os"
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

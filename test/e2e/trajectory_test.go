package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestTrajectoryReplaySurvivesDaemonKill9: an agent loop driven through
// the Go SDK, re-run from its start after a trainer restart and again
// after the daemon was killed with SIGKILL, appends each line to its file
// once: the recorded steps come back from the log (their outcomes were on
// disk before they were returned), and the loop continues live past the
// end. `warren sandbox log` exports the steps as JSON lines; the log is
// gone with the sandbox.
func TestTrajectoryReplaySurvivesDaemonKill9(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "tr"})
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	tw.WriteHeader(&tar.Header{Name: "seed.txt", Mode: 0o644, Size: 5, Typeflag: tar.TypeReg})
	tw.Write([]byte("seed\n"))
	tw.Close()
	// The agent loop: an upload, then steps that each append a line.
	loop := func(steps int) (replayed int) {
		ctx := ctxFor(t, time.Minute)
		seq, rep, err := e.c.UploadStep(ctx, "tr", "/", "agent", 1, bytes.NewReader(tarBuf.Bytes()))
		if err != nil || seq != 1 {
			t.Fatalf("upload step: %d %v", seq, err)
		}
		if rep {
			replayed++
		}
		for i := range steps {
			res, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "tr", SessionId: "agent", Seq: uint64(i + 2),
				Shell: fmt.Sprintf("echo step-%d >> /seed.txt", i)})
			if err != nil || res.Seq != uint64(i+2) {
				t.Fatalf("step %d: %v %v", i, res, err)
			}
			if res.Replayed {
				replayed++
			}
		}
		return replayed
	}
	if n := loop(3); n != 0 {
		t.Fatalf("first run replayed %d", n)
	}
	if n := loop(4); n != 4 { // the trainer restarted
		t.Fatalf("trainer restart: replayed %d, want 4", n)
	}
	e.kill9()
	e.start()
	if n := loop(5); n != 5 {
		t.Fatalf("daemon kill -9: replayed %d, want 5", n)
	}
	want := "seed\nstep-0\nstep-1\nstep-2\nstep-3\nstep-4\n"
	if got := e.shOK("tr", "cat /seed.txt"); got != want {
		t.Fatalf("file after replays %q, want %q", got, want)
	}
	_, err := e.c.Exec(ctxFor(t, time.Minute), &warrenv1.ExecRequest{SandboxId: "tr", SessionId: "agent", Seq: 3, Shell: "echo other >> /seed.txt"})
	wantCategory(t, err, client.CategoryConflict, "mismatch")

	// The Go SDK's Rollout answers the recorded steps from one read of
	// the log, and runs the rest live through the daemon.
	sdkLoop := func(steps int) (replayed, live int) {
		ctx := ctxFor(t, time.Minute)
		r, err := e.c.NewRollout(ctx, "tr", "sdk")
		if err != nil {
			t.Fatal(err)
		}
		if err := r.MakeDir(ctx, &warrenv1.MakeDirRequest{Path: "/sdk", Parents: true}); err != nil {
			t.Fatal(err)
		}
		for i := range steps {
			res, err := r.Exec(ctx, &warrenv1.ExecRequest{Shell: fmt.Sprintf("echo sdk-%d >> /sdk/log", i)})
			if err != nil || res.Seq != uint64(i+2) {
				t.Fatalf("sdk step %d: %v %v", i, res, err)
			}
		}
		return r.Counts()
	}
	if rep, live := sdkLoop(2); rep != 0 || live != 3 {
		t.Fatalf("sdk first run: %d replayed, %d live", rep, live)
	}
	e.kill9()
	e.start()
	if rep, live := sdkLoop(4); rep != 3 || live != 2 {
		t.Fatalf("sdk after kill -9: %d replayed, %d live", rep, live)
	}
	if got := e.shOK("tr", "cat /sdk/log"); got != "sdk-0\nsdk-1\nsdk-2\nsdk-3\n" {
		t.Fatalf("sdk file %q", got)
	}
	r, err := e.c.NewRollout(ctxFor(t, time.Minute), "tr", "sdk")
	if err != nil {
		t.Fatal(err)
	}
	err = r.MakeDir(ctxFor(t, time.Minute), &warrenv1.MakeDirRequest{Path: "/elsewhere"})
	wantCategory(t, err, client.CategoryConflict, "sdk mismatch")

	out, stderr, code := e.cli(nil, "sandbox", "log", "tr", "--session", "agent")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 6 {
		t.Fatalf("sandbox log: code %d, %d lines %q, stderr %q", code, len(lines), out, stderr)
	}
	var first, last struct {
		Seq, Method string
		Upload      struct{ Path string }
		Exec        struct{ Shell string }
		ExecResult  struct{ ExitCode int } `json:"exec_result"`
		PayloadSha  string                 `json:"payload_sha256"`
	}
	if json.Unmarshal([]byte(lines[0]), &first) != nil || first.Method != "upload" || first.Seq != "1" || first.PayloadSha == "" || first.Upload.Path != "/" {
		t.Errorf("first line %s", lines[0])
	}
	if json.Unmarshal([]byte(lines[5]), &last) != nil || last.Method != "exec" || last.Seq != "6" || last.Exec.Shell != "echo step-4 >> /seed.txt" {
		t.Errorf("last line %s", lines[5])
	}

	logPath := filepath.Join(e.stateDir, "trajectory", "tr.log")
	if _, err := os.Stat(logPath); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(ctxFor(t, time.Minute), "tr"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(logPath); !os.IsNotExist(err) {
		t.Fatalf("log left after delete: %v", err)
	}
}

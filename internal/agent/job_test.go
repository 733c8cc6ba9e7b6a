package agent

import (
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
)

// TestJobAsPID1: the agent runs a job's steps in order and reports each
// one's status and measurements in one reply, as PID 1 of a pid
// namespace (the only place it takes jobs: its reset kills every other
// process there).
func TestJobAsPID1(t *testing.T) {
	a := startAgent(t, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID})
	work := t.TempDir()
	res, err := a.client.RunJob(ctx(t), backend.Job{UID: 0, GID: 0, Workdir: work, Steps: []backend.Step{
		{Argv: []string{"sh", "-c", "echo hi; echo x > f"}, Env: []string{"PATH=/usr/bin:/bin"}, Outputs: []string{"f"}, Limits: backend.StepLimits{Wall: 5 * time.Second, OutputBytes: 1024, FileOutBytes: 1024}},
		{Argv: []string{"sh", "-c", "exit 4"}, Env: []string{"PATH=/usr/bin:/bin"}, Limits: backend.StepLimits{Wall: 5 * time.Second, OutputBytes: 1024}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ResetErr != 0 || len(res.Steps) != 2 {
		t.Fatalf("%+v", res)
	}
	if s := res.Steps[0]; s.Status != backend.StatusAccepted || string(s.Stdout) != "hi\n" || string(s.Files[0].Data) != "x\n" {
		t.Fatalf("step 0: %+v", s)
	}
	if s := res.Steps[1]; s.Status != backend.StatusNonZeroExit || s.ExitCode != 4 {
		t.Fatalf("step 1: %+v", s)
	}
}

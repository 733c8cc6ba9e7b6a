package daemon

import (
	"sync"
	"syscall"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestOOMIsPerProcess: while one exec is OOM-killed, execs of the same
// sandbox that end "like" it at the same time (an exit code of 137 of
// their own, a kill -9 from inside) are not reported as OOM-killed. The
// sandbox-wide OOM counter rises during all three, so it cannot tell them
// apart.
func TestOOMIsPerProcess(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "oomp", Resources: &warrenv1.Resources{MemoryBytes: 16 << 20}})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	results := make([]*warrenv1.ExecResult, 3)
	errs := make([]error, 3)
	run := func(i int, req *warrenv1.ExecRequest) {
		defer wg.Done()
		results[i], errs[i] = e.m.Exec(ctx, req)
	}
	wg.Add(2)
	// Both outlast the OOM kill below, which takes milliseconds.
	go run(0, &warrenv1.ExecRequest{SandboxId: "oomp", Shell: "sleep 1.5; exit 137"})
	go run(1, &warrenv1.ExecRequest{SandboxId: "oomp", Shell: "sleep 1.5; kill -9 $$"})
	waitProcs(t, e, "oomp", 3) // the two shells and their sleeps are up
	wg.Add(1)
	run(2, &warrenv1.ExecRequest{SandboxId: "oomp", Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"}})
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
	}
	if r := results[2]; !r.GetOomKilled() || r.GetSignal() != int32(syscall.SIGKILL) {
		t.Fatalf("the allocation beyond the limit: %v", r)
	}
	if r := results[0]; r.GetExitCode() != 137 || r.GetOomKilled() {
		t.Errorf("exit 137 of its own: %v", r)
	}
	if r := results[1]; r.GetSignal() != int32(syscall.SIGKILL) || r.GetOomKilled() {
		t.Errorf("kill -9 from inside: %v", r)
	}
	// A shell command line whose last command the shell execs is the
	// exec's own process: still reported (the Python SDK's exec(str)).
	if r := e.sh("oomp", "dd if=/dev/zero of=/dev/null bs=256M count=1"); !r.GetOomKilled() {
		t.Errorf("dd through sh -c: %v", r)
	}
}

// waitProcs waits until the sandbox runs at least n processes besides
// its init.
func waitProcs(t *testing.T, e *env, id string, n int) {
	t.Helper()
	eventually(t, 10*time.Second, "processes to start", func() bool {
		st, err := e.m.sandboxStats(id)
		return err == nil && st.Pids >= uint64(n+1)
	})
}

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestFnRun: Run through the daemon, the Go client and the CLI: steps in
// order with files between them, a program's failure as a status (and
// the CLI's exit code), a bad request as Invalid; and the pooled
// environments are gone after a daemon crash and restart (Sweep) and
// after a clean stop (the harness's baseline check).
func TestFnRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)

	res, err := e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Steps: []*warrenv1.RunStep{
		{Argv: []string{"sh", "-c", "echo $GREETING > out; id -u; pwd"}, Env: map[string]string{"GREETING": "hello"}, Outputs: []string{"out"}},
		{Argv: []string{"cat", "in"}, Files: []*warrenv1.RunFile{{Name: "in", From: "out", FromStep: 0}}},
		{Argv: []string{"sh", "-c", "exit 7"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 3 {
		t.Fatalf("%d steps", len(res.Steps))
	}
	if s := res.Steps[0]; s.Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED || string(s.Stdout) != "1000\n/w\n" || string(s.Files[0].Data) != "hello\n" {
		t.Errorf("step 0: %v", s)
	}
	if s := res.Steps[1]; s.Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED || string(s.Stdout) != "hello\n" {
		t.Errorf("step 1: %v", s)
	}
	if s := res.Steps[2]; s.Status != warrenv1.RunStatus_RUN_STATUS_NON_ZERO_EXIT || s.ExitCode != 7 || s.WallUs <= 0 {
		t.Errorf("step 2: %v", s)
	}

	_, err = e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName})
	wantCategory(t, err, client.CategoryInvalid, "a job without steps")
	_, err = e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Backend: "container", Steps: []*warrenv1.RunStep{{Argv: []string{"true"}}}})
	wantCategory(t, err, client.CategoryInvalid, "a job for the container backend")
	_, err = e.c.Run(ctx, &warrenv1.RunRequest{Image: "nosuchimage", Steps: []*warrenv1.RunStep{{Argv: []string{"true"}}}})
	wantCategory(t, err, client.CategoryNotFound, "a job of an unknown image")

	out, errOut, code := e.cli(nil, "fn", "run", "--image", imageName, "--cpu", "1s", "--", "sh", "-c", "echo hi; exit 3")
	if out != "hi\n" || code != 3 || !strings.Contains(errOut, "status non_zero_exit") {
		t.Errorf("fn run: stdout %q stderr %q code %d", out, errOut, code)
	}
	out, _, code = e.cli(nil, "fn", "run", "--image", imageName, "--wall", "200ms", "--", "sleep", "5")
	if code != 124 {
		t.Errorf("fn run past the wall limit: code %d, stdout %q", code, out)
	}
	out, _, code = e.cli(nil, "--json", "fn", "run", "--image", imageName, "--", "true")
	if code != 0 || !strings.Contains(out, "RUN_STATUS_ACCEPTED") {
		t.Errorf("fn run --json: code %d %s", code, out)
	}

	// An image imported again under the same name is run as it is now.
	for _, v := range []string{"one", "two"} {
		root := filepath.Join(t.TempDir(), "root")
		if err := os.CopyFS(root, os.DirFS(testutil.BusyboxRoot(t))); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "marker"), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.ImportImage(ctx, "fnre", root); err != nil {
			t.Fatal(err)
		}
		if r, err := e.c.RunCommand(ctx, "fnre", "cat", "/marker"); err != nil || string(r.Stdout) != v {
			t.Fatalf("run on the image imported with %q: %v %v", v, r, err)
		}
	}

	// Removing it closes its pool; a job of it is then NotFound.
	if err := e.c.RemoveImage(ctx, "fnre"); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.RunCommand(ctx, "fnre", "true")
	wantCategory(t, err, client.CategoryNotFound, "a job of a removed image")

	// Pooled environments belong to the daemon alone: after a crash the
	// next daemon removes them.
	e.kill9()
	e.start()
	e.expectBaseline("after a crash with pooled environments and a restart")
	if r, err := e.c.RunCommand(ctx, imageName, "echo", "again"); err != nil || string(r.Stdout) != "again\n" {
		t.Fatalf("run after restart: %v %v", r, err)
	}
}

// TestFnRunBatch: a batch's jobs run in parallel in separate environments
// and each result is streamed once, with its index, as it finishes; a
// job's program failure is a status in its item.
func TestFnRunBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	const n = 40
	req := &warrenv1.RunBatchRequest{Image: imageName, Parallelism: 4}
	for i := range n {
		script := fmt.Sprintf("echo %d > f; sleep 0.05; cat f; exit %d", i, i%2)
		req.Jobs = append(req.Jobs, &warrenv1.RunJob{Steps: []*warrenv1.RunStep{{Argv: []string{"sh", "-c", script}}}})
	}
	seen := map[int32]bool{}
	t0 := time.Now()
	err := e.c.RunBatch(ctx, req, func(it *warrenv1.RunBatchItem) error {
		if seen[it.Index] {
			t.Errorf("job %d twice", it.Index)
		}
		seen[it.Index] = true
		if it.Error != "" {
			t.Errorf("job %d: %s (%s)", it.Index, it.Error, it.ErrorCategory)
			return nil
		}
		s := it.Result.Steps[0]
		want := warrenv1.RunStatus_RUN_STATUS_ACCEPTED
		if it.Index%2 == 1 {
			want = warrenv1.RunStatus_RUN_STATUS_NON_ZERO_EXIT
		}
		if s.Status != want || string(s.Stdout) != fmt.Sprintf("%d\n", it.Index) {
			t.Errorf("job %d: %v %q", it.Index, s.Status, s.Stdout)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("%d of %d jobs reported", len(seen), n)
	}
	// 40 jobs of >= 50 ms each, four at a time: well under 40 x 50 ms.
	if d := time.Since(t0); d > 1900*time.Millisecond {
		t.Logf("batch took %v: were the jobs run in parallel?", d)
	}
	err = e.c.RunBatch(ctx, &warrenv1.RunBatchRequest{Image: imageName, Jobs: []*warrenv1.RunJob{{}}}, func(*warrenv1.RunBatchItem) error { return nil })
	wantCategory(t, err, client.CategoryInvalid, "a batch with a job without steps")
}

// TestFnMetrics: the fncall backend's metrics follow its pools and jobs:
// jobs by outcome and their latency, environments created, in a pool
// per image, and destroyed after a failed reset.
func TestFnMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	m0, body := e.scrape(t)
	for _, want := range []string{
		"# TYPE warren_fncall_jobs_total counter",
		"# TYPE warren_fncall_job_seconds histogram",
		"# TYPE warren_fncall_environments_created_total counter",
		"# TYPE warren_fncall_environments_failed_total counter",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if v, ok := m0.get(`warren_fncall_jobs_total{status="accepted"}`); !ok || v != 0 {
		t.Errorf("accepted jobs before any: %v %v", v, ok)
	}
	run := func(script string) {
		t.Helper()
		if _, err := e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Steps: []*warrenv1.RunStep{{Argv: []string{"sh", "-c", script}}}}); err != nil {
			t.Fatal(err)
		}
	}
	// A job running shows as an environment in use.
	done := make(chan error, 1)
	go func() {
		_, err := e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Steps: []*warrenv1.RunStep{{Argv: []string{"sh", "-c", "sleep 1"}}}})
		done <- err
	}()
	inUse := `warren_fncall_environments{image="` + imageName + `",state="in_use"}`
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if m, _ := e.scrape(t); m[inUse] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no environment in use while a job runs")
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	run("exit 2")
	// A tree deeper than the reset walks: the job is accepted, its
	// environment destroyed.
	run("mkdir -p " + strings.Repeat("d/", 60))
	_, err := e.c.Run(ctx, &warrenv1.RunRequest{Image: "nosuchimage", Steps: []*warrenv1.RunStep{{Argv: []string{"true"}}}})
	wantCategory(t, err, client.CategoryNotFound, "a job of an unknown image")

	want := map[string]float64{
		`warren_fncall_jobs_total{status="accepted"}`:      2,
		`warren_fncall_jobs_total{status="non_zero_exit"}`: 1,
		`warren_fncall_jobs_total{status="error"}`:         1,
		`warren_fncall_job_seconds_count`:                  4,
		`warren_fncall_environments_failed_total`:          1,
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, _ := e.scrape(t)
		var bad []string
		for s, v := range want {
			if got, _ := m.get(s); got != v {
				bad = append(bad, fmt.Sprintf("%s = %v, want %v", s, got, v))
			}
		}
		// At least the first environment and the failed one's
		// replacement; the failed one destroyed; the pool refilled.
		if got, _ := m.get("warren_fncall_environments_created_total"); got < 2 {
			bad = append(bad, fmt.Sprintf("created %v, want >= 2", got))
		}
		if got, _ := m.get("warren_fncall_environments_destroyed_total"); got < 1 {
			bad = append(bad, fmt.Sprintf("destroyed %v, want >= 1", got))
		}
		idle, _ := m.get(`warren_fncall_environments{image="` + imageName + `",state="idle"}`)
		inUse, ok := m.get(`warren_fncall_environments{image="` + imageName + `",state="in_use"}`)
		if !ok || idle < 1 || inUse != 0 {
			bad = append(bad, fmt.Sprintf("pool of %s: %v idle, %v in use (reported %v)", imageName, idle, inUse, ok))
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics after the jobs:\n%s", strings.Join(bad, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fnImage builds the root of language image kind ("python" or "cc") from
// the host's programs with scripts/fn-images.sh, the way the benchmark's
// are documented to be built, and imports it as name.
func fnImage(t *testing.T, e *env, kind, name string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), kind)
	out, err := exec.Command("../../scripts/fn-images.sh", kind, root).CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/fn-images.sh %s: %v\n%s", kind, err, out)
	}
	if _, err := e.c.ImportImage(ctxFor(t, 2*time.Minute), name, root); err != nil {
		t.Fatalf("import %s: %v", name, err)
	}
}

// sumC reads whitespace-separated integers from stdin and prints their
// count and sum: the judge's program under test.
const sumC = `#include <stdio.h>
int main(void) {
	long long x, s = 0; int n = 0;
	while (scanf("%lld", &x) == 1) { s += x; n++; }
	printf("%d %lld\n", n, s);
	return 0;
}
`

// TestFnCompileAndRunAndPython: the workloads the fncall backend is for,
// in images built from the host's gcc and python3: one job compiles a C
// program with the image's cc and runs it on five test inputs, each
// output compared with the expected one; a compile error is the compile
// step's status with the compiler's message; and Python runs with its
// standard library.
func TestFnCompileAndRunAndPython(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	fnImage(t, e, "cc", "fn-cc")
	fnImage(t, e, "python", "fn-python")

	inputs := []string{"1 2 3", "", "-5 5", "1000000000000 1000000000000", strings.Repeat("7 ", 1000)}
	wants := []string{"3 6\n", "0 0\n", "2 0\n", "2 2000000000000\n", "1000 7000\n"}
	steps := []*warrenv1.RunStep{{Argv: []string{"cc", "-O2", "-Wall", "-o", "sum", "sum.c"},
		Files: []*warrenv1.RunFile{{Name: "sum.c", Data: []byte(sumC)}}, Limits: &warrenv1.RunLimits{CpuMs: 20000, MemoryBytes: 512 << 20}}}
	for _, in := range inputs {
		steps = append(steps, &warrenv1.RunStep{Argv: []string{"./sum"}, Stdin: []byte(in), ContinueOnFailure: true,
			Limits: &warrenv1.RunLimits{CpuMs: 1000}})
	}
	res, err := e.c.Run(ctx, &warrenv1.RunRequest{Image: "fn-cc", Steps: steps})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 1+len(inputs) {
		t.Fatalf("%d steps ran: %v", len(res.Steps), res.Steps)
	}
	if c := res.Steps[0]; c.Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED || len(c.Stderr) != 0 {
		t.Fatalf("compile: %v %q", c.Status, c.Stderr)
	}
	for i, s := range res.Steps[1:] {
		if s.Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED || string(s.Stdout) != wants[i] {
			t.Errorf("test %d: %v %q (stderr %q), want %q", i, s.Status, s.Stdout, s.Stderr, wants[i])
		}
	}
	res, err = e.c.Run(ctx, &warrenv1.RunRequest{Image: "fn-cc", Steps: []*warrenv1.RunStep{
		{Argv: []string{"cc", "-o", "bad", "bad.c"}, Files: []*warrenv1.RunFile{{Name: "bad.c", Data: []byte("int main(void) { return x; }\n")}}},
		{Argv: []string{"./bad"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 1 || res.Steps[0].Status != warrenv1.RunStatus_RUN_STATUS_NON_ZERO_EXIT || !strings.Contains(string(res.Steps[0].Stderr), "'x' undeclared") {
		t.Fatalf("compile error: %v", res.Steps)
	}

	res, err = e.c.Run(ctx, &warrenv1.RunRequest{Image: "fn-python", Steps: []*warrenv1.RunStep{
		{Argv: []string{"python3", "-c", "pass"}},
		{Argv: []string{"python3", "-c", "import sys, json, hashlib; xs = sorted(map(int, sys.stdin.read().split())); print(json.dumps(xs), hashlib.sha256(bytes(xs)).hexdigest()[:8])"},
			Stdin: []byte("3 1 2")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 2 || res.Steps[0].Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED {
		t.Fatalf("python3 -c pass: %v", res.Steps)
	}
	if s := res.Steps[1]; s.Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED || string(s.Stdout) != "[1, 2, 3] 039058c6\n" {
		t.Fatalf("python job: %v %q %q", s.Status, s.Stdout, s.Stderr)
	}
}

// TestFnInternalError: the API contract for an environment that fails
// mid-job (its agent killed on the host while the second step runs): the
// call succeeds, the first step's result is there, the second is an
// internal error saying so and the third did not run; an API error is
// kept for jobs Warren could not run at all (an unknown image, above).
// The next job runs, in a new environment.
func TestFnInternalError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	killed := make(chan int, 1)
	go func() {
		defer close(killed)
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			for pid, id := range e.procs() {
				if !strings.HasPrefix(id, "fn-") {
					continue
				}
				st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
				_, ns, _ := strings.Cut(string(st), "NSpid:")
				f := strings.Fields(strings.SplitN(ns, "\n", 2)[0])
				if len(f) < 2 || f[len(f)-1] != "1" {
					continue // not the environment's agent
				}
				if _, err := os.Stat(fmt.Sprintf("/proc/%d/root/w/started", pid)); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					killed <- pid
					return
				}
			}
		}
	}()
	res, err := e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Steps: []*warrenv1.RunStep{
		{Argv: []string{"echo", "first"}},
		{Argv: []string{"sh", "-c", "touch started; sleep 60"}},
		{Argv: []string{"echo", "never"}},
	}})
	if _, ok := <-killed; !ok {
		t.Fatal("the environment's agent was not found while the second step ran")
	}
	if err != nil {
		t.Fatalf("an API error for an environment that failed mid-job: %v", err)
	}
	if len(res.Steps) != 2 || res.Steps[0].Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED || string(res.Steps[0].Stdout) != "first\n" {
		t.Fatalf("steps: %v", res.Steps)
	}
	if s := res.Steps[1]; s.Status != warrenv1.RunStatus_RUN_STATUS_INTERNAL_ERROR || !strings.Contains(s.Error, "environment failed") || s.WallUs != 0 {
		t.Fatalf("the cut step: %v", s)
	}
	res, err = e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Steps: []*warrenv1.RunStep{{Argv: []string{"echo", "ok"}}}})
	if err != nil || res.Steps[0].Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED {
		t.Fatalf("next job: %v %v", res, err)
	}
}

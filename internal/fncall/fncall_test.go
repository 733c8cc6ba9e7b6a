package fncall

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/container"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/testutil"
)

// newService returns a service over a container backend of the test's
// own, with busybox as the image, and removes everything at the end.
func newService(t *testing.T, o Options) (*Service, Image) {
	return newServiceTB(t, o)
}

func newServiceB(b *testing.B) (*Service, Image) { return newServiceTB(b, Options{}) }

func newServiceTB(t testing.TB, o Options) (*Service, Image) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	copts := container.Options{
		StateDir:     filepath.Join(dir, "state"),
		RunDir:       filepath.Join(dir, "run"),
		CgroupParent: fmt.Sprintf("warren-test-fn%d", os.Getpid()),
		Devices:      o.GPUs.All(),
	}
	b, err := container.New(copts)
	if err != nil {
		t.Fatal(err)
	}
	o.Backend = b
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		_ = b.Sweep(context.Background(), nil)
		_ = b.Close()
		_ = cgroups.RemoveParent(copts.CgroupParent)
	})
	return s, Image{Key: "busybox", Layers: backend.DirLayers(testutil.BusyboxRoot(t))}
}

func sh(script string) backend.Step { return backend.Step{Argv: []string{"sh", "-c", script}} }

func run1(t *testing.T, s *Service, img Image, steps ...backend.Step) backend.JobResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.Run(ctx, img, steps)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(res.Steps) == 0 {
		t.Fatal("no step ran")
	}
	return res
}

// TestStatuses: every status a program can cause comes back as that
// status, with the step's measurements, and never as an error.
func TestStatuses(t *testing.T) {
	s, img := newService(t, Options{})
	lim := func(st backend.Step, f func(*backend.StepLimits)) backend.Step { f(&st.Limits); return st }
	cases := []struct {
		name  string
		step  backend.Step
		want  backend.Status
		check func(t *testing.T, r backend.StepResult)
	}{
		{"accepted", sh("echo hello; echo oops >&2"), backend.StatusAccepted, func(t *testing.T, r backend.StepResult) {
			if string(r.Stdout) != "hello\n" || string(r.Stderr) != "oops\n" || r.ExitCode != 0 {
				t.Errorf("stdout %q stderr %q code %d", r.Stdout, r.Stderr, r.ExitCode)
			}
		}},
		{"non_zero_exit", sh("exit 3"), backend.StatusNonZeroExit, func(t *testing.T, r backend.StepResult) {
			if r.ExitCode != 3 {
				t.Errorf("code %d", r.ExitCode)
			}
		}},
		{"signalled", sh("kill -SEGV $$"), backend.StatusSignalled, func(t *testing.T, r backend.StepResult) {
			if r.Signal != syscall.SIGSEGV || r.ExitCode != -1 {
				t.Errorf("signal %v code %d", r.Signal, r.ExitCode)
			}
		}},
		{"cpu_time_limit", lim(sh("while :; do :; done"), func(l *backend.StepLimits) { l.CPU = 500 * time.Millisecond; l.Wall = 10 * time.Second }),
			backend.StatusTimeLimit, func(t *testing.T, r backend.StepResult) {
				if r.CPU < 500*time.Millisecond {
					t.Errorf("cpu %v under the limit", r.CPU)
				}
			}},
		{"sleep_past_wall_limit", lim(sh("sleep 30"), func(l *backend.StepLimits) { l.Wall = 300 * time.Millisecond }),
			backend.StatusTimeLimit, func(t *testing.T, r backend.StepResult) {
				if r.Wall < 300*time.Millisecond || r.Wall > 5*time.Second {
					t.Errorf("wall %v", r.Wall)
				}
			}},
		{"memory_bomb", lim(sh(`x=$(head -c 200000000 /dev/zero | tr '\0' a); echo ${#x}`), func(l *backend.StepLimits) { l.MemoryBytes = 32 << 20 }),
			backend.StatusMemoryLimit, func(t *testing.T, r backend.StepResult) {
				if r.PeakMemoryBytes == 0 {
					t.Error("no peak memory")
				}
			}},
		{"output_flood", lim(backend.Step{Argv: []string{"yes"}}, func(l *backend.StepLimits) { l.OutputBytes = 64 << 10 }),
			backend.StatusOutputLimit, func(t *testing.T, r backend.StepResult) {
				if len(r.Stdout) != 64<<10 || !r.StdoutTruncated {
					t.Errorf("stdout %d bytes, truncated %v", len(r.Stdout), r.StdoutTruncated)
				}
			}},
		{"huge_file", lim(sh("head -c 10000000 /dev/zero > big"), func(l *backend.StepLimits) { l.FileSizeBytes = 1 << 20 }),
			backend.StatusOutputLimit, nil},
		{"missing_output_file", backend.Step{Argv: []string{"true"}, Outputs: []string{"nothere"}}, backend.StatusFileError, func(t *testing.T, r backend.StepResult) {
			if len(r.Files) != 1 || r.Files[0].Err != syscall.ENOENT {
				t.Errorf("files %+v", r.Files)
			}
		}},
		{"no_such_program", backend.Step{Argv: []string{"/nonexistent"}}, backend.StatusFileError, func(t *testing.T, r backend.StepResult) {
			if r.Errno != syscall.ENOENT || r.What != "exec" {
				t.Errorf("errno %v what %q", r.Errno, r.What)
			}
		}},
		{"fork_bomb", lim(sh("b() { b | b & }; b; exec sleep 30"), func(l *backend.StepLimits) { l.Wall = 2 * time.Second; l.Procs = 32 }),
			backend.StatusTimeLimit, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := run1(t, s, img, c.step)
			r := res.Steps[0]
			if r.Status != c.want {
				t.Fatalf("status %v, want %v (code %d signal %v errno %v %q; stderr %q)", r.Status, c.want, r.ExitCode, r.Signal, r.Errno, r.What, r.Stderr)
			}
			if r.Wall <= 0 {
				t.Errorf("wall time %v", r.Wall)
			}
			if c.check != nil {
				c.check(t, r)
			}
			// Whatever the step did, the next job in the pool works.
			if r := run1(t, s, img, sh("echo ok")).Steps[0]; r.Status != backend.StatusAccepted || string(r.Stdout) != "ok\n" {
				t.Fatalf("next job: %v %q %q", r.Status, r.Stdout, r.Stderr)
			}
		})
	}
}

// initStart is the start time of the environment's PID 1, which names
// the environment: a job prints it so that a test knows two jobs shared
// one.
const initStart = "cut -d' ' -f22 /proc/1/stat"

// TestIsolationBetweenJobs: the next job in the same environment sees no
// file, background process or IPC object of the last, even when the last
// made its work directory unreadable to break the reset.
func TestIsolationBetweenJobs(t *testing.T) {
	s, img := newService(t, Options{NoSpare: true, MaxIdle: 1})
	first := run1(t, s, img, sh(initStart+`; echo secret > /w/f; mkdir -p /w/d/e; touch /w/d/e/g /tmp/t /dev/shm/s;
		(setsid sleep 1000 </dev/null >/dev/null 2>&1 &); chmod 000 /w/d/e /w/d; chmod 000 /w; id -u`)).Steps[0]
	if first.Status != backend.StatusAccepted {
		t.Fatalf("first job: %v %q", first.Status, first.Stderr)
	}
	lines := strings.Fields(string(first.Stdout))
	if len(lines) != 2 || lines[1] != "1000" {
		t.Fatalf("first job's output %q: want the init's start time and uid 1000", first.Stdout)
	}
	second := run1(t, s, img, sh(initStart+`; ls -A /w; ls -A /tmp; ls -A /dev/shm; ps -o pid,comm | grep -c sleep; touch /w/new && echo writable`)).Steps[0]
	out := string(second.Stdout)
	if !strings.HasPrefix(out, lines[0]+"\n") {
		t.Fatalf("second job ran in another environment: %q (first %q)", out, lines[0])
	}
	want := lines[0] + "\n0\nwritable\n"
	if out != want {
		t.Fatalf("second job saw:\n%s\nwant:\n%s\nstderr %q", out, want, second.Stderr)
	}
	if st := s.Stats(); st.Created != 1 || st.ResetFailures != 0 {
		t.Fatalf("stats %+v: want one environment, reused", st)
	}
}

// buildMQ builds testdata/mq, a static program that creates or opens a
// POSIX message queue (busybox has no tool for it).
func buildMQ(t *testing.T) []byte {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mq")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/mq")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build mq: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestMessageQueuesWipedBetweenJobs: a POSIX message queue a job creates
// (in its environment's IPC namespace, where no process of the next job
// can list it but any can open it by name) is gone for the next job in
// the same environment.
// It runs with and without a user namespace: with one, root in the
// environment could not mount the queues' filesystem to list them.
func TestMessageQueuesWipedBetweenJobs(t *testing.T) {
	bin := buildMQ(t)
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			if err := container.UserNSSupported(); userns && err != nil {
				t.Skipf("user namespaces for sandboxes: %v", err)
			}
			testMessageQueuesWiped(t, bin, userns)
		})
	}
}

func testMessageQueuesWiped(t *testing.T, bin []byte, userns bool) {
	s, img := newService(t, Options{NoSpare: true, MaxIdle: 1})
	img.UserNS = userns
	mq := []backend.FileIn{{Name: "mq", Data: bin, Mode: 0o755, FromStep: -1}}
	first := run1(t, s, img, backend.Step{Argv: []string{"sh", "-c", initStart + "; ./mq create warren-q && ./mq open warren-q"}, Files: mq}).Steps[0]
	if first.Status != backend.StatusAccepted || !strings.HasSuffix(string(first.Stdout), "\nok\nok\n") {
		t.Fatalf("first job: %v %q %q", first.Status, first.Stdout, first.Stderr)
	}
	start, _, _ := strings.Cut(string(first.Stdout), "\n")
	second := run1(t, s, img, backend.Step{Argv: []string{"sh", "-c", initStart + "; ./mq open warren-q"}, Files: mq}).Steps[0]
	if got, want := string(second.Stdout), start+"\nENOENT\n"; got != want {
		t.Fatalf("second job saw %q (%v, stderr %q), want %q: the queue outlived its job", got, second.Status, second.Stderr, want)
	}
	if st := s.Stats(); st.Created != 1 || st.ResetFailures != 0 {
		t.Fatalf("stats %+v: want one environment, reused", st)
	}
}

// TestDiskQuota: what a job writes is bounded in total, across /w and
// /tmp, by its disk quota, though each file is under the file size
// limit; the step that fills it ends in the output limit, and the next
// job in the same environment finds it empty and whole again. A job
// without a quota runs in another pool, on the node's disk.
func TestDiskQuota(t *testing.T) {
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			if err := container.UserNSSupported(); userns && err != nil {
				t.Skipf("user namespaces for sandboxes: %v", err)
			}
			testDiskQuota(t, userns)
		})
	}
}

func testDiskQuota(t *testing.T, userns bool) {
	s, img := newService(t, Options{NoSpare: true, MaxIdle: 1})
	img.UserNS = userns
	quota := func(st backend.Step) backend.Step { st.Limits.DiskBytes = 16 << 20; return st }
	fill := "head -c 10000000 /dev/zero > /w/a; head -c 10000000 /dev/zero > /tmp/b"
	r := run1(t, s, img, quota(sh(initStart+"; "+fill))).Steps[0]
	if r.Status != backend.StatusOutputLimit || r.Errno != syscall.ENOSPC || r.What != "disk" {
		t.Fatalf("filling the quota: %v %v %q (stderr %q), want output limit, ENOSPC, \"disk\"", r.Status, r.Errno, r.What, r.Stderr)
	}
	start, _, _ := strings.Cut(string(r.Stdout), "\n")
	r = run1(t, s, img, quota(sh(initStart+"; ls -A /w /tmp; head -c 10000000 /dev/zero > /w/a && echo wrote"))).Steps[0]
	if want := start + "\n/tmp:\n\n/w:\nwrote\n"; r.Status != backend.StatusAccepted || string(r.Stdout) != want {
		t.Fatalf("next job in the environment: %v %q (stderr %q), want %q", r.Status, r.Stdout, r.Stderr, want)
	}
	// The image's second pool: the caller, which knows the image is
	// pooled (Pooled), brings no layers, as the daemon does.
	r = run1(t, s, Image{Key: img.Key, UserNS: userns}, sh(fill+" && echo wrote")).Steps[0]
	if r.Status != backend.StatusAccepted || string(r.Stdout) != "wrote\n" {
		t.Fatalf("without a quota: %v %q %q", r.Status, r.Stdout, r.Stderr)
	}
	if st := s.Stats(); st.Created != 2 || st.ResetFailures != 0 {
		t.Fatalf("stats %+v: want one environment per quota, reused", st)
	}
	for _, n := range []int64{1 << 20, -1} {
		if _, err := s.Run(context.Background(), img, []backend.Step{{Argv: []string{"true"}, Limits: backend.StepLimits{DiskBytes: n}}}); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("quota %d: %v, want invalid", n, err)
		}
	}
}

// agentPid is the host pid of the agent (PID 1) of the pool's one idle
// environment.
func agentPid(t *testing.T, s *Service) int {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pools {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.idle) == 1 {
			root := p.idle[0].sb.Root() // /proc/PID/root
			pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(root, "/proc/"), "/root"))
			if err != nil {
				t.Fatalf("root %q: %v", root, err)
			}
			return pid
		}
	}
	t.Fatal("no pool with one idle environment")
	return 0
}

// TestInternalErrorWhenEnvironmentDies: an environment whose agent dies
// while a step runs makes that step an internal error, with the results
// of the steps before it and without an API error (the request was
// served; the environment failed); the environment is replaced. One that
// dies while idle costs nothing but a second draw: the job runs, in a new
// environment.
func TestInternalErrorWhenEnvironmentDies(t *testing.T) {
	s, img := newService(t, Options{NoSpare: true, MaxIdle: 1})
	first := run1(t, s, img, sh(initStart)).Steps[0]
	pid := agentPid(t, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		started := fmt.Sprintf("/proc/%d/root/w/started", pid)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(started); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				return
			}
		}
		t.Error("the second step never started")
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.Run(ctx, img, []backend.Step{sh(initStart + "; echo first"), sh("touch started; sleep 30"), sh("echo never")})
	<-done
	if err != nil {
		t.Fatalf("an API error for an environment that died mid-job: %v", err)
	}
	if len(res.Steps) != 2 {
		t.Fatalf("%d step results, want the first's and the cut one's: %+v", len(res.Steps), res.Steps)
	}
	if a := res.Steps[0]; a.Status != backend.StatusAccepted || string(a.Stdout) != string(first.Stdout)+"first\n" {
		t.Fatalf("step 0: %v %q, want accepted in the first job's environment (%q)", a.Status, a.Stdout, first.Stdout)
	}
	if b := res.Steps[1]; b.Status != backend.StatusInternalError || b.What != "environment" || b.Errno == 0 {
		t.Fatalf("step 1: %v %q %v, want internal error, environment", b.Status, b.What, b.Errno)
	}
	next := run1(t, s, img, sh(initStart)).Steps[0]
	if next.Status != backend.StatusAccepted || string(next.Stdout) == string(first.Stdout) {
		t.Fatalf("next job: %v %q (the dead environment's %q)", next.Status, next.Stdout, first.Stdout)
	}
	if st := s.Stats(); st.Failed != 1 || st.Created != 2 {
		t.Fatalf("stats %+v: want one failed environment, replaced", st)
	}

	// An idle environment killed: the next job runs in a new one.
	pid = agentPid(t, s)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if r := run1(t, s, img, sh("echo ok")).Steps[0]; r.Status != backend.StatusAccepted || string(r.Stdout) != "ok\n" {
		t.Fatalf("after an idle environment died: %v %q %q", r.Status, r.Stdout, r.Stderr)
	}
	if st := s.Stats(); st.Failed != 2 || st.Created != 3 {
		t.Fatalf("stats %+v: want the dead idle environment replaced", st)
	}
}

// TestRefillAfterFailedReset: a job that leaves what the reset cannot
// remove (a directory tree deeper than it walks) costs its environment,
// which is destroyed, and the next job runs in a new one.
func TestRefillAfterFailedReset(t *testing.T) {
	s, img := newService(t, Options{NoSpare: true, MaxIdle: 1})
	deep := strings.Repeat("d/", 60)
	r := run1(t, s, img, sh(initStart+"; mkdir -p "+deep)).Steps[0]
	if r.Status != backend.StatusAccepted {
		t.Fatalf("deep job: %v %q", r.Status, r.Stderr)
	}
	r2 := run1(t, s, img, sh(initStart+"; ls -A /w")).Steps[0]
	if r2.Status != backend.StatusAccepted || string(r2.Stdout) == string(r.Stdout) || strings.Contains(string(r2.Stdout), "d") {
		t.Fatalf("after the failed reset: %q (before %q)", r2.Stdout, r.Stdout)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Destroyed < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.Stats(); st.ResetFailures != 1 || st.Created != 2 || st.Destroyed != 1 {
		t.Fatalf("stats %+v: want one failed reset, its environment destroyed and another made", st)
	}
}

// TestFiles: input files inline and from an earlier step, output files
// back, and no output read through a symlink (the agent reads as root).
func TestFiles(t *testing.T) {
	s, img := newService(t, Options{})
	res := run1(t, s, img,
		backend.Step{Argv: []string{"sh", "-c", "cat in.txt sub/x; tr a-z A-Z < in.txt > out.txt; ln -s /etc/passwd leak"},
			Files:   []backend.FileIn{{Name: "in.txt", Data: []byte("hello\n"), FromStep: -1}, {Name: "sub/x", Data: []byte("x\n"), FromStep: -1, Mode: 0o600}},
			Outputs: []string{"out.txt", "leak"}, Continue: true},
		backend.Step{Argv: []string{"cat", "again.txt"}, Files: []backend.FileIn{{Name: "again.txt", FromStep: 0, From: "out.txt"}}},
	)
	if len(res.Steps) != 2 {
		t.Fatalf("%d steps ran", len(res.Steps))
	}
	a, b := res.Steps[0], res.Steps[1]
	if string(a.Stdout) != "hello\nx\n" || string(a.Files[0].Data) != "HELLO\n" || a.Files[0].Err != 0 {
		t.Fatalf("step 0: %q, files %+v", a.Stdout, a.Files)
	}
	if a.Files[1].Err != syscall.EACCES || len(a.Files[1].Data) != 0 || a.Status != backend.StatusFileError {
		t.Fatalf("output through a symlink: %+v, status %v", a.Files[1], a.Status)
	}
	if b.Status != backend.StatusAccepted || string(b.Stdout) != "HELLO\n" {
		t.Fatalf("step 1: %v %q %q", b.Status, b.Stdout, b.Stderr)
	}
	// Without Continue, a failed step is the last.
	res = run1(t, s, img, sh("exit 1"), sh("echo never"))
	if len(res.Steps) != 1 || res.Steps[0].Status != backend.StatusNonZeroExit {
		t.Fatalf("%+v", res.Steps)
	}
}

// TestParallel: test cases of one problem run at once in separate
// environments, and the pool grows to serve them.
func TestParallel(t *testing.T) {
	s, img := newService(t, Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Run(context.Background(), img, []backend.Step{sh(fmt.Sprintf("echo %d > f; sleep 0.2; cat f", i))})
			if err != nil {
				errs <- err
				return
			}
			if got := string(res.Steps[0].Stdout); got != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("job %d saw %q", i, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := s.Stats(); st.Created < 2 {
		t.Errorf("stats %+v: the pool did not grow", st)
	}
}

// TestUserNamespace: environments in user namespaces (the node's default)
// run jobs as the job user and reset as well.
func TestUserNamespace(t *testing.T) {
	if err := container.UserNSSupported(); err != nil {
		t.Skipf("user namespaces for sandboxes: %v", err)
	}
	s, img := newService(t, Options{NoSpare: true, MaxIdle: 1})
	img.UserNS = true
	for i := range 2 {
		r := run1(t, s, img, sh("ls -A /w; id -u; echo x > /w/f; awk '{print ($2 != 0)}' /proc/self/uid_map")).Steps[0]
		if r.Status != backend.StatusAccepted || string(r.Stdout) != "1000\n1\n" {
			t.Fatalf("job %d: %v %q %q", i, r.Status, r.Stdout, r.Stderr)
		}
	}
	if st := s.Stats(); st.Created != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// BenchmarkRunTrue measures a one-step /bin/true job through the service
// alone (no API): the pool, the JOB frame, the step and the reset.
func BenchmarkRunTrue(b *testing.B) {
	s, img := newServiceB(b)
	steps := []backend.Step{{Argv: []string{"/bin/true"}}}
	ctx := context.Background()
	for b.Loop() {
		if res, err := s.Run(ctx, img, steps); err != nil || res.Steps[0].Status != backend.StatusAccepted {
			b.Fatal(err, res)
		}
	}
}

// TestLimitsApplied: a step's process runs with the rlimits of its
// limits (open files, processes, file size, CPU seconds, no core dumps).
func TestLimitsApplied(t *testing.T) {
	s, img := newService(t, Options{})
	st := sh("ulimit -n; ulimit -u; ulimit -f; ulimit -t; ulimit -c")
	st.Limits = backend.StepLimits{OpenFiles: 77, Procs: 33, FileSizeBytes: 10 << 20, CPU: 2500 * time.Millisecond}
	r := run1(t, s, img, st).Steps[0]
	// busybox ulimit -f counts 512-byte blocks; -t whole seconds, rounded up.
	if want := "77\n33\n20480\n3\n0\n"; r.Status != backend.StatusAccepted || string(r.Stdout) != want {
		t.Fatalf("limits seen: %v %q %q, want %q", r.Status, r.Stdout, r.Stderr, want)
	}
}

// TestForget: a forgotten pool destroys its environments and releases
// its image's layers; the next call of the key makes a new pool.
func TestForget(t *testing.T) {
	s, img := newService(t, Options{})
	released := make(chan struct{})
	img.Release = func() { close(released) }
	run1(t, s, img, sh("true"))
	s.Forget(img.Key)
	select {
	case <-released:
	case <-time.After(30 * time.Second):
		t.Fatal("layers not released")
	}
	if st := s.Stats(); st.Idle != 0 || st.Destroyed != st.Created {
		t.Fatalf("stats %+v: environments left", st)
	}
	img.Release = nil
	run1(t, s, img, sh("true"))
	if !s.Pooled(img.Key) {
		t.Fatal("no new pool")
	}
}

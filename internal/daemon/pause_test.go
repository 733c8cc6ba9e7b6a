package daemon

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// counter starts a background process in sandbox id that counts in
// /count, and returns a reader of the count from the host (through the
// init's root: file calls are refused while paused).
func counter(t *testing.T, e *env, id string) func() int {
	t.Helper()
	ctx := ctxT(t)
	if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id,
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /count.tmp; mv /count.tmp /count; sleep 0.01; done"}); err != nil {
		t.Fatal(err)
	}
	read := func() int {
		s, err := e.m.lookup(id)
		if err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		root := s.sb.Root()
		s.mu.Unlock()
		b, _ := os.ReadFile(filepath.Join(root, "count"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	waitUntil(t, "the counter to count", func() bool { return read() > 5 })
	return read
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPauseFreezesRefusesAndResumes: Pause with reclaim stops a counter
// and gives back the sandbox's page cache; exec, files and signals are
// refused with a conflict that says it is paused; a background process's
// timeout does not count the pause; Resume lets the counter go on from
// where it stopped; Pause and Resume are refused in the wrong state.
func TestPauseFreezesRefusesAndResumes(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "nap"})
	if res := e.sh("nap", "head -c 32000000 /dev/zero > /cache && sync /cache && cat /cache > /dev/null && echo ok"); string(res.GetStdout()) != "ok\n" {
		t.Fatalf("fill the page cache: %v", res)
	}
	count := counter(t, e, "nap")
	// A process of a 1.5 s timeout: paused for longer than that, it must
	// not be killed for the time it spent frozen.
	if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "nap", Shell: "sleep 1000", TimeoutMs: 1500}); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "nap"})
	wantCat(t, err, errdefs.Conflict, "sandbox nap is RUNNING: resume needs PAUSED")

	res, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "nap", Reclaim: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pause: %v", res)
	if res.GetSandbox().GetState() != statePaused || res.GetSandbox().GetPausedAtUnixMs() == 0 {
		t.Fatalf("paused sandbox: %v", res.GetSandbox())
	}
	if b, a := res.GetBefore(), res.GetAfter(); b.GetFile() < 30<<20 || a.GetFile() > b.GetFile()-28<<20 || a.GetBytes() >= b.GetBytes() {
		t.Errorf("memory before %v after %v: want the 32 MB of page cache given back", b, a)
	}
	c0 := count()
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "nap", Argv: []string{"true"}})
	wantCat(t, err, errdefs.Conflict, "sandbox nap is PAUSED (its processes are frozen: Resume it first): exec needs RUNNING")
	_, err = e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "nap", Path: "/count"})
	wantCat(t, err, errdefs.Conflict, "is PAUSED")
	_, err = e.m.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: "nap", ProcessId: "p-1"})
	wantCat(t, err, errdefs.Conflict, "is PAUSED")
	_, err = e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "nap"})
	wantCat(t, err, errdefs.Conflict, "pause needs RUNNING")
	list, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: "nap"})
	if err != nil || len(list.GetProcesses()) != 2 {
		t.Fatalf("list processes while paused: %v %v", list, err)
	}
	time.Sleep(2 * time.Second)
	if c := count(); c != c0 {
		t.Fatalf("the counter went from %d to %d while paused", c0, c)
	}
	r, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "nap"})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetSandbox().GetState() != stateRunning || r.GetPausedMs() < 2000 || r.GetSandbox().GetPausedTotalMs() < 2000 {
		t.Fatalf("resumed: %v", r)
	}
	waitUntil(t, "the resumed counter to count on", func() bool { return count() > c0+5 })
	if c := count(); c > c0+300 {
		t.Fatalf("the counter jumped from %d to %d", c0, c)
	}
	// 2 s paused, 1.5 s timeout: it still runs now, and is killed once
	// it has run 1.5 s.
	p, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "nap", ProcessId: "p-2", TimeoutMs: 100})
	wantCat(t, err, errdefs.DeadlineExceeded, "still running")
	if p, err = e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "nap", ProcessId: "p-2"}); err != nil || !p.GetTimedOut() {
		t.Fatalf("the process with a timeout: %v %v, want it killed by its timeout after the resume", p, err)
	}
	if out := e.sh("nap", "echo alive"); string(out.GetStdout()) != "alive\n" {
		t.Fatalf("exec after resume: %v", out)
	}
	if e.gauge("paused") != 0 || e.gauge("running") != 1 {
		t.Fatalf("gauges paused %v running %v", e.gauge("paused"), e.gauge("running"))
	}
}

// TestPausedSurvivesRestartAndDeletes: a PAUSED sandbox stays PAUSED (and
// frozen) across a daemon restart, is resumed by the new daemon with its
// processes back, and a paused sandbox's delete leaves nothing behind.
func TestPausedSurvivesRestartAndDeletes(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "nap"})
	count := counter(t, e, "nap")
	if _, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "nap"}); err != nil {
		t.Fatal(err)
	}
	c0 := count()
	e.stop()
	e.start()
	sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "nap"})
	if err != nil || sb.GetState() != statePaused {
		t.Fatalf("after restart: %v %v", sb, err)
	}
	time.Sleep(200 * time.Millisecond)
	if c := count(); c != c0 {
		t.Fatalf("the counter went from %d to %d across the restart", c0, c)
	}
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "nap", Argv: []string{"true"}})
	wantCat(t, err, errdefs.Conflict, "is PAUSED")
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "nap"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the counter to count after the restart", func() bool { return count() > c0+5 })
	list, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: "nap"})
	if err != nil || len(list.GetProcesses()) != 1 || !list.GetProcesses()[0].GetRunning() {
		t.Fatalf("processes adopted on resume: %v %v", list, err)
	}
	// Paused again, then deleted: nothing is left.
	if _, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "nap", Reclaim: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "nap"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the paused sandbox's resources to go", func() bool { return sweepLeftovers(e, "nap") == "" })
	if e.gauge("paused") != 0 {
		t.Fatalf("gauge paused %v after delete", e.gauge("paused"))
	}
}

// TestPauseByLabel: PauseByLabel pauses exactly the RUNNING sandboxes
// whose labels match, with one event each and a last one with totals;
// ResumeByLabel resumes them; a selector without labels is refused.
func TestPauseByLabel(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	for _, id := range []string{"a1", "a2", "a3"} {
		e.create(&warrenv1.CreateRequest{Id: id, Labels: map[string]string{"batch": "a"}})
	}
	e.create(&warrenv1.CreateRequest{Id: "b1", Labels: map[string]string{"batch": "b"}})
	collect := func(call func(send func(*warrenv1.ByLabelEvent) error) error) []*warrenv1.ByLabelEvent {
		t.Helper()
		var mu sync.Mutex
		var evs []*warrenv1.ByLabelEvent
		if err := call(func(ev *warrenv1.ByLabelEvent) error {
			mu.Lock()
			defer mu.Unlock()
			evs = append(evs, ev)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return evs
	}
	evs := collect(func(send func(*warrenv1.ByLabelEvent) error) error {
		return e.m.PauseByLabel(ctx, &warrenv1.PauseByLabelRequest{Labels: map[string]string{"batch": "a"}, Reclaim: true, Parallelism: 2}, send)
	})
	if len(evs) != 4 || !evs[3].GetDone() || evs[3].GetTotal() != 3 || evs[3].GetFailed() != 0 {
		t.Fatalf("events %v", evs)
	}
	seen := map[string]bool{}
	for i, ev := range evs[:3] {
		if ev.GetError() != "" || ev.GetPaused().GetSandbox().GetState() != statePaused || ev.GetCompleted() != int32(i+1) {
			t.Errorf("event %v", ev)
		}
		seen[ev.GetSandboxId()] = true
	}
	if !seen["a1"] || !seen["a2"] || !seen["a3"] {
		t.Fatalf("paused %v", seen)
	}
	for id, want := range map[string]state{"a1": statePaused, "a2": statePaused, "a3": statePaused, "b1": stateRunning} {
		if sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: id}); err != nil || sb.GetState() != want {
			t.Errorf("%s: %v %v, want %s", id, sb.GetState(), err, stateName(want))
		}
	}
	// Again: nothing RUNNING matches any more.
	evs = collect(func(send func(*warrenv1.ByLabelEvent) error) error {
		return e.m.PauseByLabel(ctx, &warrenv1.PauseByLabelRequest{Labels: map[string]string{"batch": "a"}}, send)
	})
	if len(evs) != 1 || !evs[0].GetDone() || evs[0].GetTotal() != 0 {
		t.Fatalf("second pause: %v", evs)
	}
	evs = collect(func(send func(*warrenv1.ByLabelEvent) error) error {
		return e.m.ResumeByLabel(ctx, &warrenv1.ResumeByLabelRequest{Labels: map[string]string{"batch": "a"}}, send)
	})
	if len(evs) != 4 || evs[3].GetTotal() != 3 || evs[3].GetFailed() != 0 {
		t.Fatalf("resume events %v", evs)
	}
	for _, id := range []string{"a1", "a2", "a3", "b1"} {
		if out := e.sh(id, "echo ok"); string(out.GetStdout()) != "ok\n" {
			t.Fatalf("%s after resume: %v", id, out)
		}
	}
	err := e.m.PauseByLabel(ctx, &warrenv1.PauseByLabelRequest{}, func(*warrenv1.ByLabelEvent) error { return nil })
	wantCat(t, err, errdefs.Invalid, "labels are required")
}

// TestExecTimeoutDoesNotCountPause: an exec's timeout counts the time its
// sandbox runs, not the time it is paused: a 3 s sleep under a 1.5 s
// timeout, with the sandbox paused for 2 s of it, is killed for its
// timeout only after 1.5 s of running time, not while paused.
func TestExecTimeoutDoesNotCountPause(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "nap"})
	type result struct {
		res *warrenv1.ExecResult
		err error
		at  time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		res, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "nap", Shell: "sleep 5", TimeoutMs: 1500})
		done <- result{res, err, time.Since(start)}
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "nap"}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Fatalf("the exec ended while its sandbox was paused: %v %v after %v", r.res, r.err, r.at)
	case <-time.After(2 * time.Second):
	}
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "nap"}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !r.res.GetTimedOut() {
		t.Fatalf("exec: %v %v, want it killed by its timeout", r.res, r.err)
	}
	// 0.3 s ran before the pause, 1.2 s after it: about 3.5 s in all.
	if r.at < 3300*time.Millisecond || r.at > 4500*time.Millisecond {
		t.Fatalf("the exec timed out after %v, want about 3.5 s (1.5 s of running time plus the 2 s pause)", r.at)
	}
}

// TestKeepWhilePausedStopsTheLifetime: a sandbox created with
// keep_while_paused does not expire while PAUSED, not even across a
// daemon restart, when a plain paused sandbox of the same timeout does;
// ExtendTimeout while it is paused sets what it gets back; Resume lets
// the lifetime count again from then.
func TestKeepWhilePausedStopsTheLifetime(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "keep", TimeoutSeconds: 2, KeepWhilePaused: true})
	e.create(&warrenv1.CreateRequest{Id: "plain", TimeoutSeconds: 2})
	deadline := time.Now().Add(2 * time.Second)
	for _, id := range []string{"keep", "plain"} {
		if _, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "keep"})
	if err != nil || sb.GetExpiresAtUnixMs() != 0 || sb.GetLifetimeLeftMs() <= 0 || sb.GetLifetimeLeftMs() > 2000 {
		t.Fatalf("paused keep_while_paused sandbox: %v %v", sb, err)
	}
	eventually(t, 20*time.Second, "the plain paused sandbox to expire", func() bool {
		_, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "plain"})
		return errdefs.CategoryOf(err) == errdefs.NotFound
	})
	e.stop()
	e.start()
	waitUntil(t, "the kept sandbox's deadline to pass", func() bool { return time.Now().After(deadline.Add(time.Second)) })
	sb, err = e.m.Get(ctx, &warrenv1.GetRequest{Id: "keep"})
	if err != nil || sb.GetState() != statePaused {
		t.Fatalf("keep_while_paused sandbox past its deadline: %v %v", sb, err)
	}
	sb, err = e.m.ExtendTimeout(ctx, &warrenv1.ExtendTimeoutRequest{Id: "keep", TimeoutSeconds: 60})
	if err != nil || sb.GetExpiresAtUnixMs() != 0 || sb.GetLifetimeLeftMs() != 60000 {
		t.Fatalf("extend while paused: %v %v", sb, err)
	}
	before := time.Now()
	res, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.UnixMilli(res.GetSandbox().GetExpiresAtUnixMs())
	if exp.Before(before.Add(59*time.Second)) || exp.After(time.Now().Add(61*time.Second)) || res.GetSandbox().GetLifetimeLeftMs() != 0 {
		t.Fatalf("deadline after resume %v (resumed at %v): %v", exp, before, res.GetSandbox())
	}
	if _, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "keep", Argv: []string{"true"}}); err != nil {
		t.Fatalf("exec after resume: %v", err)
	}
}

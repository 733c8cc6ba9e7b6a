package daemon

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/metrics"
	"github.com/warrenrl/warren/internal/sandboxfs"
	"github.com/warrenrl/warren/internal/server"
	"github.com/warrenrl/warren/internal/store"
)

func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	sb := e.create(&warrenv1.CreateRequest{
		Id: "life", Env: map[string]string{"FOO": "sandbox", "BAR": "sandbox"}, Workdir: "/tmp",
		Labels: map[string]string{"team": "rl", "run": "1"}, Hostname: "box",
		Resources: &warrenv1.Resources{CpuMillis: 500, MemoryBytes: 128 << 20, PidsMax: 100},
	})
	if sb.GetState() != stateRunning || sb.GetId() != "life" || sb.GetBackend() != "container" ||
		sb.GetResources().GetMemoryBytes() != 128<<20 || sb.GetExpiresAtUnixMs() <= time.Now().UnixMilli() {
		t.Fatalf("created %v", sb)
	}
	got, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "life"})
	if err != nil || got.GetState() != stateRunning || got.GetLabels()["team"] != "rl" {
		t.Fatalf("get %v %v", got, err)
	}
	other := e.create(&warrenv1.CreateRequest{Labels: map[string]string{"team": "rl"}})
	if !ValidID(other.GetId()) || len(other.GetId()) != generatedIDLen {
		t.Fatalf("generated id %q", other.GetId())
	}
	list, err := e.m.List(ctx, &warrenv1.ListRequest{Labels: map[string]string{"team": "rl", "run": "1"}})
	if err != nil || len(list.GetSandboxes()) != 1 || list.GetSandboxes()[0].GetId() != "life" {
		t.Fatalf("list by labels %v %v", list, err)
	}
	list, _ = e.m.List(ctx, &warrenv1.ListRequest{})
	if len(list.GetSandboxes()) != 2 {
		t.Fatalf("list %v", list)
	}
	if e.gauge(metrics.StateRunning) != 2 {
		t.Fatalf("running gauge %v", e.gauge(metrics.StateRunning))
	}

	// Env merge, default PATH and HOME, workdir as cwd, hostname.
	res := e.exec(&warrenv1.ExecRequest{SandboxId: "life", Shell: `echo "$FOO $BAR $HOME $PATH"; pwd; hostname; echo err >&2; exit 3`,
		Env: map[string]string{"BAR": "request"}})
	want := "sandbox request /root " + defaultPATH + "\n/tmp\nbox\n"
	if string(res.GetStdout()) != want || string(res.GetStderr()) != "err\n" || res.GetExitCode() != 3 || res.GetPid() <= 0 {
		t.Fatalf("exec result %v", res)
	}
	// argv, cwd, stdin.
	res = e.exec(&warrenv1.ExecRequest{SandboxId: "life", Argv: []string{"cat"}, Stdin: []byte("from stdin"), Cwd: "/"})
	if string(res.GetStdout()) != "from stdin" || res.GetExitCode() != 0 {
		t.Fatalf("stdin %v", res)
	}
	// Without stdin, stdin is /dev/null: cat ends at once.
	res = e.exec(&warrenv1.ExecRequest{SandboxId: "life", Argv: []string{"cat"}})
	if len(res.GetStdout()) != 0 || res.GetExitCode() != 0 {
		t.Fatalf("no stdin %v", res)
	}
	// Users by name and number.
	res = e.exec(&warrenv1.ExecRequest{SandboxId: "life", Shell: "id -u; id -g; echo $HOME", User: "nobody"})
	if string(res.GetStdout()) != "65534\n65534\n/nonexistent\n" {
		t.Fatalf("user nobody %q %q", res.GetStdout(), res.GetStderr())
	}
	res = e.exec(&warrenv1.ExecRequest{SandboxId: "life", Shell: "id -u; id -g", User: "1234:99"})
	if string(res.GetStdout()) != "1234\n99\n" {
		t.Fatalf("user 1234:99 %q", res.GetStdout())
	}
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "life", Argv: []string{"true"}, User: "ghost"})
	wantCat(t, err, errdefs.Invalid, "unknown user")
	// A missing program.
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "life", Argv: []string{"/no/such/program"}})
	if err == nil || errdefs.CategoryOf(err) == errdefs.Unknown {
		t.Fatalf("missing program: %v", err)
	}
	// Signals.
	res = e.sh("life", "kill -TERM $$")
	if res.GetExitCode() != -1 || res.GetSignal() != int32(syscall.SIGTERM) {
		t.Fatalf("signalled %v", res)
	}

	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "life"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.m.Get(ctx, &warrenv1.GetRequest{Id: "life"})
	wantCat(t, err, errdefs.NotFound, "life")
	_, err = e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "life"})
	wantCat(t, err, errdefs.NotFound, "life")
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "life", Argv: []string{"true"}})
	wantCat(t, err, errdefs.NotFound, "life")
	if e.gauge(metrics.StateRunning) != 1 || e.deleted(metrics.ReasonUser) != 1 {
		t.Fatalf("gauges after delete: running %v deleted %v", e.gauge(metrics.StateRunning), e.deleted(metrics.ReasonUser))
	}
	if n := metricValue(t, e.metrics.CreateSeconds); n != 2 {
		t.Fatalf("create histogram count %v", n)
	}
	if n := metricValue(t, e.metrics.ExecSeconds); n < 5 {
		t.Fatalf("exec histogram count %v", n)
	}
	if v := metricValue(t, e.metrics.Errors.WithLabelValues("not_found", "Get")); v != 1 {
		t.Fatalf("errors{not_found,Get} = %v", v)
	}
}

func TestCreateErrorsRollBack(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "dup"})
	_, err := e.m.Create(ctx, &warrenv1.CreateRequest{Id: "dup", Image: "busybox"})
	wantCat(t, err, errdefs.Conflict, "sandbox dup already exists")
	_, err = e.m.Create(ctx, &warrenv1.CreateRequest{Id: "noimg", Image: "nosuchimage"})
	wantCat(t, err, errdefs.NotFound, "nosuchimage")
	_, err = e.m.Create(ctx, &warrenv1.CreateRequest{Id: "nobackend", Image: "busybox", Backend: "fullvm"})
	wantCat(t, err, errdefs.Invalid, "unknown backend")
	_, err = e.m.Create(ctx, &warrenv1.CreateRequest{Image: "busybox", Resources: &warrenv1.Resources{MemoryBytes: 1}})
	wantCat(t, err, errdefs.Invalid, "memory_bytes")
	// The backend refuses: a workdir that is a file.
	_, err = e.m.Create(ctx, &warrenv1.CreateRequest{Id: "badwd", Image: "busybox", Workdir: "/bin/busybox"})
	if err == nil {
		// Some backends accept any workdir; then it must be usable.
		if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "badwd"}); err != nil {
			t.Fatal(err)
		}
	}
	// A create cancelled by its caller rolls back.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = e.m.Create(cctx, &warrenv1.CreateRequest{Id: "cancelled", Image: "busybox"})
	if err == nil {
		t.Fatal("cancelled create succeeded")
	}
	list, _ := e.m.List(ctx, &warrenv1.ListRequest{})
	if len(list.GetSandboxes()) != 1 {
		t.Fatalf("failed creates left sandboxes: %v", list)
	}
	recs, err := e.m.store.List()
	if err != nil || len(recs) != 1 || recs[0].ID != "dup" {
		t.Fatalf("failed creates left records: %v %v", recs, err)
	}
	if e.gauge(metrics.StateCreating) != 0 || e.gauge(metrics.StateRunning) != 1 {
		t.Fatalf("gauges creating %v running %v", e.gauge(metrics.StateCreating), e.gauge(metrics.StateRunning))
	}
	if v := metricValue(t, e.metrics.Errors.WithLabelValues("conflict", "Create")); v != 1 {
		t.Fatalf("errors{conflict,Create} = %v", v)
	}
}

func TestExecOutputLimitsAndTimeout(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "out"})

	res := e.exec(&warrenv1.ExecRequest{SandboxId: "out", Shell: "head -c 300000 /dev/zero; head -c 10 /dev/zero >&2", OutputLimitBytes: 1000})
	if len(res.GetStdout()) != 1000 || !res.GetStdoutTruncated() || res.GetStdoutDroppedBytes() != 299000 ||
		len(res.GetStderr()) != 10 || res.GetStderrTruncated() || res.GetExitCode() != 0 {
		t.Fatalf("capped: out %d trunc %v dropped %d err %d", len(res.GetStdout()), res.GetStdoutTruncated(), res.GetStdoutDroppedBytes(), len(res.GetStderr()))
	}

	// `yes` never ends: the timeout kills it, reading never blocks it.
	start := time.Now()
	res = e.exec(&warrenv1.ExecRequest{SandboxId: "out", Argv: []string{"yes"}, TimeoutMs: 500})
	took := time.Since(start)
	if !res.GetTimedOut() || res.GetSignal() != int32(syscall.SIGKILL) || res.GetExitCode() != -1 ||
		len(res.GetStdout()) != DefaultOutputLimit || res.GetStdoutDroppedBytes() == 0 || res.GetOomKilled() {
		t.Fatalf("yes: timed out %v signal %d out %d dropped %d", res.GetTimedOut(), res.GetSignal(), len(res.GetStdout()), res.GetStdoutDroppedBytes())
	}
	if took > 5*time.Second || res.GetDurationMs() < 450 {
		t.Fatalf("yes took %v (duration_ms %d)", took, res.GetDurationMs())
	}

	// The timeout kills the whole process group.
	res = e.exec(&warrenv1.ExecRequest{SandboxId: "out", Shell: "sleep 1000 & sleep 1000", TimeoutMs: 300})
	if !res.GetTimedOut() {
		t.Fatalf("group: %v", res)
	}
	eventually(t, 5*time.Second, "sleepers to be gone", func() bool {
		ps := e.sh("out", "ps -o comm | grep -c sleep || true")
		return strings.TrimSpace(string(ps.GetStdout())) == "0"
	})

	// A background child holding stdout does not hang the call.
	start = time.Now()
	res = e.sh("out", "sleep 30 & echo started")
	if string(res.GetStdout()) != "started\n" || time.Since(start) > 3*time.Second {
		t.Fatalf("held stdout: %q after %v", res.GetStdout(), time.Since(start))
	}

	// Bad requests.
	for _, req := range []*warrenv1.ExecRequest{
		{SandboxId: "out"},
		{SandboxId: "out", Argv: []string{"true"}, Shell: "true"},
		{SandboxId: "out", Argv: []string{"true"}, OutputLimitBytes: MaxOutputLimit + 1},
		{SandboxId: "out", Argv: []string{"true"}, TimeoutMs: -1},
		{SandboxId: "out", Argv: []string{"true"}, Cwd: "relative"},
		{SandboxId: "out", Argv: []string{"true"}, Env: map[string]string{"A=B": "1"}},
		{SandboxId: "", Argv: []string{"true"}},
	} {
		_, err := e.m.Exec(ctx, req)
		wantCat(t, err, errdefs.Invalid, "")
	}
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "cancel"})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "cancel", Shell: "sleep 1000 & sleep 1000"})
		done <- err
	}()
	eventually(t, 10*time.Second, "sleepers to start", func() bool {
		ps := e.sh("cancel", "ps -o comm | grep -c sleep || true")
		return strings.TrimSpace(string(ps.GetStdout())) == "2"
	})
	cancel()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "cancel") {
			t.Fatalf("cancelled exec: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled exec did not return")
	}
	eventually(t, 5*time.Second, "sleepers to be killed", func() bool {
		ps := e.sh("cancel", "ps -o comm | grep -c sleep || true")
		return strings.TrimSpace(string(ps.GetStdout())) == "0"
	})
}

func TestExecStream(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "stream"})
	ctx := ctxT(t)
	var mu sync.Mutex
	var events []*warrenv1.ExecEvent
	var firstAt, lastAt time.Time
	err := e.m.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "stream", Shell: "echo one; sleep 0.5; echo two >&2; echo three"},
		func(ev *warrenv1.ExecEvent) error {
			mu.Lock()
			defer mu.Unlock()
			if firstAt.IsZero() {
				firstAt = time.Now()
			}
			lastAt = time.Now()
			events = append(events, ev)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	// "one" comes half a second before the end.
	if lastAt.Sub(firstAt) < 300*time.Millisecond {
		t.Fatalf("first chunk came %v before the result: not streamed", lastAt.Sub(firstAt))
	}
	var stdout, stderr bytes.Buffer
	for _, ev := range events[:len(events)-1] {
		stdout.Write(ev.GetStdout())
		stderr.Write(ev.GetStderr())
		if ev.GetResult() != nil {
			t.Fatal("result before the end")
		}
	}
	res := events[len(events)-1].GetResult()
	if stdout.String() != "one\nthree\n" || stderr.String() != "two\n" || res == nil || res.GetExitCode() != 0 ||
		len(res.GetStdout()) != 0 || len(res.GetStderr()) != 0 {
		t.Fatalf("stream: %q %q %v", stdout.String(), stderr.String(), res)
	}

	// Caps apply to what is sent.
	events = nil
	sent := 0
	err = e.m.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "stream", Shell: "head -c 100000 /dev/zero", OutputLimitBytes: 4096},
		func(ev *warrenv1.ExecEvent) error {
			sent += len(ev.GetStdout())
			events = append(events, ev)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	res = events[len(events)-1].GetResult()
	if sent != 4096 || !res.GetStdoutTruncated() || res.GetStdoutDroppedBytes() != 100000-4096 {
		t.Fatalf("sent %d, result %v", sent, res)
	}

	// A failing send kills the command.
	start := time.Now()
	err = e.m.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "stream", Shell: "echo x; sleep 1000"},
		func(*warrenv1.ExecEvent) error { return fmt.Errorf("client went away") })
	if err == nil || time.Since(start) > 10*time.Second {
		t.Fatalf("send failure: %v after %v", err, time.Since(start))
	}
}

func TestIdempotencyKey(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "idem"})
	ctx := ctxT(t)
	req := &warrenv1.ExecRequest{SandboxId: "idem", Shell: "sleep 0.3; echo ran >> /tmp/count; wc -l < /tmp/count", IdempotencyKey: "k-1"}
	var wg sync.WaitGroup
	results := make([]*warrenv1.ExecResult, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.m.Exec(ctx, req)
			if err != nil {
				t.Error(err)
			}
			results[i] = res
		}()
	}
	wg.Wait()
	for _, r := range results {
		if strings.TrimSpace(string(r.GetStdout())) != "1" || r.GetPid() != results[0].GetPid() {
			t.Fatalf("results %v", results)
		}
	}
	// A later retry, also streamed, replays the result.
	var out bytes.Buffer
	var final *warrenv1.ExecResult
	err := e.m.ExecStream(ctx, req, func(ev *warrenv1.ExecEvent) error {
		out.Write(ev.GetStdout())
		if ev.GetResult() != nil {
			final = ev.GetResult()
		}
		return nil
	})
	if err != nil || strings.TrimSpace(out.String()) != "1" || final.GetPid() != results[0].GetPid() {
		t.Fatalf("stream replay %q %v %v", out.String(), final, err)
	}
	if got := e.sh("idem", "wc -l < /tmp/count"); strings.TrimSpace(string(got.GetStdout())) != "1" {
		t.Fatalf("ran %s times", got.GetStdout())
	}
	// Another key runs again.
	req.IdempotencyKey = "k-2"
	if res := e.exec(req); strings.TrimSpace(string(res.GetStdout())) != "2" {
		t.Fatalf("second key: %q", res.GetStdout())
	}
	// A request that never started is not cached.
	bad := &warrenv1.ExecRequest{SandboxId: "idem", Argv: []string{"true"}, User: "ghost", IdempotencyKey: "k-3"}
	if _, err := e.m.Exec(ctx, bad); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatal(err)
	}
	bad.User = ""
	if _, err := e.m.Exec(ctx, bad); err != nil {
		t.Fatalf("retry after a request that never ran: %v", err)
	}
}

func TestOOMKilled(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "oom", Resources: &warrenv1.Resources{MemoryBytes: 16 << 20}})
	// dd's buffer is 256 MiB; touching it exceeds the limit.
	res := e.exec(&warrenv1.ExecRequest{SandboxId: "oom", Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"}})
	if !res.GetOomKilled() || res.GetSignal() != int32(syscall.SIGKILL) || res.GetTimedOut() {
		t.Fatalf("oom: %v", res)
	}
	res = e.sh("oom", "echo fine")
	if res.GetOomKilled() || string(res.GetStdout()) != "fine\n" {
		t.Fatalf("after oom: %v", res)
	}
}

func TestBackgroundProcesses(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "bg"})
	ctx := ctxT(t)

	cat, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "bg", Argv: []string{"cat"}, Stdin: []byte("first ")})
	if err != nil {
		t.Fatal(err)
	}
	if cat.GetProcessId() != "p-1" || !cat.GetRunning() || cat.GetPid() <= 0 {
		t.Fatalf("start %v", cat)
	}
	sleeper, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "bg", Shell: "sleep 1000"})
	if err != nil || sleeper.GetProcessId() != "p-2" {
		t.Fatalf("%v %v", sleeper, err)
	}
	if _, err := e.m.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: "bg", ProcessId: "p-1", Data: []byte("second")}); err != nil {
		t.Fatal(err)
	}
	// Still running: a bounded wait times out.
	_, err = e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "bg", ProcessId: "p-1", TimeoutMs: 100})
	wantCat(t, err, errdefs.DeadlineExceeded, "still running")
	if _, err := e.m.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: "bg", ProcessId: "p-1", Close: true}); err != nil {
		t.Fatal(err)
	}
	res, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "bg", ProcessId: "p-1"})
	if err != nil || string(res.GetStdout()) != "first second" || res.GetExitCode() != 0 {
		t.Fatalf("wait cat %v %v", res, err)
	}
	_, err = e.m.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: "bg", ProcessId: "p-1", Data: []byte("x")})
	wantCat(t, err, errdefs.Conflict, "")

	list, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: "bg"})
	if err != nil || len(list.GetProcesses()) != 2 || list.GetProcesses()[0].GetRunning() || !list.GetProcesses()[1].GetRunning() ||
		list.GetProcesses()[0].GetResult() == nil {
		t.Fatalf("list %v %v", list, err)
	}

	// Cancelling a wait returns; the process runs on.
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = e.m.WaitProcess(wctx, &warrenv1.WaitProcessRequest{SandboxId: "bg", ProcessId: "p-2"})
	cancel()
	if err == nil {
		t.Fatal("cancelled wait returned no error")
	}
	if _, err := e.m.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: "bg", ProcessId: "p-2"}); err != nil {
		t.Fatal(err)
	}
	res, err = e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "bg", ProcessId: "p-2", TimeoutMs: 10000})
	if err != nil || res.GetSignal() != int32(syscall.SIGTERM) || res.GetExitCode() != -1 {
		t.Fatalf("sigterm: %v %v", res, err)
	}
	_, err = e.m.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: "bg", ProcessId: "p-2"})
	wantCat(t, err, errdefs.Conflict, "has exited")
	_, err = e.m.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: "bg", ProcessId: "p-9"})
	wantCat(t, err, errdefs.NotFound, "p-9")
	_, err = e.m.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: "bg", ProcessId: "p-2", Signal: 99})
	wantCat(t, err, errdefs.Invalid, "signal")

	// Group signals reach the children; a timeout kills the group.
	p3, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "bg", Shell: "sleep 1000 & sleep 1000", TimeoutMs: 300})
	if err != nil {
		t.Fatal(err)
	}
	res, err = e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "bg", ProcessId: p3.GetProcessId()})
	if err != nil || !res.GetTimedOut() {
		t.Fatalf("timeout %v %v", res, err)
	}
	p4, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "bg", Shell: "trap '' TERM; sleep 1000 & wait"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := e.m.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: "bg", ProcessId: p4.GetProcessId(), Signal: int32(syscall.SIGKILL), Group: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "bg", ProcessId: p4.GetProcessId(), TimeoutMs: 10000}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "group to be gone", func() bool {
		ps := e.sh("bg", "ps -o comm | grep -c sleep || true")
		return strings.TrimSpace(string(ps.GetStdout())) == "0"
	})

	// Deleting the sandbox ends its processes.
	p5, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "bg", Shell: "sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := e.m.lookup("bg")
	s.mu.Lock()
	proc := s.procs[p5.GetProcessId()]
	s.mu.Unlock()
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "bg"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-proc.done:
	case <-time.After(10 * time.Second):
		t.Fatal("process survived its sandbox")
	}
}

func TestProcessCap(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "cap"})
	s, _ := e.m.lookup("cap")
	// Pretend the sandbox already has the maximum.
	s.mu.Lock()
	s.procPending = MaxProcessesPerSandbox
	s.mu.Unlock()
	_, err := e.m.StartProcess(ctxT(t), &warrenv1.ExecRequest{SandboxId: "cap", Argv: []string{"true"}})
	wantCat(t, err, errdefs.Exhausted, "maximum")
	s.mu.Lock()
	s.procPending = 0
	s.mu.Unlock()
}

func TestTimeouts(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "short", TimeoutSeconds: 1})
	e.create(&warrenv1.CreateRequest{Id: "extended", TimeoutSeconds: 1})
	sb, err := e.m.ExtendTimeout(ctx, &warrenv1.ExtendTimeoutRequest{Id: "extended", TimeoutSeconds: 120})
	if err != nil || sb.GetExpiresAtUnixMs() < time.Now().Add(100*time.Second).UnixMilli() {
		t.Fatalf("extend %v %v", sb, err)
	}
	_, err = e.m.ExtendTimeout(ctx, &warrenv1.ExtendTimeoutRequest{Id: "extended", TimeoutSeconds: 90000})
	wantCat(t, err, errdefs.Invalid, "timeout_seconds")
	_, err = e.m.ExtendTimeout(ctx, &warrenv1.ExtendTimeoutRequest{Id: "nope", TimeoutSeconds: 10})
	wantCat(t, err, errdefs.NotFound, "nope")
	eventually(t, 10*time.Second, "short sandbox to expire", func() bool {
		_, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "short"})
		return errdefs.CategoryOf(err) == errdefs.NotFound
	})
	if _, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "extended"}); err != nil {
		t.Fatalf("extended sandbox: %v", err)
	}
	if e.deleted(metrics.ReasonTimeout) != 1 {
		t.Fatalf("deleted{timeout} = %v", e.deleted(metrics.ReasonTimeout))
	}
	if recs, _ := e.m.store.List(); len(recs) != 1 {
		t.Fatalf("records %v", recs)
	}
}

func TestDeadSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "doomed"})
	killInit(t, e.m, "doomed")
	eventually(t, 10*time.Second, "sandbox to be dead", func() bool {
		sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "doomed"})
		return err == nil && sb.GetState() == stateStopped
	})
	sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "doomed"})
	if sb.GetDeadReason() != "init exited" {
		t.Fatalf("dead reason %q", sb.GetDeadReason())
	}
	_, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "doomed", Argv: []string{"true"}})
	wantCat(t, err, errdefs.Conflict, "sandbox doomed is STOPPED (init exited): exec needs RUNNING")
	_, err = e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "doomed", Path: "/etc/passwd"})
	wantCat(t, err, errdefs.Conflict, "is STOPPED")
	rec, err := e.m.store.Get("doomed")
	if err != nil || rec.State() != stateStopped {
		t.Fatalf("record %v %v", rec, err)
	}
	if e.gauge(metrics.StateStopped) != 1 || e.gauge(metrics.StateRunning) != 0 || e.deleted(metrics.ReasonDead) != 1 {
		t.Fatal("gauges of a dead sandbox")
	}
	// Its resources are gone; the record stays until Delete.
	eventually(t, 10*time.Second, "resources to be released", func() bool {
		s, _ := e.m.lookup("doomed")
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.release == nil
	})
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "doomed"}); err != nil {
		t.Fatal(err)
	}
	if e.gauge(metrics.StateStopped) != 0 || e.deleted(metrics.ReasonUser) != 0 {
		t.Fatal("gauges after deleting a dead sandbox")
	}
}

func TestConcurrentCreatesAndDeletes(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("par-%d", i)
			if _, err := e.m.Create(ctx, &warrenv1.CreateRequest{Id: id, Image: "busybox"}); err != nil {
				t.Error(err)
				return
			}
			res, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "hostname"})
			if err != nil || string(res.GetStdout()) != id+"\n" {
				t.Errorf("exec in %s: %v %v", id, res, err)
			}
		}()
	}
	// Racing creates of one id: exactly one wins.
	var wins, conflicts int
	var mu sync.Mutex
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.m.Create(ctx, &warrenv1.CreateRequest{Id: "contested", Image: "busybox"})
			mu.Lock()
			defer mu.Unlock()
			switch errdefs.CategoryOf(err) {
			case errdefs.Unknown:
				wins++
			case errdefs.Conflict:
				conflicts++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 || conflicts != 3 {
		t.Fatalf("contested: %d wins %d conflicts", wins, conflicts)
	}
	// Concurrent deletes of one sandbox: all succeed or find it gone.
	var errs []error
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "contested"})
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: fmt.Sprintf("par-%d", i)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && errdefs.CategoryOf(err) != errdefs.NotFound {
			t.Fatalf("concurrent delete: %v", err)
		}
	}
	list, _ := e.m.List(ctx, &warrenv1.ListRequest{})
	if len(list.GetSandboxes()) != 0 || e.gauge(metrics.StateRunning) != 0 || e.gauge(metrics.StateDeleting) != 0 {
		t.Fatalf("left %v", list)
	}
}

func TestRestartAdopts(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "survivor", Labels: map[string]string{"k": "v"}})
	e.sh("survivor", "echo kept > /tmp/state")
	e.create(&warrenv1.CreateRequest{Id: "victim"})
	e.create(&warrenv1.CreateRequest{Id: "expiring", TimeoutSeconds: 2})
	e.create(&warrenv1.CreateRequest{Id: "ghost"})
	// A background process outlives the daemon: its output while no
	// daemon runs is kept, its stdin and wait work from the next daemon.
	if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "survivor", Shell: "echo before; sleep 0.5; echo during; read x; echo after $x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "survivor", Shell: "echo done early; exit 4"}); err != nil {
		t.Fatal(err)
	}
	survivorExpires := func() int64 {
		sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "survivor"})
		if err != nil {
			t.Fatal(err)
		}
		return sb.GetExpiresAtUnixMs()
	}()
	killInitLater := func() {}
	{
		s, _ := e.m.lookup("victim")
		s.mu.Lock()
		blob := s.backendState
		s.mu.Unlock()
		killInitLater = func() { killPid(t, blob) }
	}
	// A crash mid-create leaves a CREATING record; "ghost" loses its
	// record but keeps its resources, as an orphan.
	e.stop()
	st, err := store.Open(e.dir + "/state")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(store.Record{ID: "halfmade", Backend: "container", Sandbox: &warrenv1.Sandbox{Id: "halfmade", State: stateCreating}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete("ghost"); err != nil {
		t.Fatal(err)
	}
	st.Close()
	killInitLater()
	time.Sleep(2100 * time.Millisecond) // "expiring" passes its deadline while the daemon is down

	e.start()
	sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "survivor"})
	if err != nil || sb.GetState() != stateRunning || sb.GetLabels()["k"] != "v" || sb.GetExpiresAtUnixMs() != survivorExpires {
		t.Fatalf("survivor %v %v", sb, err)
	}
	if res := e.sh("survivor", "cat /tmp/state"); string(res.GetStdout()) != "kept\n" {
		t.Fatalf("survivor state %q", res.GetStdout())
	}
	l, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: "survivor"})
	if err != nil || len(l.GetProcesses()) != 2 || !l.GetProcesses()[0].GetRunning() || l.GetProcesses()[0].GetProcessId() != "p-1" ||
		l.GetProcesses()[1].GetRunning() || l.GetProcesses()[1].GetResult().GetExitCode() != 4 ||
		l.GetProcesses()[0].GetArgv()[0] != "/bin/sh" {
		t.Fatalf("processes after restart %v %v", l, err)
	}
	if _, err := e.m.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: "survivor", ProcessId: "p-1", Data: []byte("x\n"), Close: true}); err != nil {
		t.Fatal(err)
	}
	res, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "survivor", ProcessId: "p-1"})
	if err != nil || string(res.GetStdout()) != "before\nduring\nafter x\n" || res.GetExitCode() != 0 {
		t.Fatalf("wait after restart %v %v", res, err)
	}
	res, err = e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "survivor", ProcessId: "p-2"})
	if err != nil || string(res.GetStdout()) != "done early\n" || res.GetExitCode() != 4 {
		t.Fatalf("wait for the one that exited while the daemon was down %v %v", res, err)
	}
	if p, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "survivor", Argv: []string{"true"}}); err != nil || p.GetProcessId() != "p-3" {
		t.Fatalf("next process %v %v", p, err)
	}
	sb, err = e.m.Get(ctx, &warrenv1.GetRequest{Id: "victim"})
	if err != nil || sb.GetState() != stateStopped || !strings.Contains(sb.GetDeadReason(), "daemon was down") {
		t.Fatalf("victim %v %v", sb, err)
	}
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "victim", Argv: []string{"true"}})
	wantCat(t, err, errdefs.Conflict, "is STOPPED")
	for _, id := range []string{"expiring", "halfmade", "ghost"} {
		_, err = e.m.Get(ctx, &warrenv1.GetRequest{Id: id})
		wantCat(t, err, errdefs.NotFound, id)
	}
	// The orphan's resources were swept.
	if res := sweepLeftovers(e, "ghost"); res != "" {
		t.Fatalf("orphan not swept: %s", res)
	}
	if e.gauge(metrics.StateRunning) != 1 || e.gauge(metrics.StateStopped) != 1 {
		t.Fatalf("gauges running %v dead %v", e.gauge(metrics.StateRunning), e.gauge(metrics.StateStopped))
	}
	// The adopted sandbox is watched again: its death is noticed.
	killInit(t, e.m, "survivor")
	eventually(t, 10*time.Second, "adopted sandbox death", func() bool {
		sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "survivor"})
		return err == nil && sb.GetState() == stateStopped
	})
}

func TestImages(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	imgs, err := e.m.ListImages(ctx, &warrenv1.ListImagesRequest{})
	if err != nil || len(imgs.GetImages()) != 1 || imgs.GetImages()[0].GetName() != "busybox" ||
		len(imgs.GetImages()[0].GetLayers()) == 0 || imgs.GetImages()[0].GetSizeBytes() <= 0 {
		t.Fatalf("list %v %v", imgs, err)
	}
	img, err := e.m.ImportImage(ctx, &warrenv1.ImportImageRequest{Name: "bb2", Path: busyboxRoot(t)})
	if err != nil || img.GetId() != imgs.GetImages()[0].GetId() {
		t.Fatalf("import dir %v %v", img, err)
	}
	// A tarball, through TarOut of a sandbox and ImportImageTar.
	e.create(&warrenv1.CreateRequest{Id: "user", Image: "bb2"})
	var tarball bytes.Buffer
	if err := e.m.TarOut(ctx, "user", "/", &tarball, sandboxfs.TarOptions{}); err != nil {
		t.Fatal(err)
	}
	tarImg, err := e.m.ImportImageTar(ctx, "fromtar", bytes.NewReader(tarball.Bytes()))
	if err != nil || tarImg.GetName() != "fromtar" {
		t.Fatalf("import tar %v %v", tarImg, err)
	}
	tarPath := e.dir + "/image.tar"
	if err := writeFile(tarPath, tarball.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.ImportImage(ctx, &warrenv1.ImportImageRequest{Name: "fromfile", Path: tarPath}); err != nil {
		t.Fatal(err)
	}
	e.create(&warrenv1.CreateRequest{Id: "fromtar", Image: "fromfile"})
	if res := e.sh("fromtar", "echo works"); string(res.GetStdout()) != "works\n" {
		t.Fatalf("sandbox of a tar image: %v", res)
	}
	_, err = e.m.ImportImage(ctx, &warrenv1.ImportImageRequest{Name: "missing", Path: "/no/such/path"})
	wantCat(t, err, errdefs.NotFound, "does not exist")
	_, err = e.m.ImportImage(ctx, &warrenv1.ImportImageRequest{Name: "rel", Path: "relative"})
	wantCat(t, err, errdefs.Invalid, "absolute")
	_, err = e.m.GetImage(ctx, &warrenv1.GetImageRequest{Name: "nope"})
	wantCat(t, err, errdefs.NotFound, "nope")

	_, err = e.m.RemoveImage(ctx, &warrenv1.RemoveImageRequest{Name: "bb2"})
	wantCat(t, err, errdefs.Conflict, "used by sandbox user")
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "user"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.RemoveImage(ctx, &warrenv1.RemoveImageRequest{Name: "bb2"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.m.GetImage(ctx, &warrenv1.GetImageRequest{Name: "bb2"})
	wantCat(t, err, errdefs.NotFound, "bb2")
	// A dead sandbox does not hold its image.
	e.create(&warrenv1.CreateRequest{Id: "deaduser", Image: "fromtar"})
	killInit(t, e.m, "deaduser")
	eventually(t, 10*time.Second, "death", func() bool {
		sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "deaduser"})
		return sb.GetState() == stateStopped
	})
	if _, err := e.m.RemoveImage(ctx, &warrenv1.RemoveImageRequest{Name: "fromtar"}); err != nil {
		t.Fatal(err)
	}
}

func TestVersion(t *testing.T) {
	e := newEnv(t)
	v, err := e.m.Version(ctxT(t), &warrenv1.VersionRequest{})
	if err != nil || v.GetVersion() != Version || len(v.GetBackends()) != 1 || v.GetBackends()[0] != "container" || v.GetCgroupMode() == "" {
		t.Fatalf("%v %v", v, err)
	}
}

// The Manager is what the API server serves.
var _ server.Manager = (*Manager)(nil)

func TestDeleteDuringExec(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "busy"})
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "busy", Shell: "sleep 1000"})
		done <- err
	}()
	eventually(t, 10*time.Second, "sleep to start", func() bool {
		ps := e.sh("busy", "ps -o comm | grep -c sleep || true")
		return strings.TrimSpace(string(ps.GetStdout())) == "1"
	})
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "busy"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		// Killed with its sandbox: either an error or a SIGKILL result.
		if err != nil && errdefs.CategoryOf(err) != errdefs.Conflict && errdefs.CategoryOf(err) != errdefs.NotFound {
			t.Fatalf("exec in a deleted sandbox: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("exec outlived its sandbox")
	}
}

func TestCloseStopsExecAndKeepsSandboxes(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "keep"})
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "keep", Shell: "sleep 1000"})
		done <- err
	}()
	eventually(t, 10*time.Second, "sleep to start", func() bool {
		ps := e.sh("keep", "ps -o comm | grep -c sleep || true")
		return strings.TrimSpace(string(ps.GetStdout())) == "1"
	})
	e.stop()
	select {
	case err := <-done:
		wantCat(t, err, errdefs.Unavailable, "shutting down")
	case <-time.After(15 * time.Second):
		t.Fatal("exec survived Close")
	}
	e.start()
	if res := e.sh("keep", "echo still here"); string(res.GetStdout()) != "still here\n" {
		t.Fatalf("after restart: %v", res)
	}
}

// TestWriteStdinHonoursCtxBehindBlockedWrite: a WriteStdin queued behind
// an earlier write the process does not read (StartProcess's own stdin,
// larger than the pipe) gives up when its call ends, instead of hanging
// until the process exits.
func TestWriteStdinHonoursCtxBehindBlockedWrite(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "stdin"})
	ctx := ctxT(t)
	big := bytes.Repeat([]byte("x"), 8<<20) // far beyond any pipe and socket buffer
	p, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "stdin", Shell: "sleep 1000", Stdin: big})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.m.WriteStdin(wctx, &warrenv1.WriteStdinRequest{SandboxId: "stdin", ProcessId: p.GetProcessId(), Data: []byte("more")})
		done <- err
	}()
	select {
	case err := <-done:
		wantCat(t, err, errdefs.DeadlineExceeded, "stdin")
	case <-time.After(10 * time.Second):
		t.Fatal("WriteStdin still blocked 10s after its deadline passed")
	}
	if _, err := e.m.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: "stdin", ProcessId: p.GetProcessId(), Signal: 9}); err != nil {
		t.Fatal(err)
	}
}

// TestRestartProcessCallsWaitForProcessAdoption: after a restart the
// daemon serves before every sandbox's background processes are listed
// again (adoptAllProcesses); the first process call on a sandbox, even a
// StartProcess, must see them: the new process gets the next id, not a
// reused one, and the list is complete.
func TestRestartProcessCallsWaitForProcessAdoption(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	const n = 24
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb%02d", i)
		e.create(&warrenv1.CreateRequest{Id: ids[i]})
		if p, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: ids[i], Argv: []string{"sleep", "1000"}}); err != nil || p.GetProcessId() != "p-1" {
			t.Fatalf("start %v %v", p, err)
		}
	}
	e.stop()
	e.start()
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := n - 1; i >= 0; i-- {
		wg.Add(1)
		go func(id string, list bool) {
			defer wg.Done()
			if list {
				l, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: id})
				if err != nil || len(l.GetProcesses()) < 1 || l.GetProcesses()[0].GetProcessId() != "p-1" || !l.GetProcesses()[0].GetRunning() {
					errs <- fmt.Errorf("%s: list right after the restart: %v %v", id, l, err)
				}
				return
			}
			if p, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"true"}}); err != nil || p.GetProcessId() != "p-2" {
				errs <- fmt.Errorf("%s: first call after the restart started %v (want p-2) %v", id, p, err)
			}
		}(ids[i], i%2 == 1)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A create sent again with its idempotency key answers the sandbox the
// first made (even while that one is still being made) instead of making
// a second; the id derives from the key, the key is kept on the sandbox,
// and the key with another image is a Conflict.
func TestCreateWithIdempotencyKeyMakesOneSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	req := &warrenv1.CreateRequest{Image: "busybox", IdempotencyKey: "key-1", Labels: map[string]string{"k": "1"}}
	var (
		wg   sync.WaitGroup
		got  [4]*warrenv1.Sandbox
		errs [4]error
	)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = e.m.Create(ctx, proto.Clone(req).(*warrenv1.CreateRequest))
		}()
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i].GetId() != IDForKey("", "key-1") || got[i].GetState() != stateRunning || got[i].GetIdempotencyKey() != "key-1" {
			t.Fatalf("create %d with the key: %v %v", i, got[i], errs[i])
		}
	}
	list, err := e.m.List(ctx, &warrenv1.ListRequest{Labels: map[string]string{"k": "1"}})
	if err != nil || len(list.GetSandboxes()) != 1 {
		t.Fatalf("4 creates with one key made %d sandboxes (%v)", len(list.GetSandboxes()), err)
	}
	again, err := e.m.Create(ctx, proto.Clone(req).(*warrenv1.CreateRequest))
	if err != nil || again.GetId() != got[0].GetId() || again.GetCreatedAtUnixMs() != got[0].GetCreatedAtUnixMs() {
		t.Fatalf("create again with the key: %v %v", again, err)
	}
	if _, err := e.m.Create(ctx, &warrenv1.CreateRequest{IdempotencyKey: "key-1", Image: "other"}); errdefs.CategoryOf(err) != errdefs.Conflict || errdefs.IsAlreadyExists(err) {
		t.Fatalf("the key with another image: %v, want Conflict", err)
	}
	if _, err := e.m.Create(ctx, &warrenv1.CreateRequest{Image: "busybox", Id: got[0].GetId()}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("the id without the key: %v, want AlreadyExists", err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: got[0].GetId()}); err != nil {
		t.Fatal(err)
	}
}

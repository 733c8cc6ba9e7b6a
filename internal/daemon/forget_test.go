package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"syscall"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// TestProcessesPastTheLimitOverALifetime: MaxProcessesPerSandbox bounds
// the processes running at once, not those started over the sandbox's
// life. 3,000 quick ones, four at a time, all start; the daemon and the
// agent hold at most MaxExitedProcesses exited records (plus the running
// ones), and the latest exits still have their results and output. Before
// the agent forgot records, the 1,025th start was refused.
func TestProcessesPastTheLimitOverALifetime(t *testing.T) {
	const total, workers = 3000, 4
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "many"})
	ctx := ctxT(t)
	s, _ := e.m.lookup("many")
	s.mu.Lock()
	host := s.sb.(backend.Background)
	s.mu.Unlock()

	ids := make([]string, total)
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				p, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "many", Argv: []string{"echo", strconv.Itoa(i)}})
				if err != nil {
					errs <- fmt.Errorf("start %d: %w", i, err)
					return
				}
				ids[i] = p.GetProcessId()
				res, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "many", ProcessId: p.GetProcessId()})
				if err != nil || string(res.GetStdout()) != strconv.Itoa(i)+"\n" {
					errs <- fmt.Errorf("wait %d: %v %v", i, res, err)
					return
				}
			}
		}()
	}
	// Bounded all along, not only at the end.
	bound := func(when int) {
		s.mu.Lock()
		daemonRecs, exited := len(s.procs), len(s.exited)
		s.mu.Unlock()
		recs, err := host.ListBackground(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A few exits may be seen by the agent before the daemon, and
		// forgets may be in flight: the workers bound both.
		if exited > MaxExitedProcesses || daemonRecs > MaxExitedProcesses+workers || len(recs) > MaxExitedProcesses+2*workers {
			t.Fatalf("after %d processes: daemon holds %d records (%d exited), agent %d; want at most %d exited",
				when, daemonRecs, exited, len(recs), MaxExitedProcesses)
		}
	}
feed:
	for i := range total {
		select {
		case next <- i:
		case err := <-errs:
			t.Fatal(err)
			break feed
		}
		if i > 0 && i%500 == 0 {
			bound(i)
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	bound(total)

	// A recent exit keeps its result and output; one long gone is
	// forgotten (NotFound), not answered wrongly.
	i := total - MaxExitedProcesses/2
	res, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "many", ProcessId: ids[i]})
	if err != nil || string(res.GetStdout()) != strconv.Itoa(i)+"\n" || res.GetExitCode() != 0 {
		t.Fatalf("wait for recent process %s: %v %v", ids[i], res, err)
	}
	_, err = e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "many", ProcessId: ids[0]})
	wantCat(t, err, errdefs.NotFound, ids[0])
	list, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: "many"})
	if err != nil || len(list.GetProcesses()) != MaxExitedProcesses {
		t.Fatalf("list: %d processes, want %d: %v", len(list.GetProcesses()), MaxExitedProcesses, err)
	}
	if last := list.GetProcesses()[len(list.GetProcesses())-1]; last.GetRunning() || last.GetResult() == nil {
		t.Fatalf("latest listed: %v", last)
	}
}

// oldAgent is the process host of a sandbox created before an upgrade:
// its agent (protocol version 2) cannot forget.
type oldAgent struct{ forgets int }

func (*oldAgent) StartBackground(context.Context, backend.ProcSpec, backend.BackgroundOpts) (int, error) {
	return 0, errdefs.Unsupportedf("fake")
}
func (*oldAgent) ListBackground(context.Context) ([]backend.BackgroundInfo, error) { return nil, nil }
func (*oldAgent) AttachBackground(context.Context, int, int64, int64) (backend.Attachment, error) {
	return nil, errdefs.Unsupportedf("fake")
}
func (*oldAgent) OpenStdin(context.Context, int) (backend.StdinWriter, error) {
	return nil, errdefs.Unsupportedf("fake")
}
func (*oldAgent) CloseStdin(context.Context, int) error                             { return nil }
func (*oldAgent) SignalBackground(context.Context, int, syscall.Signal, bool) error { return nil }
func (*oldAgent) ResizeBackground(context.Context, int, uint16, uint16) error       { return nil }
func (a *oldAgent) ForgetBackground(context.Context, int) error {
	a.forgets++
	return fmt.Errorf("agent: %w", errdefs.Unsupportedf("sandbox agent predates forgetting processes"))
}

// TestRetireKeepsAllWithAnOldAgent: where the agent cannot forget, the
// daemon keeps every exited record too, so that what it lists matches
// what the agent holds (and the agent's own limit refuses starts, as
// before the upgrade); it asks the old agent once, not at every exit.
func TestRetireKeepsAllWithAnOldAgent(t *testing.T) {
	m := testManager()
	m.log = slog.New(slog.DiscardHandler)
	host := &oldAgent{}
	s := &sandbox{id: "old", procs: map[string]*process{}}
	for i := 1; i <= MaxExitedProcesses+10; i++ {
		p := newProcess("old", host, procTag{ID: fmt.Sprintf("p-%d", i), Seq: i}, 100+i, false)
		p.finish(backend.ExitStatus{}, false, 0)
		s.procs[p.id] = p
		m.retire(s, p)
	}
	if len(s.procs) != MaxExitedProcesses+10 || !s.keepExited || host.forgets != 1 {
		t.Fatalf("old agent: daemon keeps %d records (keepExited %v) after %d forgets; want all %d after 1",
			len(s.procs), s.keepExited, host.forgets, MaxExitedProcesses+10)
	}
}

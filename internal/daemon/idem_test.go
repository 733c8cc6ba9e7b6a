package daemon

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// run simulates the daemon's exec path: the first caller runs, the others
// wait for its outcome.
func idemRun(c *idemCache, sandbox, key string, runs *atomic.Int32, hold <-chan struct{}) (*warrenv1.ExecResult, error) {
	e, first := c.begin(sandbox, key)
	if !first {
		<-e.done
		return e.outcome()
	}
	runs.Add(1)
	if hold != nil {
		<-hold
	}
	res := &warrenv1.ExecResult{Stdout: []byte("out"), ExitCode: 3}
	c.finish(e, res, nil)
	return res, nil
}

func TestIdemConcurrentRetriesRunOnce(t *testing.T) {
	c := newIdemCache(time.Minute, 1<<20)
	var runs atomic.Int32
	hold := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]*warrenv1.ExecResult, 16)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := idemRun(c, "sb", "k1", &runs, hold)
			if err != nil {
				t.Error(err)
			}
			results[i] = res
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(hold)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("ran %d times", runs.Load())
	}
	for _, r := range results {
		if string(r.GetStdout()) != "out" || r.GetExitCode() != 3 {
			t.Fatalf("result %v", r)
		}
	}
	// Returned results are copies.
	results[0].Stdout[0] = 'X'
	if res, _ := idemRun(c, "sb", "k1", &runs, nil); string(res.GetStdout()) != "out" {
		t.Fatalf("cache mutated through a returned result: %q", res.GetStdout())
	}
	// Other keys and sandboxes run.
	_, _ = idemRun(c, "sb", "k2", &runs, nil)
	_, _ = idemRun(c, "sb2", "k1", &runs, nil)
	if runs.Load() != 3 {
		t.Fatalf("ran %d times", runs.Load())
	}
}

func TestIdemExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newIdemCache(10*time.Minute, 1<<20)
	c.now = func() time.Time { return now }
	var runs atomic.Int32
	_, _ = idemRun(c, "sb", "k", &runs, nil)
	now = now.Add(9 * time.Minute)
	_, _ = idemRun(c, "sb", "k", &runs, nil)
	if runs.Load() != 1 {
		t.Fatal("expired too early")
	}
	now = now.Add(2 * time.Minute)
	c.prune()
	if c.len() != 0 {
		t.Fatalf("%d entries after expiry", c.len())
	}
	_, _ = idemRun(c, "sb", "k", &runs, nil)
	if runs.Load() != 2 {
		t.Fatal("expired entry reused")
	}
}

func TestIdemAbandonAndErrors(t *testing.T) {
	c := newIdemCache(time.Minute, 1<<20)
	e, first := c.begin("sb", "k")
	if !first {
		t.Fatal("not first")
	}
	waiter, first2 := c.begin("sb", "k")
	if first2 || waiter != e {
		t.Fatal("second begin is first")
	}
	c.abandon(e, errdefs.Invalidf("bad user"))
	<-waiter.done
	if _, err := waiter.outcome(); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("waiter got %v", err)
	}
	// Abandoned: the next request runs.
	e, first = c.begin("sb", "k")
	if !first {
		t.Fatal("abandoned key was kept")
	}
	// An error after the start is final.
	c.finish(e, nil, errdefs.Internalf("lost the agent"))
	e2, first := c.begin("sb", "k")
	if first {
		t.Fatal("failed run is not final")
	}
	if _, err := e2.outcome(); errdefs.CategoryOf(err) != errdefs.Internal {
		t.Fatalf("got %v", err)
	}
}

func TestIdemDropSandboxAndSizeCap(t *testing.T) {
	c := newIdemCache(time.Minute, 10)
	var runs atomic.Int32
	_, _ = idemRun(c, "a", "1", &runs, nil) // 3 bytes
	_, _ = idemRun(c, "b", "1", &runs, nil) // 3
	_, _ = idemRun(c, "a", "2", &runs, nil) // 3
	if c.len() != 3 || c.bytes != 9 {
		t.Fatalf("len %d bytes %d", c.len(), c.bytes)
	}
	_, _ = idemRun(c, "b", "2", &runs, nil) // 12 > 10: the oldest goes
	if c.len() != 3 || c.bytes != 9 {
		t.Fatalf("after cap: len %d bytes %d", c.len(), c.bytes)
	}
	if _, first := c.begin("a", "1"); !first {
		t.Fatal("oldest entry not evicted")
	}
	c.dropSandbox("b")
	if c.len() != 2 || c.bytes != 3 { // a/2 finished, a/1 in flight
		t.Fatalf("after drop: len %d bytes %d", c.len(), c.bytes)
	}
	// An in-flight entry of a dropped sandbox is not stored when it ends.
	e, _ := c.begin("c", "1")
	c.dropSandbox("c")
	c.finish(e, &warrenv1.ExecResult{Stdout: []byte("zz")}, nil)
	if _, first := c.begin("c", "1"); !first {
		t.Fatal("entry of a dropped sandbox stored")
	}
}

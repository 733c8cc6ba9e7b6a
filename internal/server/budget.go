package server

import (
	"context"
	"time"

	"golang.org/x/time/rate"

	"github.com/warrenrl/warren/internal/errdefs"
)

// A harness's call budget (docs/SECURITY.md, "Harness sandboxes"): every
// call on a harness's route, RPC or plain endpoint, spends a token of the
// route's own bucket; an empty bucket makes the call wait its turn for up
// to budgetWait, then refuses it Exhausted. The route already bounds what
// a harness holds at once (connections, streams, buffers); the budget
// bounds how fast it can make the daemon work, so that a harness in a
// loop of calls cannot take the daemon's CPU from the trainer's calls and
// other harnesses'. The trainer's own calls (the node's sockets) are not
// budgeted.

// Defaults of Config.HarnessCallsPerSecond and HarnessCallBurst: far
// above what a harness driving its children needs (an exec a step), far
// below what the daemon serves in all (exec peaks near 1,700/s on 2
// cores).
const (
	DefaultHarnessCallsPerSecond = 200
	DefaultHarnessCallBurst      = 400
	// budgetWait is the longest a call waits for a token before it is
	// refused: a harness slightly over its rate is slowed, one far over
	// is told so.
	budgetWait = time.Second
)

type budgetKey struct{}

// budget is one harness route's bucket.
type budget struct {
	l     *rate.Limiter
	rate  float64
	burst int
}

// newBudget returns a bucket of perSecond tokens a second holding at most
// burst; nil (unbudgeted) for a negative rate.
func newBudget(perSecond float64, burst int) *budget {
	if perSecond < 0 {
		return nil
	}
	if perSecond == 0 {
		perSecond = DefaultHarnessCallsPerSecond
	}
	if burst <= 0 {
		burst = max(DefaultHarnessCallBurst, int(perSecond))
	}
	return &budget{l: rate.NewLimiter(rate.Limit(perSecond), burst), rate: perSecond, burst: burst}
}

func withBudget(ctx context.Context, b *budget) context.Context {
	if b == nil {
		return ctx
	}
	return context.WithValue(ctx, budgetKey{}, b)
}

// spend takes a token for one call of harness h, waiting for it up to
// budgetWait; Exhausted when the harness is further over its budget.
func spend(ctx context.Context, h string) error {
	b, _ := ctx.Value(budgetKey{}).(*budget)
	if b == nil {
		return nil
	}
	if b.l.Allow() {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, budgetWait)
	defer cancel()
	if err := b.l.Wait(wctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.New(errdefs.Exhausted, "harness %s is over its call budget (%g calls/s, bursts of %d: warren serve --harness-calls-per-second): slow down and retry", h, b.rate, b.burst)
	}
	return nil
}

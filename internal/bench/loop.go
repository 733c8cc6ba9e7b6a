package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Iteration runs one iteration and returns one duration per metric of
// the benchmark (always the same number, in the same order).
type Iteration func(ctx context.Context, worker int) ([]time.Duration, error)

// LoopResult holds the samples of the measured iterations.
type LoopResult struct {
	// Samples[m] are the samples of metric m, from successful iterations.
	Samples [][]time.Duration
	// Wall is the wall time of the measured iterations (warm-up excluded).
	Wall     time.Duration
	Done     int // successful measured iterations
	Errors   int // failed measured iterations
	FirstErr error
}

// PerSecond is the rate of successful iterations over the wall time.
func (r LoopResult) PerSecond() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.Done) / r.Wall.Seconds()
}

// Loop runs warmup iterations, then n measured ones, each time with
// concurrency workers pulling iterations until the count is reached.
// metrics is the number of durations fn returns. The loop stops early when
// ctx ends or, after maxErrors failures, returning what it measured.
func Loop(ctx context.Context, n, warmup, concurrency, metrics int, fn Iteration) LoopResult {
	if concurrency < 1 {
		concurrency = 1
	}
	if warmup > 0 {
		runN(ctx, warmup, concurrency, metrics, fn)
	}
	start := time.Now()
	res := runN(ctx, n, concurrency, metrics, fn)
	res.Wall = time.Since(start)
	return res
}

// maxErrors stops a loop whose iterations keep failing.
const maxErrors = 50

func runN(ctx context.Context, n, concurrency, metrics int, fn Iteration) LoopResult {
	var (
		next   atomic.Int64
		failed atomic.Int64
		mu     sync.Mutex
		res    = LoopResult{Samples: make([][]time.Duration, metrics)}
		wg     sync.WaitGroup
	)
	for m := range res.Samples {
		res.Samples[m] = make([]time.Duration, 0, n)
	}
	for w := 0; w < min(concurrency, n); w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for ctx.Err() == nil && failed.Load() < maxErrors && next.Add(1) <= int64(n) {
				d, err := fn(ctx, w)
				mu.Lock()
				if err != nil {
					failed.Add(1)
					res.Errors++
					if res.FirstErr == nil {
						res.FirstErr = err
					}
				} else {
					res.Done++
					for m := 0; m < metrics && m < len(d); m++ {
						res.Samples[m] = append(res.Samples[m], d[m])
					}
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	return res
}

package bench

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Alternate runs two iterations (two daemons, or one daemon with a
// feature on and off) in turn: warmup unmeasured runs of each, then n
// measured rounds whose order flips every round (ABBA), so that the
// machine's drift and each run's aftermath (writeback, reaping) hit both
// alike. It returns each side's samples, round by round; names label the
// sides in errors.
func Alternate(ctx context.Context, its [2]Iteration, names [2]string, warmup, n int) ([2][][]time.Duration, error) {
	var samples [2][][]time.Duration
	run := func(i int) ([]time.Duration, error) {
		d, err := its[i](ctx, 0)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[i], err)
		}
		return d, nil
	}
	for i := range 2 * warmup {
		if _, err := run(i % 2); err != nil {
			return samples, err
		}
	}
	for i := range n {
		for _, s := range abba(i) {
			d, err := run(s)
			if err != nil {
				return samples, err
			}
			samples[s] = append(samples[s], d)
		}
	}
	return samples, nil
}

// Paired compares metric idx of two sides' round-by-round samples: each
// side's p50 and p99 in ms, the ratio of the p50s (num over den) and the
// median of the round-by-round ratios, which holds when the machine's
// speed drifts.
type Paired struct {
	NumP50, NumP99, DenP50, DenP99 float64
	RatioP50, PairRatioMedian      float64
}

// ComparePaired computes Paired of metric idx, num's over den's.
func ComparePaired(num, den [][]time.Duration, idx int) Paired {
	var a, b, r []float64
	for i := range min(len(num), len(den)) {
		x, y := msOf(num[i][idx]), msOf(den[i][idx])
		a, b, r = append(a, x), append(b, y), append(r, x/y)
	}
	slices.Sort(a)
	slices.Sort(b)
	slices.Sort(r)
	return Paired{
		NumP50: Percentile(a, 50), NumP99: Percentile(a, 99), DenP50: Percentile(b, 50), DenP99: Percentile(b, 99),
		RatioP50: Percentile(a, 50) / Percentile(b, 50), PairRatioMedian: Percentile(r, 50),
	}
}

// abba is the order of the two sides in round i: flipped every round.
func abba(i int) [2]int {
	if i%2 == 1 {
		return [2]int{1, 0}
	}
	return [2]int{0, 1}
}

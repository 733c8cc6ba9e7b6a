// Package bench implements `warren bench`: latency, throughput and density
// benchmarks of a Warren daemon, driven through the public client package,
// with peer rows (crun, runc, unshare+chroot, nsenter) measured in the same
// run on the same busybox root filesystem.
//
// The pieces are small files: percentiles (stats.go), the concurrent
// iteration loop (loop.go), table and JSON output (output.go), the private
// daemon and image setup (env.go), peer runners (peers.go), /proc readers
// (procfs.go) and one file per benchmark (create.go, exec.go, density.go,
// layers.go, ondemand.go). The last two share a deterministic synthetic
// workspace + toolkit (synth.go), a recorded agent tool-call sequence
// (toolcalls.go), /proc/diskstats write meters (diskstats.go) and a
// loop-mounted scratch disk for the private daemon's state (scratchdisk.go).
package bench

import (
	"math"
	"slices"
	"time"
)

// Summary describes a set of duration samples, in milliseconds.
type Summary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	Mean float64 `json:"mean_ms"`
	Min  float64 `json:"min_ms"`
	Max  float64 `json:"max_ms"`
}

// Summarize computes the summary of all samples. Percentiles interpolate
// linearly between the two closest ranks.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	ms := make([]float64, len(samples))
	sum := 0.0
	for i, d := range samples {
		ms[i] = float64(d) / float64(time.Millisecond)
		sum += ms[i]
	}
	slices.Sort(ms)
	return Summary{
		N:    len(ms),
		P50:  Percentile(ms, 50),
		P99:  Percentile(ms, 99),
		Mean: sum / float64(len(ms)),
		Min:  ms[0],
		Max:  ms[len(ms)-1],
	}
}

// Percentile returns the p-th percentile (0..100) of sorted values, with
// linear interpolation between closest ranks; NaN for no values.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if n == 1 || p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	pos := p / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	frac := pos - float64(lo)
	if lo+1 >= n {
		return sorted[n-1]
	}
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// ratio returns a/b rounded to 3 decimals, or nil when either is missing.
func ratio(a, b float64) *float64 {
	if a <= 0 || b <= 0 || math.IsNaN(a) || math.IsNaN(b) || math.IsInf(a, 0) || math.IsInf(b, 0) {
		return nil
	}
	r := round(a/b, 3)
	return &r
}

func round(v float64, digits int) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

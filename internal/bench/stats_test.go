package bench

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	vals := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {50, 5.5}, {99, 9.91}, {100, 10}} {
		if got := Percentile(vals, c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("Percentile of nothing should be NaN")
	}
	s := Summarize([]time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond})
	if s.N != 3 || s.P50 != 2 || s.Mean != 2 || s.Min != 1 || s.Max != 3 {
		t.Errorf("Summarize = %+v", s)
	}
}

func TestLoop(t *testing.T) {
	r := Loop(context.Background(), 20, 5, 4, 1, func(context.Context, int) ([]time.Duration, error) {
		return []time.Duration{time.Millisecond}, nil
	})
	if r.Done != 20 || len(r.Samples[0]) != 20 || r.Errors != 0 {
		t.Fatalf("Loop: done %d, samples %d, errors %d", r.Done, len(r.Samples[0]), r.Errors)
	}
	r = Loop(context.Background(), 10, 0, 2, 1, func(context.Context, int) ([]time.Duration, error) {
		return nil, errors.New("boom")
	})
	if r.Done != 0 || r.Errors != 10 || r.FirstErr == nil {
		t.Fatalf("failing Loop: done %d, errors %d, first %v", r.Done, r.Errors, r.FirstErr)
	}
}

func TestRowJSONRatios(t *testing.T) {
	rows := []Row{
		{System: "warren", Concurrency: 1, P50: 5, PerS: 100},
		{System: "crun", Concurrency: 1, P50: 10, PerS: 50},
		{System: "unshare+chroot", Concurrency: 1, P50: 2, PerS: 400},
	}
	addRatios(rows)
	b, err := rows[0].MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"vs_crun_p50":0.5`, `"vs_crun_per_s":2`, `"vs_unshare_p50":2.5`, `"system":"warren"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
}

package bench

import (
	"context"
	"testing"
	"time"
)

// TestAlternateOrderAndRatios: warm-up runs of each side, then rounds in
// ABBA order; ComparePaired's ratios are num over den.
func TestAlternateOrderAndRatios(t *testing.T) {
	var order []int
	side := func(i int, d time.Duration) Iteration {
		return func(context.Context, int) ([]time.Duration, error) {
			order = append(order, i)
			return []time.Duration{d}, nil
		}
	}
	s, err := Alternate(context.Background(), [2]Iteration{side(0, 2*time.Millisecond), side(1, 4*time.Millisecond)}, [2]string{"a", "b"}, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []int{0, 1, 0, 1, 1, 0, 0, 1}
	if len(order) != len(want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
	if len(s[0]) != 3 || len(s[1]) != 3 {
		t.Fatalf("samples %d and %d, want 3 each", len(s[0]), len(s[1]))
	}
	p := ComparePaired(s[1], s[0], 0)
	if p.NumP50 != 4 || p.DenP50 != 2 || p.RatioP50 != 2 || p.PairRatioMedian != 2 {
		t.Errorf("paired %+v, want b 4 ms over a 2 ms: ratio 2", p)
	}
}

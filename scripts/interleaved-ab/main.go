// Command interleaved-ab measures two running daemons (two builds) in one
// run, cycle by cycle: create -> exec `true` -> delete on A, then on B,
// the order flipping every cycle (ABBA), so that the machine's drift and
// each cycle's aftermath (writeback, reaping) hit both alike; what
// bench-ab.sh, which alternates whole runs, cannot resolve below ~10% on
// a noisy VM. Prints p50s, the ratio of the medians and the median of the
// cycle-by-cycle ratios, as a table and as one line of JSON.
// scripts/bench-interleaved.sh starts the two daemons.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/bench"
)

func main() {
	a := flag.String("a", "", "address of daemon A")
	b := flag.String("b", "", "address of daemon B")
	img := flag.String("image", "bb", "image to create sandboxes of (in both daemons)")
	n := flag.Int("n", 1000, "measured cycles per daemon")
	flag.Parse()
	ctx := context.Background()
	req := func() *warrenv1.CreateRequest { return &warrenv1.CreateRequest{Image: *img, TimeoutSeconds: 600} }
	var cycles [2]bench.Iteration
	for i, addr := range []string{*a, *b} {
		c, err := client.New(addr)
		if err != nil {
			log.Fatal(err)
		}
		cycles[i] = bench.WarrenCycle(c, req)
	}
	run := func(side int) []time.Duration {
		d, err := cycles[side](ctx, 0)
		if err != nil {
			log.Fatalf("daemon %c: %v", 'A'+side, err)
		}
		return d
	}
	for i := range 20 { // warm-up
		run(i % 2)
	}
	// Metrics of bench.WarrenCycle: [create+exec, cycle, create, exec, delete].
	metrics := []struct {
		name string
		idx  int
	}{{"create", 2}, {"create_to_first_exec", 0}, {"exec", 3}}
	var samples [2][][]time.Duration
	for i := range *n {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, s := range order {
			samples[s] = append(samples[s], run(s))
		}
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return bench.Percentile(s, 50)
	}
	report := map[string]any{"cycles": *n}
	for _, m := range metrics {
		var va, vb, ratios []float64
		for i := range samples[0] {
			x, y := samples[0][i][m.idx].Seconds()*1000, samples[1][i][m.idx].Seconds()*1000
			va, vb, ratios = append(va, x), append(vb, y), append(ratios, y/x)
		}
		fmt.Printf("%-21s A p50 %.3f ms  B p50 %.3f ms  B/A %.3f  pair-median %.3f\n", m.name, med(va), med(vb), med(vb)/med(va), med(ratios))
		report[m.name] = map[string]float64{"a_p50_ms": med(va), "b_p50_ms": med(vb), "ratio": med(vb) / med(va), "pair_ratio_median": med(ratios)}
	}
	js, _ := json.Marshal(report)
	fmt.Println(string(js))
}

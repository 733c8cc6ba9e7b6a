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
	// Ten unmeasured cycles of each first.
	samples, err := bench.Alternate(ctx, cycles, [2]string{"daemon A", "daemon B"}, 10, *n)
	if err != nil {
		log.Fatal(err)
	}
	// Metrics of bench.WarrenCycle: [create+exec, cycle, create, exec, delete].
	metrics := []struct {
		name string
		idx  int
	}{{"create", 2}, {"create_to_first_exec", 0}, {"exec", 3}}
	report := map[string]any{"cycles": *n}
	for _, m := range metrics {
		p := bench.ComparePaired(samples[1], samples[0], m.idx) // B over A
		fmt.Printf("%-21s A p50 %.3f ms  B p50 %.3f ms  B/A %.3f  pair-median %.3f\n", m.name, p.DenP50, p.NumP50, p.RatioP50, p.PairRatioMedian)
		report[m.name] = map[string]float64{"a_p50_ms": p.DenP50, "b_p50_ms": p.NumP50, "ratio": p.RatioP50, "pair_ratio_median": p.PairRatioMedian}
	}
	js, _ := json.Marshal(report)
	fmt.Println(string(js))
}

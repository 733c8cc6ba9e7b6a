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
	"sort"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func main() {
	a := flag.String("a", "", "addr A")
	b := flag.String("b", "", "addr B")
	img := flag.String("image", "bb", "image")
	n := flag.Int("n", 1000, "cycles per side")
	flag.Parse()
	ctx := context.Background()
	cs := []*client.Client{}
	for _, ad := range []string{*a, *b} {
		c, err := client.New(ad)
		if err != nil {
			panic(err)
		}
		cs = append(cs, c)
	}
	type res struct{ create, first, exec float64 }
	out := [2][]res{}
	cycle := func(c *client.Client) res {
		t0 := time.Now()
		sb, err := c.Create(ctx, &warrenv1.CreateRequest{Image: *img, TimeoutSeconds: 600})
		if err != nil {
			panic(err)
		}
		t1 := time.Now()
		if _, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Argv: []string{"true"}}); err != nil {
			panic(err)
		}
		t2 := time.Now()
		if err := c.Delete(ctx, sb.GetId()); err != nil {
			panic(err)
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		return res{ms(t1.Sub(t0)), ms(t2.Sub(t0)), ms(t2.Sub(t1))}
	}
	for i := 0; i < 20; i++ {
		cycle(cs[i%2])
	}
	for i := 0; i < *n; i++ {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, s := range order {
			out[s] = append(out[s], cycle(cs[s]))
		}
	}
	report := map[string]map[string]float64{}
	med := func(v []float64) float64 { s := append([]float64(nil), v...); sort.Float64s(s); return s[len(s)/2] }
	for _, k := range []string{"create", "first", "exec"} {
		var va, vb, ratios []float64
		for i := range out[0] {
			get := func(r res) float64 {
				switch k {
				case "create":
					return r.create
				case "first":
					return r.first
				}
				return r.exec
			}
			x, y := get(out[0][i]), get(out[1][i])
			va, vb, ratios = append(va, x), append(vb, y), append(ratios, y/x)
		}
		fmt.Printf("%-7s A p50 %.3f ms  B p50 %.3f ms  B/A %.3f  pair-median %.3f\n", k, med(va), med(vb), med(vb)/med(va), med(ratios))
		report[k] = map[string]float64{"a_p50_ms": med(va), "b_p50_ms": med(vb), "ratio": med(vb) / med(va), "pair_ratio_median": med(ratios)}
	}
	js, _ := json.Marshal(map[string]any{"cycles": *n, "create": report["create"], "create_to_first_exec": report["first"], "exec": report["exec"]})
	fmt.Println(string(js))
}

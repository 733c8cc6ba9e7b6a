package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/warrenrl/warren/client"
)

// RunCreateGateway measures create -> exec `true` -> delete cycles
// through a cluster gateway (the "warren" rows) against the same node
// straight over TCP (the "direct" rows): the ratio of their creates per
// second is what the gateway's hop, placement and routing cost.
func RunCreateGateway(ctx context.Context, env *Env, cfg CreateConfig, gateway, direct *client.Client) (*CreateReport, error) {
	rep := &CreateReport{Benchmark: "create-gateway", Daemon: env.describe() + " behind a gateway", Warmup: cfg.Warmup}
	rep.Notes = append(rep.Notes,
		"warren: through `warren gateway` (placement, then routing by the id's node tag) to the node over TCP; direct: the same node's TCP listener",
		"p50/p99/mean are create-to-first-exec-result; cycle adds Delete; per_s = completed cycles / wall time; the two take turns, the first of a turn alternating: at 1 client cycle by cycle, at more 16 turns each of a 16th of --n")
	var rows []Row
	for _, c := range cfg.Concurrency {
		// This machine's other load drifts over a run: the systems
		// take turns, each a share of the cycles, and the one that goes
		// first alternates. One client takes turns cycle by cycle, so
		// that each pair of cycles meets the same load (4 turns of 200
		// gave 0.55-1.25 at load 13-27); more clients, gatewayRounds
		// turns. Order may matter too: in one run with direct always
		// first, the node's own create (warren_sandbox_create_seconds)
		// averaged 11.4 ms in the direct turns and 15.3 ms in the
		// gateway's; in the next, order swapped, 13.2 and 13.4.
		var res [2]LoopResult
		names := [2]string{"direct", "warren"}
		clients := [2]*client.Client{direct, gateway}
		rounds, per := gatewayRounds, max(1, cfg.N/gatewayRounds)
		if c == 1 {
			rounds, per = max(1, cfg.N), 1
		}
		for round := range rounds {
			warmup := cfg.Warmup
			if c == 1 && round > 0 {
				warmup = 0
			}
			for k := range 2 {
				i := k ^ round%2
				if c > 1 || round%100 == 0 {
					env.logf("create: %s, concurrency %d, round %d/%d, %d cycles (+%d warm-up)", names[i], c, round+1, rounds, per, warmup)
				}
				r := Loop(ctx, per, warmup, c, 5, paced(cfg.Pause, WarrenCycle(clients[i], env.CreateRequest)))
				res[i] = mergeLoops(res[i], r)
				if err := ctx.Err(); err != nil {
					return nil, err
				}
			}
		}
		for i, r := range res {
			row := rowFrom(names[i], c, r)
			if len(r.Samples[0]) > 0 {
				cy, cr := Summarize(r.Samples[1]), Summarize(r.Samples[2])
				row.CycleP50, row.CycleP99, row.CycleMean = ptr(cy.P50), ptr(cy.P99), ptr(cy.Mean)
				row.CreateP50, row.CreateP99 = ptr(cr.P50), ptr(cr.P99)
			}
			rows = append(rows, row)
		}
	}
	rep.Results = orderRows(rows, cfg.Concurrency)
	addRatios(rep.Results)
	for _, r := range rep.Results {
		if r.System == "warren" {
			if v := r.Ratios["vs_direct_per_s"]; v != nil {
				rep.Notes = append(rep.Notes, fmt.Sprintf("concurrency %d: gateway creates/s / direct = %.3f", r.Concurrency, *v))
			}
		}
	}
	return rep, nil
}

// gatewayRounds is how many turns each system takes at a concurrency
// above 1: short turns, so that both meet the same drift of the
// machine's other load.
const gatewayRounds = 16

// mergeLoops adds b's iterations to a's.
func mergeLoops(a, b LoopResult) LoopResult {
	if a.Samples == nil {
		a.Samples = make([][]time.Duration, len(b.Samples))
	}
	for i := range b.Samples {
		a.Samples[i] = append(a.Samples[i], b.Samples[i]...)
	}
	a.Wall += b.Wall
	a.Done += b.Done
	a.Errors += b.Errors
	if a.FirstErr == nil {
		a.FirstErr = b.FirstErr
	}
	return a
}

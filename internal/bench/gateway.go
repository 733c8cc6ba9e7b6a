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
		"p50/p99/mean are create-to-first-exec-result; cycle adds Delete; per_s = completed cycles / wall time; per concurrency the two take turns, 4 rounds each of a quarter of --n")
	var rows []Row
	for _, c := range cfg.Concurrency {
		// This machine's other load drifts over a run: the systems
		// take turns, gatewayRounds times, each a share of the cycles.
		var res [2]LoopResult
		names := [2]string{"direct", "warren"}
		per := max(1, cfg.N/gatewayRounds)
		for round := range gatewayRounds {
			for i, cl := range [2]*client.Client{direct, gateway} {
				env.logf("create: %s, concurrency %d, round %d/%d, %d cycles (+%d warm-up)", names[i], c, round+1, gatewayRounds, per, cfg.Warmup)
				r := Loop(ctx, per, cfg.Warmup, c, 5, paced(cfg.Pause, WarrenCycle(cl, env.CreateRequest)))
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

// gatewayRounds is how many turns each system takes per concurrency.
const gatewayRounds = 4

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

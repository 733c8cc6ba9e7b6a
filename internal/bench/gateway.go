package bench

import (
	"context"
	"fmt"

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
		"p50/p99/mean are create-to-first-exec-result; cycle adds Delete; per_s = completed cycles / wall time; the runs alternate per concurrency")
	var rows []Row
	for _, c := range cfg.Concurrency {
		for _, sys := range []struct {
			name string
			c    *client.Client
		}{{"direct", direct}, {"warren", gateway}} {
			env.logf("create: %s, concurrency %d, %d cycles (+%d warm-up)", sys.name, c, cfg.N, cfg.Warmup)
			r := Loop(ctx, cfg.N, cfg.Warmup, c, 5, paced(cfg.Pause, WarrenCycle(sys.c, env.CreateRequest)))
			row := rowFrom(sys.name, c, r)
			if len(r.Samples[0]) > 0 {
				cy, cr := Summarize(r.Samples[1]), Summarize(r.Samples[2])
				row.CycleP50, row.CycleP99, row.CycleMean = ptr(cy.P50), ptr(cy.P99), ptr(cy.Mean)
				row.CreateP50, row.CreateP99 = ptr(cr.P50), ptr(cr.P99)
			}
			rows = append(rows, row)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
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

package bench

import (
	"testing"
	"time"
)

// The sched benchmark runs both placers on identical clusters, and the
// placer's view (reports plus reservations, releases on delete) never lets
// it send a node a sandbox the node refuses.
func TestSchedRunsBothPlacersWithoutRefusals(t *testing.T) {
	cfg := SchedConfig{Nodes: 12, Live: 30000, Images: 50, Duration: 300 * time.Millisecond, Concurrency: 4,
		Overcommit: 4, ReportInterval: 50 * time.Millisecond, Peers: true, Seed: 7}
	rep, err := RunSched(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 || rep.ThroughputRatio == nil {
		t.Fatalf("want two rows and a ratio: %+v", rep)
	}
	if rep.MedianImageNodes < 3 {
		t.Fatalf("median image on %v nodes, want >= 3", rep.MedianImageNodes)
	}
	for _, row := range rep.Results {
		if row.Placements == 0 || row.Reports == 0 {
			t.Fatalf("%s: %d placements, %d reports", row.System, row.Placements, row.Reports)
		}
		if row.Refused != 0 {
			t.Errorf("%s: %d placements refused by the node (the placer's view ran ahead of capacity)", row.System, row.Refused)
		}
		if row.LocalityHitRate < 0.5 {
			t.Errorf("%s: locality hit rate %.2f", row.System, row.LocalityHitRate)
		}
	}
}

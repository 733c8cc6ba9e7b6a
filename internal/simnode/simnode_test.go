package simnode

import (
	"errors"
	"testing"

	"github.com/warrenrl/warren/internal/errdefs"
)

// A simulated node refuses what does not fit its own capacity, and its
// report follows creates and deletes.
func TestNodeCapacityAndReport(t *testing.T) {
	n := New(Config{Name: "a", CPUMillis: 1000, MemoryBytes: 1 << 30, MaxSandboxes: 3, Overcommit: 2})
	sb := Sandbox{ID: 1, CPUMillis: 900, QoS: "be", Layers: []string{"l1"}, Labels: []string{"job=x"}}
	if local, err := n.Create(sb); err != nil || local {
		t.Fatalf("first create: local %v err %v", local, err)
	}
	sb.ID = 2
	if local, err := n.Create(sb); err != nil || !local {
		t.Fatalf("second create: local %v err %v (its layer is cached now)", local, err)
	}
	sb.ID = 3
	if _, err := n.Create(sb); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("1800m+900m on 1000m at 2x: %v", err)
	}
	r := n.Report()
	if r.Sandboxes != 2 || r.AllocCPUMillis != 1800 || r.QoS["be"] != 2 || r.LabelCounts["job=x"] != 2 || len(r.Layers) != 1 || r.Load <= 0 {
		t.Fatalf("report %+v", r)
	}
	if !n.Delete(1) || n.Delete(1) {
		t.Fatal("delete")
	}
	if _, ok := n.DeleteAt(5); !ok {
		t.Fatal("DeleteAt")
	}
	if r := n.Report(); r.Sandboxes != 0 || r.AllocCPUMillis != 0 || r.QoS["be"] != 0 || len(r.LabelCounts) != 0 {
		t.Fatalf("report after deletes %+v", r)
	}
}

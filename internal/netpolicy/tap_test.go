package netpolicy

import (
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestSweepKeepsTheOtherBackendsAttachedInterfaces: the daemon's backends
// share one node and each sweeps with its own sandboxes' ids, so a
// container backend's Sweep keeps an attached VM's tap and rules, and
// the microvm backend's SweepTaps an attached container's veth and
// rules, while SweepTaps removes a VM that is not kept. A tap has the
// veth host end's name and alias, and goes with its last descriptor
// (QEMU's): it is not persistent.
func TestSweepKeepsTheOtherBackendsAttachedInterfaces(t *testing.T) {
	n := newTestNode(t)
	open := Policy{Mode: Open}
	ctr, err := n.Attach("ctr", "", sandboxProc(t), open)
	if err != nil {
		t.Fatal(err)
	}
	vm, tap, err := n.AttachTap("vm", "", open)
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	if !vm.Tap || ctr.Tap {
		t.Fatalf("attachments: vm tap %v, ctr tap %v", vm.Tap, ctr.Tap)
	}
	check := func(when string, wantLinks, wantRules []string) {
		t.Helper()
		links, ids, err := n.Leftovers()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, id := range links {
			got = append(got, id)
		}
		slices.Sort(got)
		slices.Sort(ids)
		if !slices.Equal(got, wantLinks) || !slices.Equal(ids, wantRules) {
			t.Errorf("%s: interfaces of %v, rules of %v; want %v and %v", when, got, ids, wantLinks, wantRules)
		}
	}
	check("attached", []string{"ctr", "vm"}, []string{"ctr", "vm"})
	if err := n.Sweep(map[string]bool{"ctr": true}); err != nil {
		t.Fatal(err)
	}
	check("after the container backend's sweep", []string{"ctr", "vm"}, []string{"ctr", "vm"})
	if err := n.SweepTaps(map[string]bool{"vm": true}); err != nil {
		t.Fatal(err)
	}
	check("after the microvm backend's sweep", []string{"ctr", "vm"}, []string{"ctr", "vm"})
	if err := n.Detach("vm", vm); err != nil {
		t.Fatal(err)
	}
	check("after the VM's Detach", []string{"ctr"}, []string{"ctr"})

	// A tap goes with its last descriptor, as with QEMU's end.
	vm2, tap2, err := n.AttachTap("vm2", "", open)
	if err != nil {
		t.Fatal(err)
	}
	name := n.Ifname(vm2.Index)
	tap2.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := netlink.LinkByName(name); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tap %s still there after its descriptor was closed", name)
		}
	}
	// Its rules stay until SweepTaps (a VM gone while no daemon ran).
	check("after the tap's close", []string{"ctr"}, []string{"ctr", "vm2"})
	if err := n.SweepTaps(map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	check("after SweepTaps", []string{"ctr"}, []string{"ctr"})
}

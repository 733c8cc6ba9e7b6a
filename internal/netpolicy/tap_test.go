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
// a VM backend's SweepTaps an attached container's veth and the other VM
// backend's tap (microvm and fullvm) with their rules, while SweepTaps
// removes a VM of its own that is not kept. A tap has the
// veth host end's name and alias, and goes with its last descriptor
// (QEMU's): it is not persistent.
func TestSweepKeepsTheOtherBackendsAttachedInterfaces(t *testing.T) {
	n := newTestNode(t)
	open := Policy{Mode: Open}
	ctr, err := n.Attach("ctr", "", sandboxProc(t), open)
	if err != nil {
		t.Fatal(err)
	}
	vm, tap, err := n.AttachTap("microvm", "vm", "", open)
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	if !vm.Tap || ctr.Tap || vm.Owner != "microvm" {
		t.Fatalf("attachments: vm tap %v of %q, ctr tap %v", vm.Tap, vm.Owner, ctr.Tap)
	}
	fv, fvTap, err := n.AttachTap("fullvm", "fv", "", open)
	if err != nil {
		t.Fatal(err)
	}
	defer fvTap.Close()
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
	all := []string{"ctr", "fv", "vm"}
	check("attached", all, all)
	if err := n.Sweep(map[string]bool{"ctr": true}); err != nil {
		t.Fatal(err)
	}
	check("after the container backend's sweep", all, all)
	if err := n.SweepTaps("microvm", map[string]bool{"vm": true}); err != nil {
		t.Fatal(err)
	}
	check("after the microvm backend's sweep", all, all)
	if err := n.SweepTaps("fullvm", map[string]bool{"fv": true}); err != nil {
		t.Fatal(err)
	}
	check("after the fullvm backend's sweep", all, all)
	// An adopted attachment (a restarted daemon's) keeps its owner.
	n2 := newTestNodeOf(t, n)
	for id, a := range map[string]Attachment{"ctr": ctr, "vm": vm, "fv": fv} {
		if err := n2.Adopt(id, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := n2.SweepTaps("microvm", map[string]bool{"vm": true}); err != nil {
		t.Fatal(err)
	}
	check("after an adopting microvm backend's sweep", all, all)
	if err := n.Detach("vm", vm); err != nil {
		t.Fatal(err)
	}
	if err := n.Detach("fv", fv); err != nil {
		t.Fatal(err)
	}
	check("after the VMs' Detach", []string{"ctr"}, []string{"ctr"})

	// A tap goes with its last descriptor, as with QEMU's end.
	vm2, tap2, err := n.AttachTap("microvm", "vm2", "", open)
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
	if err := n.SweepTaps("microvm", map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	check("after SweepTaps", []string{"ctr"}, []string{"ctr"})
}

// newTestNodeOf is another handle on n's networking, as a restarted
// daemon's (same name and subnet; test names have no '/').
func newTestNodeOf(t *testing.T, n *Node) *Node {
	t.Helper()
	n2, err := New(Options{Name: n.Table(), Subnet: n.subnet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n2.Close() })
	return n2
}

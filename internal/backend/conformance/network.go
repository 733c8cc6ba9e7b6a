package conformance

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/warrenrl/warren/internal/netpolicy"
)

// NetworkResources lists what the networks of a test's sandboxes (on node
// o) can leave on the node, for a Harness's Resources: interfaces of its
// prefix (veths, taps), rules and groups in its table.
func NetworkResources(t *testing.T, o netpolicy.Options) []string {
	n, err := netpolicy.New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	links, ids, err := n.Leftovers()
	if err != nil {
		t.Errorf("network leftovers: %v", err)
	}
	var out []string
	for name, id := range links {
		out = append(out, "interface "+name+" "+id)
	}
	for _, id := range ids {
		out = append(out, "nft chains of "+id)
	}
	groups, _ := n.Groups()
	for g, addrs := range groups {
		out = append(out, fmt.Sprintf("nft group %s of %d", g, len(addrs)))
	}
	slices.Sort(out)
	return out
}

// NodeNetwork is a test's own sandbox networking on the node: name (its
// nftables table and interface prefix) and subnet, which no other test
// package may use at the same time. Whatever the sandboxes of VM backend
// owner (its taps) and of containers left is removed when the test ends.
func NodeNetwork(t *testing.T, name string, subnet netip.Prefix, owner string) netpolicy.Options {
	o := netpolicy.Options{Name: name, Subnet: subnet}
	t.Cleanup(func() {
		if n, err := netpolicy.New(o); err == nil {
			_ = n.SweepTaps(owner, nil)
			_ = n.RemoveUnused()
			_ = n.Close()
		}
	})
	return o
}

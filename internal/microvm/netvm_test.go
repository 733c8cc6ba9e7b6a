package microvm

import (
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"

	"github.com/warrenrl/warren/internal/netpolicy"
)

var subnetSeq atomic.Int32

// testNetwork gives a test its own sandbox networking: a name (nftables
// table, interface prefix) and a subnet no other test package takes at
// the same time (the container tests use 10.100-149, others 10.200-249),
// and removes whatever its sandboxes left when it ends.
func testNetwork(t *testing.T) netpolicy.Options {
	o := netpolicy.Options{
		Name:   fmt.Sprintf("warren-test-microvm-%d-%d", os.Getpid(), subnetSeq.Add(1)),
		Subnet: netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 150+os.Getpid()%50, subnetSeq.Load()%256)),
	}
	t.Cleanup(func() {
		if n, err := netpolicy.New(o); err == nil {
			_ = n.SweepTaps(nil)
			_ = n.RemoveUnused()
			_ = n.Close()
		}
	})
	return o
}

// networkResources lists what a test's sandboxes' networks can leave on
// the node: interfaces of its prefix (taps), rules and groups in its
// table.
func networkResources(t *testing.T, o netpolicy.Options) []string {
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
	return out
}

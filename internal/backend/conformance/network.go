package conformance

import (
	"fmt"
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

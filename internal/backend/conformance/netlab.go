package conformance

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/testutil"
)

// NetLab is what a backend's network tests check a sandbox's policy
// against: the test's own node network (NodeNetwork's options), two test
// hosts on the node, A and Other, each with an echo server, and what the
// node held before any sandbox.
type NetLab struct {
	Opts             netpolicy.Options
	Node             *netpolicy.Node
	A, Other         *testutil.TestHost
	PortA, PortOther int
	base             []string
}

// NewNetLab starts a node network on o and the two hosts; all go with
// the test.
func NewNetLab(t *testing.T, o netpolicy.Options) *NetLab {
	t.Helper()
	n, err := netpolicy.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	l := &NetLab{Opts: o, Node: n, A: testutil.NewTestHost(t), Other: testutil.NewTestHost(t)}
	l.PortA = testutil.EchoServer(t, l.A.NS, l.A.Addr.String()+":0")
	l.PortOther = testutil.EchoServer(t, l.Other.NS, l.Other.Addr.String()+":0")
	l.base = NetworkResources(t, o)
	return l
}

// Only is an allowlist of the one address h.
func Only(h netip.Addr) netpolicy.Policy {
	return netpolicy.Policy{Mode: netpolicy.Allowlist, Allow: []netpolicy.Rule{{Prefix: netip.PrefixFrom(h, 32)}}}
}

// Reaches checks which of the two hosts sb reaches: nc in the sandbox
// prints the echo server's answer, and nothing when the rules refuse the
// connection (within its 5 s timeout).
func (l *NetLab) Reaches(t *testing.T, sb backend.Sandbox, when string, wantA, wantOther bool) {
	t.Helper()
	for _, h := range []struct {
		addr netip.Addr
		port int
		want bool
	}{{l.A.Addr, l.PortA, wantA}, {l.Other.Addr, l.PortOther, wantOther}} {
		script := fmt.Sprintf("echo ping | nc -w 5 %s %d; true", h.addr, h.port)
		got := Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", script}}, "").Stdout == "ping\n"
		if got != h.want {
			t.Errorf("%s: %s: %s reachable %v, want %v", sb.ID(), when, h.addr, got, h.want)
		}
	}
}

// NoLeaks checks that the node holds what it held before any sandbox:
// no interface, rule or group of one is left.
func (l *NetLab) NoLeaks(t *testing.T, when string) {
	t.Helper()
	if got := NetworkResources(t, l.Opts); !slices.Equal(got, l.base) {
		t.Errorf("%s: %v, want %v", when, got, l.base)
	}
}

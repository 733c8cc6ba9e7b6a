package netpolicy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/warrenrl/warren/internal/testutil"
)

// Test traffic goes only to addresses inside network namespaces these
// tests make (test hosts, on 198.18.0.0/15, the benchmarking range) or
// the node's own addresses (which must refuse it).

var seq atomic.Int32

// newTestNode is a Node with a name and subnet of its own, so that tests
// of several packages can run at once; its leftovers are checked and
// removed at the end.
func newTestNode(t *testing.T) *Node {
	t.Helper()
	testutil.RequireRoot(t)
	k := int(seq.Add(1))
	name := fmt.Sprintf("warren-nptest-%d-%d", os.Getpid(), k)
	n, err := New(Options{Name: name, Subnet: testutil.Subnet(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Sweep(map[string]bool{})
		_ = n.RemoveUnused()
		_ = n.Close()
	})
	return n
}

// sandboxProc starts a process in a new network namespace with lo up, as
// a sandbox's init is, and returns its pid.
func sandboxProc(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "120")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	inNS(t, nsOf(t, cmd.Process.Pid), func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	return cmd.Process.Pid
}

func nsOf(t *testing.T, pid int) netns.NsHandle {
	t.Helper()
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func inNS(t *testing.T, ns netns.NsHandle, f func() error) { t.Helper(); testutil.InNetns(t, ns, f) }

func inNSErr(ns netns.NsHandle, f func() error) error { return testutil.InNetnsErr(ns, f) }

// testHost is testutil's, with the names these tests use.
type testHost struct {
	ns       netns.NsHandle
	addr, gw netip.Addr
}

func newTestHost(t *testing.T) *testHost {
	h := testutil.NewTestHost(t)
	return &testHost{ns: h.NS, addr: h.Addr, gw: h.Gateway}
}

func listen(t *testing.T, ns netns.NsHandle, addr string) int {
	t.Helper()
	return testutil.EchoServer(t, ns, addr)
}

// dial connects from namespace ns to addr:port within a second: for
// reaches, whose refused dials should not take long.
func dial(ns netns.NsHandle, addr netip.Addr, port int) (net.Conn, error) {
	return dialWithin(ns, addr, port, time.Second)
}

// connect is dial for a connection that must succeed: within 5 s, so
// that a first SYN lost on a loaded machine (retransmitted after 1 s)
// does not fail the test.
func connect(ns netns.NsHandle, addr netip.Addr, port int) (net.Conn, error) {
	return dialWithin(ns, addr, port, 5*time.Second)
}

func dialWithin(ns netns.NsHandle, addr netip.Addr, port int, d time.Duration) (net.Conn, error) {
	var c net.Conn
	err := inNSErr(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(addr, uint16(port)).String(), d)
		return err
	})
	return c, err
}

// echo sends one line on c and waits up to a second for it back.
func echo(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	buf := make([]byte, 5)
	_, err := io.ReadFull(c, buf)
	return err
}

// reachesWithin is reaches for a path that must be open: the dial and
// the echo get 5 s, so that a SYN or segment lost on a loaded machine
// (retransmitted after 1 s) does not read as a closed path.
func reachesWithin(ns netns.NsHandle, addr netip.Addr, port int) error {
	c, err := connect(ns, addr, port)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	buf := make([]byte, 5)
	_, err = io.ReadFull(c, buf)
	return err
}

func reaches(ns netns.NsHandle, addr netip.Addr, port int) error {
	c, err := dial(ns, addr, port)
	if err != nil {
		return err
	}
	defer c.Close()
	return echo(c)
}

func mustAttach(t *testing.T, n *Node, id string, pid int, p Policy) Attachment {
	t.Helper()
	a, err := n.Attach(id, id, pid, p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func allow(cidr string, port uint16, proto string) Rule {
	return Rule{Prefix: netip.MustParsePrefix(cidr), Port: port, Proto: proto}
}

// TestOpenReachesTestHostThroughNAT: a sandbox in mode open reaches a
// test host, which sees the node's address (NAT), and nothing else of
// the node: neither a service listening on the node's addresses (its
// veth end, the test host's gateway) nor another sandbox nor 169.254/16.
func TestOpenReachesTestHostThroughNAT(t *testing.T) {
	n := newTestNode(t)
	th := newTestHost(t)
	port := listen(t, th.ns, th.addr.String()+":0")
	nodePort := listen(t, 0, "0.0.0.0:0")
	pidA, pidB := sandboxProc(t), sandboxProc(t)
	aA := mustAttach(t, n, "a", pidA, Policy{Mode: Open})
	aB := mustAttach(t, n, "b", pidB, Policy{Mode: Open})
	nsA := nsOf(t, pidA)

	seenc := make(chan netip.Addr, 1)
	srcPort := listenRecordingSource(t, th, seenc)
	if err := reachesWithin(nsA, th.addr, port); err != nil {
		t.Fatalf("open sandbox does not reach the test host: %v", err)
	}
	if err := reachesWithin(nsA, th.addr, srcPort); err != nil {
		t.Fatal(err)
	}
	if seen := <-seenc; seen != th.gw {
		t.Errorf("test host saw the sandbox as %v, want the node's %v (NAT)", seen, th.gw)
	}
	hostA, _ := n.Addrs(aA.Index)
	_, sbB := n.Addrs(aB.Index)
	for what, a := range map[string]netip.Addr{"node's veth end": hostA, "node's address toward the test host": th.gw} {
		if err := reaches(nsA, a, nodePort); err == nil {
			t.Errorf("sandbox reaches a service on the %s (%v)", what, a)
		}
	}
	peerPort := listen(t, nsOf(t, pidB), "0.0.0.0:0")
	if err := reaches(nsA, sbB, peerPort); err == nil {
		t.Errorf("sandbox a reaches sandbox b")
	}
	if err := reaches(nsA, netip.MustParseAddr("169.254.169.254"), 80); err == nil {
		t.Errorf("sandbox reaches 169.254.169.254")
	}
	// Nothing outside opens a connection into a sandbox.
	_, sbA := n.Addrs(aA.Index)
	inPort := listen(t, nsA, "0.0.0.0:0")
	if err := reaches(th.ns, sbA, inPort); err == nil {
		t.Errorf("the test host opens a connection into the sandbox")
	}
}

// listenRecordingSource is an echo server on the test host that records
// the source address of what connects.
func listenRecordingSource(t *testing.T, th *testHost, seen chan<- netip.Addr) int {
	t.Helper()
	ln := testutil.Listen(t, th.ns, th.addr.String()+":0")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case seen <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr():
			default:
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestAllowlistOnlyAllowedHostPort: an allowlisted sandbox reaches the
// allowed test host and port, and neither another port of it nor another
// test host.
func TestAllowlistOnlyAllowedHostPort(t *testing.T) {
	n := newTestNode(t)
	th, other := newTestHost(t), newTestHost(t)
	p1 := listen(t, th.ns, th.addr.String()+":0")
	p2 := listen(t, th.ns, th.addr.String()+":0")
	p3 := listen(t, other.ns, other.addr.String()+":0")
	pid := sandboxProc(t)
	mustAttach(t, n, "al", pid, Policy{Mode: Allowlist, Allow: []Rule{allow(th.addr.String()+"/32", uint16(p1), "tcp")}})
	ns := nsOf(t, pid)
	if err := reachesWithin(ns, th.addr, p1); err != nil {
		t.Errorf("allowed host:port unreachable: %v", err)
	}
	if err := reaches(ns, th.addr, p2); err == nil {
		t.Errorf("another port of the allowed host is reachable")
	}
	if err := reaches(ns, other.addr, p3); err == nil {
		t.Errorf("a host not on the allowlist is reachable")
	}
}

// TestPolicyChangeCutsEstablished: a policy change cuts an established
// connection it forbids (the sandbox's next packet gets a reset) and lets
// new allowed connections through, within 5 ms of the call returning for
// new connections.
func TestPolicyChangeCutsEstablished(t *testing.T) {
	n := newTestNode(t)
	th, other := newTestHost(t), newTestHost(t)
	port := listen(t, th.ns, th.addr.String()+":0")
	port2 := listen(t, other.ns, other.addr.String()+":0")
	pid := sandboxProc(t)
	a := mustAttach(t, n, "ph", pid, Policy{Mode: Open})
	ns := nsOf(t, pid)
	c, err := connect(ns, th.addr, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := n.SetPolicy("ph", pid, a, Policy{Mode: Allowlist, Allow: []Rule{allow(other.addr.String()+"/32", 0, "")}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("policy change took %v", time.Since(start))
	err = echo(c)
	if err == nil {
		t.Fatal("established connection to a host the new policy forbids still works")
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Logf("cut with %v (want a reset)", err)
	}
	if err := reachesWithin(ns, other.addr, port2); err != nil {
		t.Errorf("new connection the new policy allows fails: %v", err)
	}
	if err := reaches(ns, th.addr, port); err == nil {
		t.Errorf("new connection the new policy forbids succeeds")
	}
	// And back: open again lets the first host through.
	if err := n.SetPolicy("ph", pid, a, Policy{Mode: Open}); err != nil {
		t.Fatal(err)
	}
	if err := reachesWithin(ns, th.addr, port); err != nil {
		t.Errorf("after reopening: %v", err)
	}
}

// TestDetachLeavesNothing: after Detach, and after a sandbox's namespace
// died without one (Sweep), no veth, chain or map element of it is left;
// a kept sandbox's survive Sweep.
func TestDetachLeavesNothing(t *testing.T) {
	n := newTestNode(t)
	pid1, pid2, pid3 := sandboxProc(t), sandboxProc(t), sandboxProc(t)
	a1 := mustAttach(t, n, "d1", pid1, Policy{Mode: Open})
	mustAttach(t, n, "d2", pid2, Policy{Mode: Allowlist, Allow: []Rule{allow("198.18.0.0/15", 80, "")}})
	mustAttach(t, n, "keep", pid3, Policy{Mode: Open})
	if err := n.Detach("d1", a1); err != nil {
		t.Fatal(err)
	}
	if err := n.Detach("d1", a1); err != nil {
		t.Fatalf("second detach: %v", err)
	}
	_ = syscall.Kill(pid2, syscall.SIGKILL)
	// A new daemon knows only what it adopted.
	n2, err := New(Options{Name: n.fw.table.Name, Subnet: n.subnet})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	if err := n2.Adopt("keep", Attachment{Index: 2}); err != nil {
		t.Fatal(err)
	}
	if err := n2.Sweep(map[string]bool{"keep": true}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// A nil keep keeps nothing (a daemon's backend without live
		// sandboxes sweeps with nil).
		if err := n2.Sweep(nil); err != nil {
			t.Fatal(err)
		}
		if _, ids, _ := n.Leftovers(); len(ids) != 0 {
			t.Errorf("Sweep(nil) left the rules of %v", ids)
		}
	}()
	links, ids, err := n.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{"keep"}) || len(links) != 1 || links[n.Ifname(2)] != "keep" {
		t.Errorf("left: links %v, rules of %v; want only sandbox keep's", links, ids)
	}
	sets, _ := n.fw.conn.GetSets(n.fw.table)
	for _, s := range sets {
		elems, _ := n.fw.conn.GetSetElements(s)
		if len(elems) != 1 {
			t.Errorf("map %s holds %d elements, want 1 (keep's)", s.Name, len(elems))
		}
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		rules []RuleSpec
		field string // "" = valid
	}{
		{"", nil, ""},
		{"open", nil, ""},
		{"allowlist", []RuleSpec{{CIDR: "10.0.0.0/8", HasPort: true, Port: 443, Proto: "tcp"}}, ""},
		{"allowlist", []RuleSpec{{CIDR: "10.0.0.1"}}, ""},
		{"bogus", nil, "network.mode"},
		{"allowlist", []RuleSpec{{CIDR: "10.0.0.0/33"}}, "network.allow[0]: cidr"},
		{"allowlist", []RuleSpec{{CIDR: "10.0.0.0/8", HasPort: true, Port: 0}}, "network.allow[0]: port"},
		{"allowlist", []RuleSpec{{CIDR: "10.0.0.0/8", HasPort: true, Port: 65536}}, "network.allow[0]: port"},
		{"allowlist", []RuleSpec{{CIDR: "10.0.0.0/8", Proto: "icmp"}}, "network.allow[0]: protocol"},
		{"allowlist", []RuleSpec{{CIDR: "::1/128"}}, "network.allow[0]: cidr"},
		{"open", []RuleSpec{{CIDR: "10.0.0.0/8"}}, "network.allow"},
	} {
		_, err := Parse("network", tc.mode, "", tc.rules)
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%q %v: %v", tc.mode, tc.rules, err)
		case tc.field != "" && (err == nil || !startsWith(err.Error(), tc.field)):
			t.Errorf("%q %v: error %v, want one naming %s", tc.mode, tc.rules, err, tc.field)
		}
	}
	mode, rules, err := ParseFlag("allow:10.1.0.0/16:443/tcp,192.0.2.1")
	if err != nil || mode != "allowlist" || len(rules) != 2 || rules[0].Port != 443 || rules[0].Proto != "tcp" || rules[1].HasPort {
		t.Errorf("ParseFlag: %v %v %v", mode, rules, err)
	}
	p, err := Parse("network", mode, "", rules)
	if err != nil || p.String() != "allow:10.1.0.0/16:443/tcp,192.0.2.1/32" {
		t.Errorf("round trip: %v %v", p, err)
	}
	_ = strconv.Itoa
}

func startsWith(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// BenchmarkAttach is the network part of a create in mode open: the
// rules, the veth pair and both ends configured and up (then Detach,
// untimed).
func BenchmarkAttach(b *testing.B) {
	n, pid := benchNode(b)
	for b.Loop() {
		a, err := n.Attach("bench", "", pid, Policy{Mode: Open})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := n.Detach("bench", a); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkSetPolicyRules is the nftables transaction of a policy change
// alone: from it on, new packets meet the new rules.
func BenchmarkSetPolicyRules(b *testing.B) {
	n, pid := benchNode(b)
	if _, err := n.Attach("bench", "", pid, Policy{Mode: Open}); err != nil {
		b.Fatal(err)
	}
	ps := benchPolicies()
	i := 0
	for b.Loop() {
		if err := n.fw.set("bench", ps[i%2]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkSetPolicy is a whole policy change: the rules, then the scan
// of the sandbox's TCP sockets for connections to abort.
func BenchmarkSetPolicy(b *testing.B) {
	n, pid := benchNode(b)
	a, err := n.Attach("bench", "", pid, Policy{Mode: Open})
	if err != nil {
		b.Fatal(err)
	}
	ps := benchPolicies()
	i := 0
	for b.Loop() {
		if err := n.SetPolicy("bench", pid, a, ps[i%2]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func benchPolicies() []Policy {
	var rules []Rule
	for k := range 16 {
		rules = append(rules, allow(fmt.Sprintf("198.18.%d.0/24", k), 443, "tcp"))
	}
	return []Policy{{Mode: Allowlist, Allow: rules}, {Mode: Open}}
}

func benchNode(b *testing.B) (*Node, int) {
	b.Helper()
	testutil.RequireRoot(b)
	n, err := New(Options{Name: fmt.Sprintf("warren-npbench-%d", os.Getpid()), Subnet: testutil.Subnet(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Sweep(map[string]bool{}); _ = n.RemoveUnused(); _ = n.Close() })
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return n, cmd.Process.Pid
}

// BenchmarkAddRules is the nftables part of BenchmarkAttach alone: a
// sandbox's two chains, their rules (16 allowlist entries) and its two
// map elements, in one transaction (then removed, untimed).
func BenchmarkAddRules(b *testing.B) {
	n, _ := benchNode(b)
	pol := benchPolicies()[0]
	for b.Loop() {
		if err := n.fw.add("bench", "wbench0", pol, netip.Addr{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := n.fw.remove("bench", "wbench0", Policy{}, netip.Addr{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// TestGroupMembersReachOnlyEachOther: members of a group reach each other
// (a member in mode none too, which reaches nothing else), a sandbox
// outside the group reaches no member and no member reaches it, and once
// the last member is gone the group's set and rule are gone too.
func TestGroupMembersReachOnlyEachOther(t *testing.T) {
	n := newTestNode(t)
	th := newTestHost(t)
	thPort := listen(t, th.ns, th.addr.String()+":0")
	pidA, pidB, pidC := sandboxProc(t), sandboxProc(t), sandboxProc(t)
	aA := mustAttach(t, n, "ga", pidA, Policy{Mode: None, Group: "g1"})
	aB := mustAttach(t, n, "gb", pidB, Policy{Mode: Open, Group: "g1"})
	aC := mustAttach(t, n, "out", pidC, Policy{Mode: Open})
	nsA, nsB, nsC := nsOf(t, pidA), nsOf(t, pidB), nsOf(t, pidC)
	_, ipA := n.Addrs(aA.Index)
	_, ipB := n.Addrs(aB.Index)
	_, ipC := n.Addrs(aC.Index)
	pA, pB, pC := listen(t, nsA, "0.0.0.0:0"), listen(t, nsB, "0.0.0.0:0"), listen(t, nsC, "0.0.0.0:0")
	if err := reachesWithin(nsA, ipB, pB); err != nil {
		t.Errorf("member a does not reach member b: %v", err)
	}
	if err := reachesWithin(nsB, ipA, pA); err != nil {
		t.Errorf("member b does not reach member a: %v", err)
	}
	if err := reachesWithin(nsB, th.addr, thPort); err != nil {
		t.Errorf("member b in mode open does not reach the test host: %v", err)
	}
	for what, err := range map[string]error{
		"a (mode none) reaches the test host": reaches(nsA, th.addr, thPort),
		"outsider reaches member a":           reaches(nsC, ipA, pA),
		"outsider reaches member b":           reaches(nsC, ipB, pB),
		"member b reaches the outsider":       reaches(nsB, ipC, pC),
		"test host reaches member b":          reaches(th.ns, ipB, pB),
	} {
		if err == nil {
			t.Errorf("%s", what)
		}
	}
	// A policy change keeps the group: no abort of a member's connection.
	c, err := connect(nsB, ipA, pA)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := n.SetPolicy("gb", pidB, aB, Policy{Mode: None, Group: "g1"}); err != nil {
		t.Fatal(err)
	}
	if err := echo(c); err != nil {
		t.Errorf("connection between members after a policy change: %v", err)
	}
	if err := n.Detach("ga", aA); err != nil {
		t.Fatal(err)
	}
	if gs, _ := n.Groups(); len(gs["g1"]) != 1 {
		t.Errorf("after one member left: groups %v", gs)
	}
	if err := n.Detach("gb", Attachment{Index: aB.Index, Policy: Policy{Mode: None, Group: "g1"}}); err != nil {
		t.Fatal(err)
	}
	if gs, _ := n.Groups(); len(gs) != 0 {
		t.Errorf("after the last member left: groups %v", gs)
	}
	// A crashed daemon's group: Sweep empties it.
	pidD := sandboxProc(t)
	mustAttach(t, n, "gd", pidD, Policy{Mode: Open, Group: "g2"})
	if err := n.Sweep(map[string]bool{"out": true}); err != nil {
		t.Fatal(err)
	}
	if gs, _ := n.Groups(); len(gs) != 0 {
		t.Errorf("after Sweep: groups %v", gs)
	}
}

// TestDetachForgetsFlows: a sandbox's connection-tracking entries go with
// its network, so that an established flow of its old peers does not
// reach the next sandbox given its address.
func TestDetachForgetsFlows(t *testing.T) {
	n := newTestNode(t)
	th := newTestHost(t)
	port := listen(t, th.ns, th.addr.String()+":0")
	pid := sandboxProc(t)
	a := mustAttach(t, n, "flows", pid, Policy{Mode: Open})
	_, addr := n.Addrs(a.Index)
	c, err := connect(nsOf(t, pid), th.addr, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	count := func() int {
		var flows []*netlink.ConntrackFlow
		err := retryDump(func() (err error) {
			flows, err = netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, f := range flows {
			if f.Forward.SrcIP.Equal(net.IP(addr.AsSlice())) {
				k++
			}
		}
		return k
	}
	if count() == 0 {
		t.Fatalf("no conntrack entry of %v with an open connection: the test shows nothing", addr)
	}
	if err := n.Detach("flows", a); err != nil {
		t.Fatal(err)
	}
	if k := count(); k != 0 {
		t.Errorf("%d conntrack entries of %v left after detach", k, addr)
	}
}

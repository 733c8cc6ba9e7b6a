package netpolicy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

func TestParseHost(t *testing.T) {
	good := map[string]string{
		"PyPI.org":           "pypi.org",
		"pypi.org.":          "pypi.org",
		"*.pythonhosted.org": "*.pythonhosted.org",
		"bücher.example":     "xn--bcher-kva.example",
		"_dmarc.example.org": "_dmarc.example.org",
		"localhost":          "localhost",
	}
	for in, want := range good {
		got, err := ParseHost(in)
		if err != nil || got != want {
			t.Errorf("ParseHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", "*", "*.org", "a.*.org", "foo*.org", "-a.org", "a-.org", "a..org",
		"a b.org", strings.Repeat("a", 64) + ".org", strings.Repeat("abcdefghi.", 26) + "org", "a/b.org", "a:b"} {
		if got, err := ParseHost(bad); err == nil {
			t.Errorf("ParseHost(%q) = %q, want an error", bad, got)
		}
	}
}

func TestParseHostRulesAndFlag(t *testing.T) {
	mode, rules, err := ParseFlag("allow:pypi.org:443/tcp,*.pythonhosted.org,10.0.0.0/8:53/udp,1.2.3.4")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse("network", mode, "", rules)
	if err != nil {
		t.Fatal(err)
	}
	want := "allow:pypi.org:443/tcp,*.pythonhosted.org,10.0.0.0/8:53/udp,1.2.3.4/32"
	if p.String() != want {
		t.Errorf("policy %s, want %s", p, want)
	}
	if h := p.Hosts("files.pythonhosted.org"); len(h) != 1 || h[0] != "*.pythonhosted.org" {
		t.Errorf("Hosts(files.pythonhosted.org) = %v", h)
	}
	for _, n := range []string{"pythonhosted.org", "evilpythonhosted.org", "pypi.org.evil", "x.pypi.org"} {
		if h := p.Hosts(n); n != "pypi.org" && len(h) != 0 {
			t.Errorf("Hosts(%q) = %v, want none", n, h)
		}
	}
	_, err = Parse("network", "allowlist", "", []RuleSpec{{Host: "bad..name"}})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "network.allow[0]") {
		t.Errorf("bad host: %v, want an invalid error naming the rule", err)
	}
	_, err = Parse("network", "allowlist", "", []RuleSpec{{Host: "a.org", CIDR: "1.2.3.4"}})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("host and cidr: %v, want invalid", err)
	}
}

// TestNameRuleFollowsResolution: a name rule allows nothing until the
// resolver answers the sandbox, then exactly the answered address (on
// the rule's port); an answered address expires with its TTL, but a
// connection begun before keeps working (its ct mark); a policy change
// without the name removes its set and cuts the connection; Detach
// leaves no set.
func TestNameRuleFollowsResolution(t *testing.T) {
	n := newTestNode(t)
	th, other := newTestHost(t), newTestHost(t)
	port := listen(t, th.ns, th.addr.String()+":0")
	otherPort := listen(t, other.ns, other.addr.String()+":0")
	pid := sandboxProc(t)
	pol := Policy{Mode: Allowlist, Allow: []Rule{{Host: "svc.test", Port: uint16(port), Proto: "tcp"}}}
	a := mustAttach(t, n, "nm", pid, pol)
	ns := nsOf(t, pid)
	if err := reaches(ns, th.addr, port); err == nil {
		t.Fatal("a name rule allows its host's address before any answer")
	}
	if err := n.fw.allowResolved("nm", []string{"svc.test"}, []netip.Addr{th.addr}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.ResolvedAddrs("nm", "svc.test"); len(got) != 1 || got[0] != th.addr {
		t.Errorf("resolved addresses %v, want [%v]", got, th.addr)
	}
	c, err := connect(ns, th.addr, port)
	if err != nil {
		t.Fatalf("answered address unreachable: %v", err)
	}
	defer c.Close()
	if err := echo(c); err != nil {
		t.Fatal(err)
	}
	if err := reaches(ns, other.addr, otherPort); err == nil {
		t.Error("an address never answered is reachable")
	}
	// Past the element's timeout: new connections refused, the old one
	// lives on.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := n.ResolvedAddrs("nm", "svc.test"); len(got) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the answered address never expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := reaches(ns, th.addr, port); err == nil {
		t.Error("an expired address is still reachable for new connections")
	}
	if err := echo(c); err != nil {
		t.Errorf("a connection begun while its address was allowed died when it expired: %v", err)
	}
	// Answered again, then a phase without the name: the connection is
	// cut, the set gone.
	if err := n.AllowResolved("nm", []string{"svc.test"}, []netip.Addr{th.addr}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := n.SetPolicy("nm", pid, a, Policy{Mode: Allowlist, Allow: []Rule{allow(other.addr.String()+"/32", 0, "")}}); err != nil {
		t.Fatal(err)
	}
	if err := echo(c); err == nil {
		t.Error("a connection the new phase forbids survived it")
	}
	if got, _ := n.ResolvedAddrs("nm", "svc.test"); len(got) != 0 {
		t.Errorf("removed name still allows %v", got)
	}
	if err := n.Detach("nm", Attachment{Index: a.Index, Policy: Policy{Mode: Allowlist, Allow: []Rule{allow(other.addr.String()+"/32", 0, "")}}}); err != nil {
		t.Fatal(err)
	}
	if _, ids, _ := n.Leftovers(); len(ids) != 0 {
		t.Errorf("rules or sets left after detach: %v", ids)
	}
}

// TestNameSetsRemovedOnDetachAndSweep: a detached sandbox's name sets
// go with it, and Sweep removes those of a sandbox it does not keep.
func TestNameSetsRemovedOnDetachAndSweep(t *testing.T) {
	n := newTestNode(t)
	pol := Policy{Mode: Allowlist, Allow: []Rule{{Host: "a.test"}, {Host: "*.b.test", Port: 443}}}
	pid1, pid2 := sandboxProc(t), sandboxProc(t)
	a1 := mustAttach(t, n, "s1", pid1, pol)
	mustAttach(t, n, "s2", pid2, pol)
	if err := n.AllowResolved("s1", pol.Hosts("a.test"), []netip.Addr{netip.MustParseAddr("198.18.9.9")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := n.Detach("s1", a1); err != nil {
		t.Fatal(err)
	}
	if err := n.Sweep(map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	if _, ids, err := n.Leftovers(); err != nil || len(ids) != 0 {
		t.Errorf("left after detach and sweep: %v %v", ids, err)
	}
}

// TestResolvedAgainExtends: an address answered again before it expired
// gets the new answer's timeout (the kernel updates an element's
// timeout when it is added again), not the first one's.
func TestResolvedAgainExtends(t *testing.T) {
	n := newTestNode(t)
	pid := sandboxProc(t)
	mustAttach(t, n, "rx", pid, Policy{Mode: Allowlist, Allow: []Rule{{Host: "x.test"}}})
	a := []netip.Addr{netip.MustParseAddr("198.18.7.7")}
	if err := n.fw.allowResolved("rx", []string{"x.test"}, a, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := n.fw.allowResolved("rx", []string{"x.test"}, a, time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if got, _ := n.ResolvedAddrs("rx", "x.test"); len(got) != 1 {
		t.Errorf("an address answered again with a longer TTL expired with the first: %v", got)
	}
}

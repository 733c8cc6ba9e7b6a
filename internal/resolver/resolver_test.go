package resolver

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestChainAddrs: the addresses of a name are those along its CNAME
// chain (in any order), not other records an answer carries, and the TTL
// is the chain's least.
func TestChainAddrs(t *testing.T) {
	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	m := &dns.Msg{Answer: []dns.RR{
		rr("cdn.example.net. 300 IN A 192.0.2.1"),
		rr("www.example.org. 60 IN CNAME edge.example.com."),
		rr("edge.example.com. 120 IN CNAME cdn.example.net."),
		rr("unrelated.example. 5 IN A 192.0.2.99"),
		rr("cdn.example.net. 300 IN A 192.0.2.2"),
	}}
	addrs, ttl := chainAddrs(m, "WWW.example.org")
	want := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}
	if !slices.Equal(addrs, want) || ttl != 60*time.Second {
		t.Errorf("chainAddrs = %v, %v; want %v, 60s", addrs, ttl, want)
	}
}

func TestUpstreams(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("# c\nsearch x\nnameserver 192.0.2.53\nnameserver 2001:db8::1\noptions edns0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := SystemUpstreams(p)
	if err != nil || !slices.Equal(got, []string{"192.0.2.53", "2001:db8::1"}) {
		t.Errorf("SystemUpstreams = %v, %v", got, err)
	}
	if err := os.WriteFile(p, []byte("search x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := SystemUpstreams(p); err == nil {
		t.Error("a resolv.conf without nameservers gave upstreams")
	}
	for in, want := range map[string]string{"192.0.2.53": "192.0.2.53:53", "192.0.2.53:5353": "192.0.2.53:5353", "2001:db8::1": "[2001:db8::1]:53"} {
		if got, err := upstreamAddr(in); err != nil || got != want {
			t.Errorf("upstreamAddr(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := upstreamAddr("dns.example"); err == nil {
		t.Error("a name as upstream was accepted")
	}
}

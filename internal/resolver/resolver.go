// Package resolver is the DNS resolver Warren runs for the sandboxes of
// one daemon: one per daemon, on one UDP and one TCP socket on a port of
// the node's that netpolicy redirects every sandbox's port 53 at its
// gateway to (the sandbox's resolv.conf names its gateway). It knows who
// asks by the query's source address, the sandbox's address on the
// daemon's subnet, and answers by that sandbox's policy:
//
//   - open: every name is forwarded to the upstreams (the node's
//     /etc/resolv.conf nameservers, or the daemon's --dns-upstream);
//   - allowlist: a name its name rules allow is forwarded, and the IPv4
//     addresses of the answer (along its CNAME chain) are allowed to the
//     sandbox (netpolicy.Node.AllowResolved) before the answer is sent;
//     any other name is REFUSED and recorded as a dns_refused event, so
//     that queries are no channel out of the sandbox;
//   - group members' hostnames and ids resolve to their group addresses,
//     for members of that group only (whatever their mode);
//   - AAAA gets an empty answer at once for every name it would answer:
//     sandboxes have no IPv6 route, and clients fall back to IPv4 without
//     waiting.
//
// REFUSED rather than NXDOMAIN: the name may well exist, the sandbox is
// not allowed it, and a client (or its agent) reading NXDOMAIN would
// look for a typo; glibc fails REFUSED at once, as NXDOMAIN.
//
// Queries from any other source are refused and not forwarded: the
// socket listens on every address of the node, and netpolicy drops its
// port on every interface but the sandboxes'.
package resolver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/events"
	"github.com/warrenrl/warren/internal/netpolicy"
)

// Results label a query's outcome (metrics: warren_dns_queries_total).
const (
	ResultForwarded = "forwarded" // an upstream's answer, passed on
	ResultGroup     = "group"     // a group member's address
	ResultEmpty     = "empty"     // AAAA (or another type of a group name): no records
	ResultRefused   = "refused"   // not allowed (dns_refused event)
	ResultFailed    = "failed"    // no upstream answered, or the rules could not be written: SERVFAIL
	ResultBad       = "bad"       // malformed, not a query, or not from a sandbox
)

// Results lists every result, for metrics that start at zero.
var Results = []string{ResultForwarded, ResultGroup, ResultEmpty, ResultRefused, ResultFailed, ResultBad}

// Options configure a resolver.
type Options struct {
	Node *netpolicy.Node
	// Upstreams are host:port (or host, port 53) of the nameservers
	// names are forwarded to, tried in order. Empty: the node's
	// /etc/resolv.conf.
	Upstreams []string
	// Port to listen on (UDP and TCP, every address); 0: one the kernel
	// picks free on both.
	Port uint16
	// Observe, if set, is told every query's result and latency.
	Observe func(result string, d time.Duration)
	Logger  *slog.Logger
}

// Resolver answers sandboxes' DNS.
type Resolver struct {
	o         Options
	upstreams []string
	udp       net.PacketConn
	tcp       net.Listener
	port      uint16

	mu  sync.Mutex
	rec events.Recorder
}

var _ events.Source = (*Resolver)(nil)

// upstreamTimeout bounds one upstream exchange; a sandbox's glibc
// (resolv.conf: timeout 2) asks again meanwhile.
const upstreamTimeout = 2 * time.Second

// groupTTL is the TTL of a group member's address: fixed for the
// member's life, short so that a replaced member is found soon.
const groupTTL = 10

// New binds the resolver's sockets; Run serves them.
func New(o Options) (*Resolver, error) {
	if o.Node == nil {
		return nil, errdefs.Invalidf("resolver: a node is required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	ups := o.Upstreams
	if len(ups) == 0 {
		var err error
		if ups, err = SystemUpstreams("/etc/resolv.conf"); err != nil {
			return nil, err
		}
	}
	r := &Resolver{o: o}
	for _, u := range ups {
		hp, err := upstreamAddr(u)
		if err != nil {
			return nil, err
		}
		r.upstreams = append(r.upstreams, hp)
	}
	if err := r.bind(o.Port); err != nil {
		return nil, err
	}
	return r, nil
}

// bind listens on UDP and TCP on the same port: a free one of the
// kernel's choosing for UDP, then TCP on it (retried if taken).
func (r *Resolver) bind(port uint16) error {
	var last error
	for range 20 {
		pc, err := net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", port))
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "resolver: listen udp")
		}
		p := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", p))
		if err != nil {
			pc.Close()
			last = err
			if port != 0 {
				break
			}
			continue
		}
		r.udp, r.tcp, r.port = pc, ln, uint16(p)
		return nil
	}
	return errdefs.Wrap(errdefs.Internal, last, "resolver: listen tcp")
}

// Port is the port the resolver listens on.
func (r *Resolver) Port() uint16 { return r.port }

// Upstreams are the nameservers it forwards to.
func (r *Resolver) Upstreams() []string { return r.upstreams }

// Run serves queries until ctx ends, recording refused names in rec
// (events.Source).
func (r *Resolver) Run(ctx context.Context, rec events.Recorder) error {
	r.mu.Lock()
	r.rec = rec
	r.mu.Unlock()
	h := dns.HandlerFunc(r.serve)
	us := &dns.Server{PacketConn: r.udp, Handler: h}
	ts := &dns.Server{Listener: r.tcp, Handler: h, ReadTimeout: 5 * time.Second, IdleTimeout: func() time.Duration { return 5 * time.Second }}
	errc := make(chan error, 2)
	go func() { errc <- us.ActivateAndServe() }()
	go func() { errc <- ts.ActivateAndServe() }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		_ = us.Shutdown()
		_ = ts.Shutdown()
		return fmt.Errorf("resolver: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return errors.Join(us.ShutdownContext(sctx), ts.ShutdownContext(sctx))
}

// Close releases the sockets of a resolver that never ran.
func (r *Resolver) Close() error { return errors.Join(r.udp.Close(), r.tcp.Close()) }

func (r *Resolver) record(e events.Event) {
	r.mu.Lock()
	rec := r.rec
	r.mu.Unlock()
	if rec != nil {
		rec.Record(e)
	}
}

func (r *Resolver) serve(w dns.ResponseWriter, q *dns.Msg) {
	start := time.Now()
	resp, result := r.answer(w, q)
	if resp != nil {
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			// What does not fit the client's buffer is cut, marked
			// truncated: it asks again over TCP.
			size := dns.MinMsgSize
			if o := q.IsEdns0(); o != nil {
				size = int(o.UDPSize())
			}
			resp.Truncate(size)
		}
		_ = w.WriteMsg(resp)
	}
	if r.o.Observe != nil {
		r.o.Observe(result, time.Since(start))
	}
}

func reply(q *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(q, rcode)
	m.RecursionAvailable = true
	return m
}

func (r *Resolver) answer(w dns.ResponseWriter, q *dns.Msg) (*dns.Msg, string) {
	src, ok := sourceAddr(w.RemoteAddr())
	if !ok {
		return nil, ResultBad
	}
	sb, ok := r.o.Node.SandboxOfAddr(src)
	if !ok {
		return reply(q, dns.RcodeRefused), ResultBad
	}
	if q.Response || q.Opcode != dns.OpcodeQuery {
		return reply(q, dns.RcodeNotImplemented), ResultBad
	}
	if len(q.Question) != 1 {
		return reply(q, dns.RcodeFormatError), ResultBad
	}
	qn := q.Question[0]
	name := strings.ToLower(strings.TrimSuffix(qn.Name, "."))
	if qn.Qclass != dns.ClassINET {
		return reply(q, dns.RcodeRefused), ResultBad
	}
	// A group member's name, for members of its group only.
	if a, ok := r.o.Node.GroupMember(sb.Policy.Group, name); ok {
		m := reply(q, dns.RcodeSuccess)
		m.Authoritative = true
		if qn.Qtype != dns.TypeA {
			return m, ResultEmpty
		}
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qn.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: groupTTL}, A: a.AsSlice()})
		return m, ResultGroup
	}
	var hosts []string
	switch sb.Policy.Mode {
	case netpolicy.Open:
	case netpolicy.Allowlist:
		if hosts = sb.Policy.Hosts(name); len(hosts) > 0 {
			break
		}
		fallthrough
	default:
		r.record(events.Event{Sandbox: sb.ID, Kind: events.DNSRefused,
			Detail: fmt.Sprintf("DNS %s %s refused: not on the network policy's allowlist", dns.TypeToString[qn.Qtype], clip(name))})
		return reply(q, dns.RcodeRefused), ResultRefused
	}
	if qn.Qtype == dns.TypeAAAA {
		// No IPv6 egress: an empty answer, at once.
		return reply(q, dns.RcodeSuccess), ResultEmpty
	}
	_, tcp := w.RemoteAddr().(*net.TCPAddr)
	resp, err := r.forward(q, tcp)
	if err != nil {
		r.o.Logger.Debug("dns upstream failed", "sandbox", sb.ID, "name", name, "err", err)
		return reply(q, dns.RcodeServerFailure), ResultFailed
	}
	if len(hosts) > 0 && resp.Rcode == dns.RcodeSuccess {
		addrs, ttl := chainAddrs(resp, qn.Name)
		if err := r.o.Node.AllowResolved(sb.ID, hosts, addrs, ttl); err != nil {
			r.o.Logger.Warn("dns: allow resolved addresses", "sandbox", sb.ID, "name", name, "err", err)
			return reply(q, dns.RcodeServerFailure), ResultFailed
		}
	}
	resp.Id = q.Id
	return resp, ResultForwarded
}

// clip keeps an event's quoted name short (a name is at most 253 bytes;
// an exfiltration attempt's are long).
func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}

func sourceAddr(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap(), true
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// forward asks the upstreams in turn; a truncated UDP answer is asked
// again over TCP.
func (r *Resolver) forward(q *dns.Msg, tcp bool) (*dns.Msg, error) {
	var errs []error
	for _, u := range r.upstreams {
		net := "udp"
		if tcp {
			net = "tcp"
		}
		c := &dns.Client{Net: net, Timeout: upstreamTimeout}
		resp, _, err := c.Exchange(q, u)
		if err == nil && resp.Truncated && !tcp {
			c.Net = "tcp"
			resp, _, err = c.Exchange(q, u)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return resp, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstream nameserver")
	}
	return nil, errors.Join(errs...)
}

// chainAddrs are the IPv4 addresses an answer gives for name, following
// its CNAME chain, and the least TTL along the way.
func chainAddrs(m *dns.Msg, name string) ([]netip.Addr, time.Duration) {
	names := map[string]bool{strings.ToLower(dns.Fqdn(name)): true}
	ttl := uint32(1<<32 - 1)
	// A chain's records may come in any order: follow it to its end.
	for changed := true; changed; {
		changed = false
		for _, rr := range m.Answer {
			if c, ok := rr.(*dns.CNAME); ok && names[strings.ToLower(c.Hdr.Name)] && !names[strings.ToLower(c.Target)] {
				names[strings.ToLower(c.Target)] = true
				ttl = min(ttl, c.Hdr.Ttl)
				changed = true
			}
		}
	}
	var out []netip.Addr
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok && names[strings.ToLower(a.Hdr.Name)] {
			if ad, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ad)
				ttl = min(ttl, a.Hdr.Ttl)
			}
		}
	}
	return out, time.Duration(ttl) * time.Second
}

// SystemUpstreams reads the nameservers of a resolv.conf.
func SystemUpstreams(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, err, "resolver: no upstream nameservers given and none read")
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			out = append(out, f[1])
		}
	}
	if len(out) == 0 {
		return nil, errdefs.Invalidf("resolver: %s names no nameserver; give --dns-upstream", path)
	}
	return out, nil
}

// upstreamAddr is u as host:port (port 53 unless given).
func upstreamAddr(u string) (string, error) {
	if a, err := netip.ParseAddr(u); err == nil {
		return netip.AddrPortFrom(a.WithZone(""), 53).String(), nil
	}
	if ap, err := netip.ParseAddrPort(u); err == nil {
		return ap.String(), nil
	}
	return "", errdefs.Invalidf("dns upstream %q: want an address or address:port", u)
}

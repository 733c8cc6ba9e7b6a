package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testnet"
)

// NetworkConfig configures `warren bench network`.
type NetworkConfig struct {
	Creates  int // timed creates per mode
	Updates  int // timed policy changes
	Connects int // TCP connections per system
	MiB      int // bytes sent per throughput run, in MiB
	Runs     int // throughput runs per system
	// Settle is the pause after each delete of the create runs: a deleted
	// sandbox's network namespace (and veth) is torn down by the kernel
	// in the background, which otherwise lands on the next create
	// whatever its mode.
	Settle time.Duration
}

// NetworkReport is the result of `warren bench network`.
type NetworkReport struct {
	Benchmark string             `json:"benchmark"`
	Daemon    string             `json:"daemon"`
	Create    map[string]Summary `json:"create_by_mode"`
	// CreateOverNoneP50 is each mode's create p50 minus none's, ms.
	CreateOverNoneP50 map[string]float64 `json:"create_over_none_p50_ms"`
	PolicyChange      Summary            `json:"policy_change"`
	Traffic           []NetworkTraffic   `json:"traffic"`
	// Resolve is A queries from an allowlisted sandbox through Warren's
	// resolver (at its gateway) and straight to the same upstream (a
	// test host), interleaved; ResolveRatioP50 is the first's p50 over
	// the second's.
	Resolve         map[string]Summary `json:"resolve,omitempty"`
	ResolveRatioP50 float64            `json:"resolve_ratio_p50,omitempty"`
	Notes           []string           `json:"notes,omitempty"`
}

// NetworkTraffic is TCP from a sandbox (or the peer) to a test host.
type NetworkTraffic struct {
	System  string  `json:"system"`
	Connect Summary `json:"connect"`
	MiBPerS float64 `json:"mib_per_s"` // median of the runs
}

// modes are the create runs: allowlist has one CIDR rule,
// allowlist-name one name rule (its set is made at create).
var modes = []string{"none", "open", "allowlist", "allowlist-name"}

// RunNetwork measures what a sandbox's network costs: create latency in
// each mode (interleaved, so that drift hits all alike), the latency of
// UpdateSandbox changing a policy, and TCP connections and throughput
// from a sandbox to a test host (a network namespace this run makes on
// the node, 198.18.0.0/15: nothing leaves the machine) in modes open and
// allowlist, against the peer: the same busybox commands in a bare
// network namespace joined to the test host's by a veth pair, without
// routing, NAT or rules.
func RunNetwork(ctx context.Context, env *Env, cfg NetworkConfig) (*NetworkReport, error) {
	rep := &NetworkReport{Benchmark: "network", Daemon: env.describe(), Create: map[string]Summary{}, CreateOverNoneP50: map[string]float64{}}
	th, err := testnet.NewHost()
	if err != nil {
		return nil, fmt.Errorf("test host: %w", err)
	}
	defer th.Close()
	policies := map[string]*warrenv1.NetworkPolicy{
		"none": nil, "open": {Mode: "open"},
		"allowlist":      {Mode: "allowlist", Allow: []*warrenv1.NetworkRule{{Cidr: th.Addr.String() + "/32"}}},
		"allowlist-name": {Mode: "allowlist", Allow: []*warrenv1.NetworkRule{{Host: benchName}}},
	}

	// Create latency per mode.
	samples := map[string][]time.Duration{}
	env.logf("network: %d creates per mode (%v), interleaved", cfg.Creates, modes)
	for i := range cfg.Creates + 3 {
		for _, m := range modes {
			req := env.CreateRequest()
			req.Network = policies[m]
			t0 := time.Now()
			sb, err := env.Client.Create(ctx, req)
			d := time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("create (%s): %w", m, err)
			}
			if err := env.Client.Delete(ctx, sb.GetId()); err != nil {
				return nil, err
			}
			time.Sleep(cfg.Settle)
			if i >= 3 { // warm-up
				samples[m] = append(samples[m], d)
			}
		}
	}
	for _, m := range modes {
		rep.Create[m] = Summarize(samples[m])
	}
	for _, m := range modes {
		rep.CreateOverNoneP50[m] = rep.Create[m].P50 - rep.Create["none"].P50
	}

	// Policy changes of one sandbox, open <-> allowlist.
	sb, err := env.Client.Create(ctx, withNetwork(env.CreateRequest(), policies["open"]))
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Client.Delete(context.WithoutCancel(ctx), sb.GetId()) }()
	env.logf("network: %d policy changes", cfg.Updates)
	var upd []time.Duration
	for i := range cfg.Updates {
		p := policies["open"]
		if i%2 == 0 {
			p = policies["allowlist"]
		}
		t0 := time.Now()
		if _, err := env.Client.Update(ctx, sb.GetId(), client.SandboxUpdate{Network: p}); err != nil {
			return nil, fmt.Errorf("update: %w", err)
		}
		upd = append(upd, time.Since(t0))
	}
	rep.PolicyChange = Summarize(upd)

	// Traffic: the peer first, then the sandbox in each mode.
	self := staticSelf()
	if self == "" {
		rep.Notes = append(rep.Notes, "traffic not measured: this warren binary is not statically linked, so it cannot run in the busybox sandbox (make build makes a static one)")
		return rep, nil
	}
	env.logf("network: TCP to the test host, %d connections and %d x %d MiB per system", cfg.Connects, cfg.Runs, cfg.MiB)
	srv, err := newTrafficServer(th.NS, cfg.MiB)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	peer, err := runPeerTraffic(ctx, self, srv, cfg)
	if err != nil {
		return nil, fmt.Errorf("peer: %w", err)
	}
	rep.Traffic = append(rep.Traffic, peer)
	bin, err := os.ReadFile(self)
	if err != nil {
		return nil, err
	}
	if err := env.Client.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: sb.GetId(), Path: "/netclient", Content: bin, Mode: 0o755}); err != nil {
		return nil, fmt.Errorf("copy the client into the sandbox: %w", err)
	}
	for _, m := range []string{"open", "allowlist"} {
		if _, err := env.Client.Update(ctx, sb.GetId(), client.SandboxUpdate{Network: policies[m]}); err != nil {
			return nil, err
		}
		tr, err := measureTraffic(srv, th.Addr, cfg, "warren "+m, func(args []string) ([]byte, error) {
			res, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Argv: append([]string{"/netclient"}, args...), TimeoutMs: 300_000})
			if err != nil {
				return nil, err
			}
			if res.GetExitCode() != 0 {
				return nil, fmt.Errorf("exit %d: %s", res.GetExitCode(), res.GetStderr())
			}
			return res.GetStdout(), nil
		})
		if err != nil {
			return nil, err
		}
		rep.Traffic = append(rep.Traffic, tr)
	}
	if err := measureResolve(ctx, env, rep, th, sb.GetId(), cfg); err != nil {
		return nil, fmt.Errorf("resolve: %w", err)
	}
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("create: the Create call, p50/p99 over interleaved creates of each mode; each sandbox is deleted, then %v pass before the next create (the kernel tears a network namespace down in the background)", cfg.Settle),
		"policy change: UpdateSandbox open <-> allowlist of one running sandbox, from request to reply (the rules apply before the reply: one nftables transaction, then the sandbox's forbidden TCP connections are aborted)",
		"traffic: this binary (`warren bench netclient`) in the sandbox, or in the peer's namespace, to a Go server on a test host: connect = the dial of each of the sequential connections (p50/p99); MiB/s = one connection's send of the MiB until the server has read them all, median of the runs",
		"peer: the same client in a bare network namespace joined to the test host's by a veth pair (no routing through the node, no NAT, no rules)")
	return rep, nil
}

// benchName is the name the resolve benchmark's upstream serves.
const benchName = "bench.warren.test"

// measureResolve times A queries of benchName from sandbox id through
// Warren's resolver and straight to its upstream, a nameserver on the
// test host: the private daemon is restarted with --dns-upstream naming
// it (the sandbox is adopted), and the sandbox allowlisted for the name
// and for UDP 53 of the test host.
func measureResolve(ctx context.Context, env *Env, rep *NetworkReport, th *testnet.Host, id string, cfg NetworkConfig) error {
	if !env.Private {
		rep.Notes = append(rep.Notes, "resolve not measured: it restarts the daemon with --dns-upstream, so it needs a private one (no --addr)")
		return nil
	}
	up := netip.AddrPortFrom(th.Addr, 53).String()
	stop, err := serveBenchDNS(th.NS, up)
	if err != nil {
		return err
	}
	defer stop()
	if err := env.stopDaemon(); err != nil {
		return err
	}
	env.daemonArgs = append(env.daemonArgs, "--dns-upstream", up)
	if err := env.execDaemon(); err != nil {
		return err
	}
	if err := env.waitReady(ctx); err != nil {
		return err
	}
	p := &warrenv1.NetworkPolicy{Mode: "allowlist", Allow: []*warrenv1.NetworkRule{{Host: benchName}, {Cidr: th.Addr.String() + "/32", Protocol: "udp"}}}
	sb, err := env.Client.Update(ctx, id, client.SandboxUpdate{Network: p})
	if err != nil {
		return err
	}
	addr, err := netip.ParseAddr(sb.GetNetworkAddress())
	if err != nil {
		return err
	}
	gw := netip.AddrPortFrom(addr.Prev(), 53).String()
	n := max(cfg.Connects, 20)
	env.logf("network: %d resolves through Warren's resolver and straight to the upstream, interleaved", 4*n)
	samples := map[string][]float64{}
	run := func(server string) (Summary, error) {
		res, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, TimeoutMs: 300_000,
			Argv: []string{"/netclient", "bench", "netclient", "--dns", server, "--name", benchName, "--n", strconv.Itoa(n)}})
		if err != nil {
			return Summary{}, err
		}
		if res.GetExitCode() != 0 {
			return Summary{}, fmt.Errorf("exit %d: %s", res.GetExitCode(), res.GetStderr())
		}
		var r NetClientResult
		if err := json.Unmarshal(res.GetStdout(), &r); err != nil {
			return Summary{}, err
		}
		return r.Resolve, nil
	}
	rep.Resolve = map[string]Summary{}
	// ABBA: two rounds of each, so that drift hits both alike; the
	// summaries are of the rounds' summaries (p50 = median of p50s).
	for _, server := range []string{gw, up, up, gw} {
		s, err := run(server)
		if err != nil {
			return err
		}
		name := "warren resolver"
		if server == up {
			name = "upstream direct"
		}
		samples[name+" p50"] = append(samples[name+" p50"], s.P50)
		samples[name+" p99"] = append(samples[name+" p99"], s.P99)
		rep.Resolve[name] = Summary{N: rep.Resolve[name].N + s.N}
	}
	for _, name := range []string{"warren resolver", "upstream direct"} {
		s := rep.Resolve[name]
		s.P50 = (samples[name+" p50"][0] + samples[name+" p50"][1]) / 2
		s.P99 = max(samples[name+" p99"][0], samples[name+" p99"][1])
		rep.Resolve[name] = s
	}
	if d := rep.Resolve["upstream direct"].P50; d > 0 {
		rep.ResolveRatioP50 = rep.Resolve["warren resolver"].P50 / d
	}
	rep.Notes = append(rep.Notes, "resolve: `warren bench netclient --dns` in an allowlisted sandbox sends sequential UDP A queries for a name its name rule allows, to its gateway (Warren's resolver: policy check, upstream round trip, nftables element add) and straight to the upstream (a miekg/dns server on the test host); two rounds of each, ABBA; p50 is the mean of the rounds' p50s, p99 the larger of their p99s")
	return nil
}

// serveBenchDNS answers benchName with a test address on UDP at addr in
// namespace ns until stop.
func serveBenchDNS(ns netns.NsHandle, addr string) (stop func(), err error) {
	var pc net.PacketConn
	if err := testnet.InNetns(ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		return nil, err
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.IPv4(192, 0, 2, 10)})
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	return func() { _ = srv.Shutdown() }, nil
}

func withNetwork(req *warrenv1.CreateRequest, p *warrenv1.NetworkPolicy) *warrenv1.CreateRequest {
	req.Network = p
	return req
}

// trafficServer listens on the test host: on one port it closes every
// connection at once; on the other it reads until it has MiB MiB, then
// closes.
type trafficServer struct {
	ns             netns.NsHandle
	connLn, sinkLn net.Listener
	want           int64
}

// newTrafficServer listens on every address of the test host's
// namespace ns: the sandbox reaches it on the host's eth0, the peer on
// its own pair.
func newTrafficServer(ns netns.NsHandle, mib int) (*trafficServer, error) {
	s := &trafficServer{ns: ns, want: int64(mib) << 20}
	var err error
	if s.connLn, err = testnet.Listen(ns, "0.0.0.0:0"); err != nil {
		return nil, err
	}
	if s.sinkLn, err = testnet.Listen(ns, "0.0.0.0:0"); err != nil {
		s.connLn.Close()
		return nil, err
	}
	go func() {
		for {
			c, err := s.connLn.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := s.sinkLn.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.CopyN(io.Discard, c, s.want)
			}()
		}
	}()
	return s, nil
}

func (s *trafficServer) close() { s.connLn.Close(); s.sinkLn.Close() }

func (s *trafficServer) port(ln net.Listener) int { return ln.Addr().(*net.TCPAddr).Port }

// measureTraffic runs the client through run (given its arguments, it
// returns its output): the connections once, then the sends.
func measureTraffic(s *trafficServer, addr netip.Addr, cfg NetworkConfig, system string, run func(args []string) ([]byte, error)) (NetworkTraffic, error) {
	tr := NetworkTraffic{System: system}
	connAddr := netip.AddrPortFrom(addr, uint16(s.port(s.connLn))).String()
	sinkAddr := netip.AddrPortFrom(addr, uint16(s.port(s.sinkLn))).String()
	out, err := run([]string{"bench", "netclient", "--connect", connAddr, "--n", strconv.Itoa(cfg.Connects)})
	if err != nil {
		return tr, fmt.Errorf("%s: connections: %w", system, err)
	}
	var res NetClientResult
	if err := json.Unmarshal(out, &res); err != nil {
		return tr, fmt.Errorf("%s: client output %q: %w", system, out, err)
	}
	tr.Connect = res.Connect
	var rates []float64
	for range cfg.Runs {
		out, err := run([]string{"bench", "netclient", "--connect", connAddr, "--n", "1", "--send", sinkAddr, "--mib", strconv.Itoa(cfg.MiB)})
		if err != nil {
			return tr, fmt.Errorf("%s: throughput: %w", system, err)
		}
		if err := json.Unmarshal(out, &res); err != nil {
			return tr, fmt.Errorf("%s: client output %q: %w", system, out, err)
		}
		rates = append(rates, res.MiBPerS)
	}
	slices.Sort(rates)
	tr.MiBPerS = Percentile(rates, 50)
	return tr, nil
}

// runPeerTraffic runs the same commands with the run's busybox in a new
// network namespace whose only interface (besides lo) is a veth pair
// straight to the test host's namespace.
func runPeerTraffic(ctx context.Context, self string, s *trafficServer, cfg NetworkConfig) (NetworkTraffic, error) {
	// A process that holds the peer's namespace until we are done.
	holder := exec.CommandContext(ctx, "sleep", "3600")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := holder.Start(); err != nil {
		return NetworkTraffic{}, err
	}
	defer func() { _ = holder.Process.Kill(); _ = holder.Wait() }()
	peerNS, err := netns.GetFromPid(holder.Process.Pid)
	if err != nil {
		return NetworkTraffic{}, err
	}
	defer peerNS.Close()
	hostNS := s.ns
	// A pair of its own, straight between the peer's namespace and the
	// test host's: 198.19.255.0/30 (in the benchmarking range).
	peerAddr := netip.MustParseAddr("198.19.255.1")
	srvAddr := netip.MustParseAddr("198.19.255.2")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "wbench" + strconv.Itoa(os.Getpid()%10000), Namespace: netlink.NsFd(int(peerNS))},
		PeerName: "peer0", PeerNamespace: netlink.NsFd(int(hostNS))}
	if err := netlink.LinkAdd(veth); err != nil {
		return NetworkTraffic{}, fmt.Errorf("peer veth: %w", err)
	}
	// Both ends die with their namespaces (the holder's at the end).
	cfgEnd := func(name string, a netip.Addr) func() error {
		return func() error {
			for _, n := range []string{"lo", name} {
				l, err := netlink.LinkByName(n)
				if err != nil {
					return err
				}
				if n == name {
					if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}}); err != nil {
						return err
					}
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
			}
			return nil
		}
	}
	if err := testnet.InNetns(peerNS, cfgEnd(veth.Name, peerAddr)); err != nil {
		return NetworkTraffic{}, err
	}
	if err := testnet.InNetns(hostNS, cfgEnd("peer0", srvAddr)); err != nil {
		return NetworkTraffic{}, err
	}
	if err := waitOperUp(peerNS, veth.Name); err != nil {
		return NetworkTraffic{}, err
	}
	pid := holder.Process.Pid
	run := func(args []string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/proc/" + strconv.Itoa(pid) + "/ns/net", self}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("%w: %s", err, stderr.String())
		}
		return out, nil
	}
	return measureTraffic(s, srvAddr, cfg, "peer: bare veth", run)
}

// waitOperUp waits until interface name in ns is up (a veth drops what
// it is given until then).
func waitOperUp(ns netns.NsHandle, name string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		var up bool
		err := testnet.InNetns(ns, func() error {
			l, err := netlink.LinkByName(name)
			if err == nil {
				up = l.Attrs().OperState == netlink.OperUp
			}
			return err
		})
		if err != nil || up {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not up after 2s", name)
		}
		time.Sleep(time.Millisecond)
	}
}

// Table writes the report.
func (r *NetworkReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "network (daemon: %s)\n\n", r.Daemon)
	t := newTable("CREATE", "N", "P50 ms", "P99 ms", "MEAN ms", "P50 OVER NONE ms")
	for _, m := range modes {
		s := r.Create[m]
		over := fmt.Sprintf("%+.2f", r.CreateOverNoneP50[m])
		t.add(m, strconv.Itoa(s.N), ms(s.P50), ms(s.P99), ms(s.Mean), over)
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "\npolicy change (UpdateSandbox): n %d, p50 %s ms, p99 %s ms, max %s ms\n\n",
		r.PolicyChange.N, ms(r.PolicyChange.P50), ms(r.PolicyChange.P99), ms(r.PolicyChange.Max))
	t = newTable("TRAFFIC TO A TEST HOST", "CONNECT P50 ms", "CONNECT P99 ms", "MiB/s", "CONNECT P50 / PEER", "MiB/s / PEER")
	var peer NetworkTraffic
	for _, tr := range r.Traffic {
		if tr.System == "peer: bare veth" {
			peer = tr
		}
	}
	for _, tr := range r.Traffic {
		rc, rt := "-", "-"
		if peer.Connect.P50 > 0 && tr.System != peer.System {
			rc = fmt.Sprintf("%.2fx", tr.Connect.P50/peer.Connect.P50)
			rt = fmt.Sprintf("%.2fx", tr.MiBPerS/peer.MiBPerS)
		}
		t.add(tr.System, fmt.Sprintf("%.3f", tr.Connect.P50), fmt.Sprintf("%.3f", tr.Connect.P99), num(tr.MiBPerS), rc, rt)
	}
	if err := t.write(w); err != nil {
		return err
	}
	if len(r.Resolve) > 0 {
		fmt.Fprintln(w)
		t = newTable("RESOLVE (A, UDP)", "N", "P50 ms", "P99 ms")
		for _, name := range []string{"warren resolver", "upstream direct"} {
			s := r.Resolve[name]
			t.add(name, strconv.Itoa(s.N), fmt.Sprintf("%.3f", s.P50), fmt.Sprintf("%.3f", s.P99))
		}
		if err := t.write(w); err != nil {
			return err
		}
		fmt.Fprintf(w, "resolver p50 / upstream p50: %.2fx\n", r.ResolveRatioP50)
	}
	writeNotes(w, r.Notes)
	return nil
}

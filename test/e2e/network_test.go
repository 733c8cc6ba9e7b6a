package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// Network tests send packets only to test hosts (network namespaces the
// test makes, testutil.NewTestHost), to sandboxes of the test's own
// daemon, and to the node's own addresses (which must refuse them).
// Every fetch in a sandbox is one HTTP/1.0 request through busybox nc
// with a 2 s connect timeout (the static busybox's wget crashes looking
// the host up without the libc's NSS modules).

// httpHost serves "hello <name>" on / and, on /stream, a line every 20 ms
// for up to 30 s, on a test host; it returns the server's port.
func httpHost(t *testing.T, ns netns.NsHandle, addr, name string) int {
	t.Helper()
	ln := testutil.Listen(t, ns, addr)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "hello %s\n", name) })
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for i := range 1500 {
			if _, err := fmt.Fprintf(w, "line %d\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// fetch gets / from host:port in sandbox id and returns the body, or
// "" and false when it failed.
func (e *env) fetch(id, host string, port int) (string, bool) {
	e.t.Helper()
	res := e.sh(id, fmt.Sprintf("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 %s %d", host, port))
	out := string(res.Stdout)
	if res.ExitCode != 0 || !strings.HasPrefix(out, "HTTP/1.") {
		return "", false
	}
	_, body, _ := strings.Cut(out, "\r\n\r\n")
	return body, true
}

func policy(mode string, rules ...*warrenv1.NetworkRule) *warrenv1.NetworkPolicy {
	return &warrenv1.NetworkPolicy{Mode: mode, Allow: rules}
}

func rule(cidr string, port int, proto string) *warrenv1.NetworkRule {
	r := &warrenv1.NetworkRule{Cidr: cidr, Protocol: proto}
	if port != 0 {
		p := uint32(port)
		r.Port = &p
	}
	return r
}

// gateway is the default gateway a sandbox sees (the node's end of its
// veth), "" without one.
func (e *env) gateway(id string) string {
	e.t.Helper()
	out := e.shOK(id, "ip route show default 2>/dev/null || true")
	f := strings.Fields(out)
	for i := range f {
		if f[i] == "via" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// TestNetworkNoneOnlyLoopback: a sandbox in mode none (the default) has
// no interface but lo, reaches no test host, and costs the node no veth
// and no nftables state.
func TestNetworkNoneOnlyLoopback(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	th := testutil.NewTestHost(t)
	port := httpHost(t, th.NS, th.Addr.String()+":0", "th")
	e.create(&warrenv1.CreateRequest{Id: "none"})
	e.create(&warrenv1.CreateRequest{Id: "none2", Network: policy("none")})
	for _, id := range []string{"none", "none2"} {
		links := e.shOK(id, "ls /sys/class/net 2>/dev/null; awk -F: 'NR>2 {print $1}' /proc/net/dev")
		if f := strings.Fields(links); len(f) != 1 || f[0] != "lo" {
			t.Errorf("%s: interfaces %q, want lo only", id, f)
		}
		if body, ok := e.fetch(id, th.Addr.String(), port); ok {
			t.Errorf("%s reaches the test host: %q", id, body)
		}
		for _, r := range e.resourcesOf(id) {
			if r.kind == "veth" || r.kind == "nft" {
				t.Errorf("%s in mode none holds %v", id, r)
			}
		}
		if sb, err := e.c.Get(ctxFor(t, 10*time.Second), id); err != nil || sb.Network != nil || sb.NetworkAddress != "" {
			t.Errorf("get %s: %v %v", id, sb, err)
		}
	}
	if e.net.HasTable() {
		t.Errorf("the daemon made its nftables table for sandboxes without a network")
	}
}

// TestNetworkOpenReachesTestHost: a sandbox in mode open reaches a test
// host through the node's NAT, starts with its network up (the first
// fetch succeeds), and `sandbox get` shows its policy and address.
func TestNetworkOpenReachesTestHost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	th := testutil.NewTestHost(t)
	port := httpHost(t, th.NS, th.Addr.String()+":0", "th")
	sb := e.create(&warrenv1.CreateRequest{Id: "open", Network: policy("open")})
	if sb.GetNetwork().GetMode() != "open" || sb.NetworkAddress == "" {
		t.Errorf("created sandbox: network %v address %q", sb.GetNetwork(), sb.NetworkAddress)
	}
	if body, ok := e.fetch("open", th.Addr.String(), port); !ok || body != "hello th\n" {
		t.Errorf("open sandbox does not reach the test host: %q", body)
	}
	out, _, code := e.cli(nil, "sandbox", "get", "open")
	if code != 0 || !strings.Contains(out, "Network:") || !strings.Contains(out, "open (address "+sb.NetworkAddress+")") {
		t.Errorf("sandbox get:\n%s", out)
	}
}

// TestNetworkAllowlistOnlyAllowed: an allowlisted sandbox reaches the
// allowed test host and port, and neither another port of that host nor
// another test host.
func TestNetworkAllowlistOnlyAllowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	th, other := testutil.NewTestHost(t), testutil.NewTestHost(t)
	p1 := httpHost(t, th.NS, th.Addr.String()+":0", "p1")
	p2 := httpHost(t, th.NS, th.Addr.String()+":0", "p2")
	p3 := httpHost(t, other.NS, other.Addr.String()+":0", "other")
	// Through the CLI, as a user spells it.
	out, errOut, code := e.cli(nil, "sandbox", "create", "--image", imageName, "--id", "al",
		"--network", fmt.Sprintf("allow:%s:%d/tcp", th.Addr, p1))
	if code != 0 {
		t.Fatalf("create: %s %s", out, errOut)
	}
	if body, ok := e.fetch("al", th.Addr.String(), p1); !ok || body != "hello p1\n" {
		t.Errorf("allowed host:port unreachable: %q", body)
	}
	if _, ok := e.fetch("al", th.Addr.String(), p2); ok {
		t.Errorf("another port of the allowed host is reachable")
	}
	if _, ok := e.fetch("al", other.Addr.String(), p3); ok {
		t.Errorf("a host not on the allowlist is reachable")
	}
	out, _, _ = e.cli(nil, "sandbox", "get", "al")
	if !strings.Contains(out, fmt.Sprintf("allow:%s/32:%d/tcp", th.Addr, p1)) {
		t.Errorf("sandbox get does not show the allowlist:\n%s", out)
	}
}

// TestNetworkNeverReachesNodeOrSandboxes: in no mode does a sandbox reach
// a service of the node (a listener of the test on all the node's
// addresses, the daemon's own TCP API), whichever node address it tries,
// nor another sandbox, not even with an allowlist of everything.
func TestNetworkNeverReachesNodeOrSandboxes(t *testing.T) {
	t.Parallel()
	// The API on all the node's addresses, as a careless operator might
	// run it (with a token: an answer of any kind, 401 included, would
	// count as reaching it).
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("e2e-network-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{serveArgs: []string{"--listen", "0.0.0.0:0", "--token-file", tokenFile}})
	m := tcpListenRE.FindStringSubmatch(e.logTail(1000))
	if m == nil {
		t.Fatalf("no TCP listener in the daemon log:\n%s", e.logTail(20))
	}
	_, apiPortStr, _ := net.SplitHostPort(m[1])
	apiPort, _ := strconv.Atoi(apiPortStr)
	th := testutil.NewTestHost(t)
	thPort := httpHost(t, th.NS, th.Addr.String()+":0", "th")
	nodePort := httpHost(t, 0, "0.0.0.0:0", "node")
	e.create(&warrenv1.CreateRequest{Id: "peer", Network: policy("open")})
	peer := e.sb("peer")
	if _, err := e.c.StartProcess(ctxFor(t, time.Minute), &warrenv1.ExecRequest{SandboxId: "peer",
		Shell: "mkdir -p /www && echo peer > /www/index.html && exec httpd -f -p 8080 -h /www"}); err != nil {
		t.Fatal(err)
	}
	waitSh(t, e, "peer", "netstat -ltn | grep -q :8080", 10*time.Second, "the peer's server")
	if body, ok := e.fetch("peer", "127.0.0.1", 8080); !ok || body != "peer\n" {
		t.Fatalf("peer's own server: %q", body)
	}
	e.create(&warrenv1.CreateRequest{Id: "open", Network: policy("open")})
	e.create(&warrenv1.CreateRequest{Id: "all", Network: policy("allowlist", rule("0.0.0.0/0", 0, ""))})
	e.create(&warrenv1.CreateRequest{Id: "none"})
	for _, id := range []string{"open", "all", "none"} {
		if id != "none" {
			// The control: the network works.
			if _, ok := e.fetch(id, th.Addr.String(), thPort); !ok {
				t.Errorf("%s does not reach the test host", id)
			}
		}
		targets := map[string]string{
			"node, address toward the test host": th.Gateway.String(),
			"peer sandbox":                       peer.NetworkAddress,
		}
		if gw := e.gateway(id); gw != "" {
			targets["node, its end of the sandbox's veth"] = gw
		}
		for what, addr := range targets {
			ports := map[string]int{"node listener": nodePort, "daemon API": apiPort}
			if what == "peer sandbox" {
				ports = map[string]int{"peer's server": 8080}
			}
			for pwhat, port := range ports {
				if body, ok := e.fetch(id, addr, port); ok {
					t.Errorf("%s reaches the %s on the %s (%s:%d): %q", id, pwhat, what, addr, port, body)
				}
			}
		}
		for _, addr := range []string{"169.254.169.254", "fd00:ec2::254"} {
			if _, ok := e.fetch(id, addr, 80); ok {
				t.Errorf("%s reaches metadata address %s", id, addr)
			}
		}
	}
}

// sb gets a sandbox or fails the test.
func (e *env) sb(id string) *warrenv1.Sandbox {
	e.t.Helper()
	sb, err := e.c.Get(ctxFor(e.t, 10*time.Second), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return sb
}

// TestNetworkPhaseChangeCutsConnection: UpdateSandbox's new policy
// applies at once: an established connection it forbids is cut (the
// download in the sandbox ends), new connections it forbids fail, new
// ones it allows work; none -> open -> none adds and removes the
// interface of a running sandbox.
func TestNetworkPhaseChangeCutsConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	th, other := testutil.NewTestHost(t), testutil.NewTestHost(t)
	port := httpHost(t, th.NS, th.Addr.String()+":0", "th")
	port2 := httpHost(t, other.NS, other.Addr.String()+":0", "other")
	e.create(&warrenv1.CreateRequest{Id: "ph", Network: policy("open")})
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "ph",
		// The request, then stdin held open; done is written when nc
		// itself ends.
		Shell: fmt.Sprintf("{ printf 'GET /stream HTTP/1.0\\r\\n\\r\\n'; sleep 30; } | { nc %s %d > /tmp/stream; echo $? > /tmp/done; }", th.Addr, port)}); err != nil {
		t.Fatal(err)
	}
	waitSh(t, e, "ph", "test -s /tmp/stream", 10*time.Second, "the download to start")
	if got := e.shOK("ph", "cat /tmp/done 2>/dev/null || echo running"); got != "running\n" {
		t.Fatalf("download ended early: %q", got)
	}
	start := time.Now()
	if _, err := e.c.Update(ctx, "ph", client.SandboxUpdate{Network: policy("allowlist", rule(other.Addr.String(), port2, "tcp"))}); err != nil {
		t.Fatal(err)
	}
	t.Logf("UpdateSandbox (network) took %v", time.Since(start))
	// The stream sends a line every 20 ms: the sandbox's next ACK is
	// answered with a reset.
	waitSh(t, e, "ph", "test -s /tmp/done", 5*time.Second, "the forbidden download to be cut")
	// (busybox nc exits 0 either way: the stream's end tells.)
	if got := e.sh("ph", "grep -c 'line 1499' /tmp/stream"); strings.TrimSpace(string(got.Stdout)) != "0" {
		t.Errorf("the download ran to its end")
	}
	if body, ok := e.fetch("ph", other.Addr.String(), port2); !ok || body != "hello other\n" {
		t.Errorf("new allowed connection fails: %q", body)
	}
	if _, ok := e.fetch("ph", th.Addr.String(), port); ok {
		t.Errorf("new forbidden connection succeeds")
	}
	if sb := e.sb("ph"); sb.GetNetwork().GetMode() != "allowlist" || len(sb.GetNetwork().GetAllow()) != 1 {
		t.Errorf("after update: %v", sb.GetNetwork())
	}

	// none -> open -> none on a running sandbox.
	e.create(&warrenv1.CreateRequest{Id: "late"})
	if _, err := e.c.Update(ctx, "late", client.SandboxUpdate{Network: policy("open")}); err != nil {
		t.Fatal(err)
	}
	if body, ok := e.fetch("late", th.Addr.String(), port); !ok || body != "hello th\n" {
		t.Errorf("after none -> open: %q", body)
	}
	if _, err := e.c.Update(ctx, "late", client.SandboxUpdate{Network: policy("none")}); err != nil {
		t.Fatal(err)
	}
	if links := strings.Fields(e.shOK("late", "ls /sys/class/net 2>/dev/null; awk -F: 'NR>2 {print $1}' /proc/net/dev")); len(links) != 1 {
		t.Errorf("after open -> none: interfaces %q", links)
	}
	for _, r := range e.resourcesOf("late") {
		if r.kind == "veth" || r.kind == "nft" {
			t.Errorf("after open -> none: %v left", r)
		}
	}
}

// waitSh polls a shell test in a sandbox until it succeeds.
func waitSh(t *testing.T, e *env, id, cond string, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if e.sh(id, cond).ExitCode == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNetworkBadPolicyInvalid: a bad policy (CIDR, port 0 or above
// 65535, protocol, unknown mode, rules without allowlist) is an invalid
// error naming the field, at create and update, and leaves nothing.
func TestNetworkBadPolicyInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, time.Minute)
	bad := []struct {
		field string
		p     *warrenv1.NetworkPolicy
	}{
		{"network.allow[0]: cidr", policy("allowlist", rule("10.0.0.0/33", 0, ""))},
		{"network.allow[0]: cidr", policy("allowlist", rule("example.com", 0, ""))},
		{"network.allow[1]: port", policy("allowlist", rule("10.0.0.0/8", 80, ""), &warrenv1.NetworkRule{Cidr: "10.0.0.0/8", Port: new(uint32)})},
		{"network.allow[0]: port", policy("allowlist", rule("10.0.0.0/8", 70000, ""))},
		{"network.allow[0]: protocol", policy("allowlist", rule("10.0.0.0/8", 0, "icmp"))},
		{"network.mode", policy("closed")},
		{"network.allow", policy("open", rule("10.0.0.0/8", 0, ""))},
		{"network.group", &warrenv1.NetworkPolicy{Mode: "open", Group: "Not A Name"}},
	}
	e.create(&warrenv1.CreateRequest{Id: "live"})
	for _, tc := range bad {
		field, p := tc.field, tc.p
		_, err := e.c.Create(ctx, &warrenv1.CreateRequest{Id: "bad", Image: imageName, Network: p})
		wantCategory(t, err, client.CategoryInvalid, "create with "+field)
		if err != nil && !strings.Contains(err.Error(), field) {
			t.Errorf("create: error %q does not name %s", err, field)
		}
		_, err = e.c.Update(ctx, "live", client.SandboxUpdate{Network: p})
		wantCategory(t, err, client.CategoryInvalid, "update with "+field)
		if err != nil && !strings.Contains(err.Error(), field) {
			t.Errorf("update: error %q does not name %s", err, field)
		}
	}
	if _, _, code := e.cli(nil, "sandbox", "create", "--image", imageName, "--network", "closed"); code == 0 {
		t.Errorf("CLI accepted --network closed")
	}
	e.expectNoResources("bad", "after refused creates")
	for _, r := range e.resourcesOf("live") {
		if r.kind == "veth" || r.kind == "nft" {
			t.Errorf("refused updates left %v", r)
		}
	}
}

// TestNetworkGroupMembersOnly: sandboxes of one group reach each other
// (a member in mode none too, which reaches nothing else); a sandbox
// outside the group reaches no member; an update keeps the group and
// cannot change it; deleting the members leaves no group state.
func TestNetworkGroupMembersOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	th := testutil.NewTestHost(t)
	thPort := httpHost(t, th.NS, th.Addr.String()+":0", "th")
	// A member in mode none, through the CLI.
	if out, errOut, code := e.cli(nil, "sandbox", "create", "--image", imageName, "--id", "m1", "--network-group", "team"); code != 0 {
		t.Fatalf("create m1: %s %s", out, errOut)
	}
	e.create(&warrenv1.CreateRequest{Id: "m2", Network: &warrenv1.NetworkPolicy{Mode: "open", Group: "team"}})
	e.create(&warrenv1.CreateRequest{Id: "out", Network: policy("open")})
	m2 := e.sb("m2")
	if m2.GetNetwork().GetGroup() != "team" {
		t.Fatalf("m2's network: %v", m2.GetNetwork())
	}
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "m2",
		Shell: "mkdir -p /www && echo m2 > /www/index.html && exec httpd -f -p 8080 -h /www"}); err != nil {
		t.Fatal(err)
	}
	waitSh(t, e, "m2", "netstat -ltn | grep -q :8080", 10*time.Second, "m2's server")
	if body, ok := e.fetch("m1", m2.NetworkAddress, 8080); !ok || body != "m2\n" {
		t.Errorf("member m1 does not reach member m2: %q", body)
	}
	if _, ok := e.fetch("out", m2.NetworkAddress, 8080); ok {
		t.Errorf("a sandbox outside the group reaches a member")
	}
	if _, ok := e.fetch("m1", th.Addr.String(), thPort); ok {
		t.Errorf("a member in mode none reaches the test host")
	}
	if _, ok := e.fetch("m2", th.Addr.String(), thPort); !ok {
		t.Errorf("a member in mode open does not reach the test host")
	}
	// An update without a group keeps it; another group is refused.
	sb, err := e.c.Update(ctx, "m2", client.SandboxUpdate{Network: policy("allowlist", rule(th.Addr.String(), 0, ""))})
	if err != nil || sb.GetNetwork().GetGroup() != "team" {
		t.Fatalf("update keeping the group: %v %v", sb.GetNetwork(), err)
	}
	if body, ok := e.fetch("m1", m2.NetworkAddress, 8080); !ok || body != "m2\n" {
		t.Errorf("after m2's update, m1 does not reach it: %q", body)
	}
	_, err = e.c.Update(ctx, "m2", client.SandboxUpdate{Network: &warrenv1.NetworkPolicy{Mode: "open", Group: "other"}})
	wantCategory(t, err, client.CategoryInvalid, "update to another group")
	out, _, _ := e.cli(nil, "sandbox", "get", "m1")
	if !strings.Contains(out, "none, group team") {
		t.Errorf("sandbox get m1:\n%s", out)
	}
}

// TestNetworkRefusalsAreEvents: a packet the network policy refuses (a
// port of an allowed host that the allowlist does not name, the node
// itself) is a policy_drop event of the sandbox that sent it, naming the
// destination; a neighbour's allowed traffic makes none.
func TestNetworkRefusalsAreEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	if strings.Contains(e.logTail(200), "no policy_drop events") {
		t.Skipf("the daemon cannot read its refused packets here:\n%s", e.logTail(20))
	}
	th := testutil.NewTestHost(t)
	p1 := httpHost(t, th.NS, th.Addr.String()+":0", "p1")
	p2 := httpHost(t, th.NS, th.Addr.String()+":0", "p2")
	allow := policy("allowlist", rule(th.Addr.String()+"/32", p1, "tcp"))
	e.create(&warrenv1.CreateRequest{Id: "prober", Network: allow})
	e.create(&warrenv1.CreateRequest{Id: "polite", Network: allow})
	if _, ok := e.fetch("polite", th.Addr.String(), p1); !ok {
		t.Fatal("the allowed port is unreachable")
	}
	if _, ok := e.fetch("prober", th.Addr.String(), p2); ok {
		t.Fatal("a port the allowlist does not name is reachable")
	}
	ev := e.waitEvent("prober", "policy_drop", 5*time.Second)
	if want := fmt.Sprintf("tcp to %s port %d refused", th.Addr, p2); !strings.Contains(ev.Detail, want) {
		t.Errorf("policy_drop event %q does not say %q", ev.Detail, want)
	}
	if evs, err := e.c.SandboxEvents(ctxFor(t, 10*time.Second), "polite"); err != nil || len(evs) != 0 {
		t.Errorf("the polite sandbox's events: %v %v", evs, err)
	}
}

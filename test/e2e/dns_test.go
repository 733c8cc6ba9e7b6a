package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// DNS tests: the upstream is a miekg/dns server on a test host (a network
// namespace the test makes), given to the daemon with --dns-upstream;
// the names it serves are under warren.test, which resolves nowhere else.

// testDNS is an upstream nameserver whose records the test changes.
type testDNS struct {
	addr string // ip:53
	mu   sync.Mutex
	a    map[string][]netip.Addr // fqdn -> A records, TTL 1
}

func (d *testDNS) set(name string, addrs ...netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[dns.Fqdn(name)] = addrs
}

func newTestDNS(t *testing.T, ns netns.NsHandle, ip netip.Addr) *testDNS {
	t.Helper()
	d := &testDNS{addr: netip.AddrPortFrom(ip, 53).String(), a: map[string][]netip.Addr{}}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		qn := q.Question[0]
		d.mu.Lock()
		addrs, ok := d.a[strings.ToLower(qn.Name)]
		d.mu.Unlock()
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		if qn.Qtype == dns.TypeA {
			for _, a := range addrs {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qn.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: a.AsSlice()})
			}
		}
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			size := dns.MinMsgSize
			if o := q.IsEdns0(); o != nil {
				size = int(o.UDPSize())
			}
			m.Truncate(size)
		}
		_ = w.WriteMsg(m)
	})
	var pc net.PacketConn
	testutil.InNetns(t, ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", d.addr)
		return err
	})
	ln := testutil.Listen(t, ns, d.addr)
	us, ts := &dns.Server{PacketConn: pc, Handler: h}, &dns.Server{Listener: ln, Handler: h}
	go func() { _ = us.ActivateAndServe() }()
	go func() { _ = ts.ActivateAndServe() }()
	t.Cleanup(func() { _ = us.Shutdown(); _ = ts.Shutdown() })
	return d
}

func hostRule(host string, port int, proto string) *warrenv1.NetworkRule {
	r := rule("", port, proto)
	r.Host = host
	return r
}

var nsAddrRE = regexp.MustCompile(`(?m)^Address:\s*([0-9.]+)\s*$`)

// lookup resolves name in sandbox id with busybox nslookup (its own DNS
// client, through /etc/resolv.conf): the IPv4 addresses, and whether it
// succeeded.
func (e *env) lookup(id, name string) ([]string, bool) {
	e.t.Helper()
	res := e.sh(id, "nslookup -type=a "+name)
	var out []string
	for _, m := range nsAddrRE.FindAllStringSubmatch(string(res.Stdout), -1) {
		out = append(out, m[1])
	}
	return out, res.ExitCode == 0 && len(out) > 0
}

// TestDNSAllowlistFollowsNames: an allowlisted sandbox resolves a name
// its rules allow through Warren's resolver and reaches the address it
// was answered, and nothing else; a name not on the list is REFUSED
// (a dns_refused event) and its address unreachable; when the upstream
// moves the name, the next resolution allows the new address; a phase
// without the name removes what it allowed and refuses the name; a
// restarted daemon's resolver answers the adopted sandbox; the
// sandbox's DNS reaches nothing else of the node (the resolver's own
// port at the gateway is refused).
func TestDNSAllowlistFollowsNames(t *testing.T) {
	t.Parallel()
	th1, th2 := testutil.NewTestHost(t), testutil.NewTestHost(t)
	p1 := httpHost(t, th1.NS, th1.Addr.String()+":0", "one")
	p2 := httpHost(t, th2.NS, th2.Addr.String()+":0", "two")
	up := newTestDNS(t, th1.NS, th1.Addr)
	up.set("svc.warren.test", th1.Addr)
	up.set("other.warren.test", th2.Addr)
	e := newEnv(t, envOptions{serveArgs: []string{"--dns-upstream", up.addr}})
	ctx := ctxFor(t, 3*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "al", Network: policy("allowlist", hostRule("svc.warren.test", 0, "tcp"))})
	gw := e.gateway("al")
	if conf := e.shOK("al", "cat /etc/resolv.conf"); !strings.Contains(conf, "nameserver "+gw+"\n") {
		t.Errorf("allowlist sandbox's resolv.conf does not name its gateway %s:\n%s", gw, conf)
	}
	if _, ok := e.fetch("al", th1.Addr.String(), p1); ok {
		t.Fatal("a name rule's address is reachable before the sandbox resolved the name")
	}
	addrs, ok := e.lookup("al", "svc.warren.test")
	if !ok || len(addrs) != 1 || addrs[0] != th1.Addr.String() {
		t.Fatalf("svc.warren.test resolved to %v (ok %v), want [%s]", addrs, ok, th1.Addr)
	}
	if body, ok := e.fetch("al", th1.Addr.String(), p1); !ok || body != "hello one\n" {
		t.Fatalf("the resolved address is unreachable: %q", body)
	}
	// A name off the list: refused, an event, its address unreachable.
	if addrs, ok := e.lookup("al", "other.warren.test"); ok {
		t.Errorf("other.warren.test resolved to %v in an allowlist without it", addrs)
	}
	ev := e.waitEvent("al", "dns_refused", 5*time.Second)
	if !strings.Contains(ev.Detail, "other.warren.test") {
		t.Errorf("dns_refused event %q does not name the name", ev.Detail)
	}
	if _, ok := e.fetch("al", th2.Addr.String(), p2); ok {
		t.Error("a name off the list: its address is reachable")
	}
	// The upstream moves the name (TTL 1): the next answer is the new
	// address, which is then reachable.
	up.set("svc.warren.test", th2.Addr)
	if addrs, ok := e.lookup("al", "svc.warren.test"); !ok || len(addrs) != 1 || addrs[0] != th2.Addr.String() {
		t.Fatalf("after the move svc.warren.test resolved to %v, want [%s]", addrs, th2.Addr)
	}
	if body, ok := e.fetch("al", th2.Addr.String(), p2); !ok || body != "hello two\n" {
		t.Errorf("the name's new address is unreachable: %q", body)
	}
	// DNS is no way into the node: the resolver's own port at the
	// gateway, and another port, are refused.
	port := e.resolverPort()
	for _, p := range []string{port, "22", "7070"} {
		if res := e.sh("al", "nc -w 2 "+gw+" "+p+" </dev/null"); res.ExitCode == 0 {
			t.Errorf("the sandbox connects to its gateway's port %s", p)
		}
	}
	if res := e.sh("al", "nc -w 2 "+gw+" 53 </dev/null"); res.ExitCode != 0 {
		t.Errorf("TCP to the gateway's port 53 (the resolver) refused: %s", res.Stderr)
	}
	// A restarted daemon adopts the sandbox, and its resolver (a new
	// port) answers it.
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if addrs, ok := e.lookup("al", "svc.warren.test"); !ok || len(addrs) != 1 {
		t.Errorf("after a daemon restart svc.warren.test resolved to %v", addrs)
	}
	// A phase without the name: refused, its addresses no longer
	// allowed, established or not.
	if _, err := e.c.Update(ctx, "al", client.SandboxUpdate{Network: policy("allowlist", rule("192.0.2.1", 0, ""))}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.fetch("al", th2.Addr.String(), p2); ok {
		t.Error("after a phase without the name its address is reachable")
	}
	if addrs, ok := e.lookup("al", "svc.warren.test"); ok {
		t.Errorf("after a phase without the name it resolves to %v", addrs)
	}
	if err := e.c.Delete(ctx, "al"); err != nil {
		t.Fatal(err)
	}
	if _, ids, err := e.net.Leftovers(); err != nil || len(ids) != 0 {
		t.Errorf("nftables state left after delete: %v %v", ids, err)
	}
}

// TestDNSModesAndGroups: an open sandbox resolves any name (AAAA empty
// at once); a mode-none sandbox has no nameserver; --keep-etc keeps the
// image's (here: none); group members resolve each other's hostnames
// and ids to their group addresses, and a sandbox outside the group
// cannot.
func TestDNSModesAndGroups(t *testing.T) {
	t.Parallel()
	th := testutil.NewTestHost(t)
	up := newTestDNS(t, th.NS, th.Addr)
	up.set("any.warren.test", netip.MustParseAddr("192.0.2.7"))
	e := newEnv(t, envOptions{serveArgs: []string{"--dns-upstream", up.addr}})
	e.create(&warrenv1.CreateRequest{Id: "op", Network: policy("open")})
	e.create(&warrenv1.CreateRequest{Id: "no"})
	e.create(&warrenv1.CreateRequest{Id: "ke", Network: policy("open"), KeepEtc: true})
	if addrs, ok := e.lookup("op", "any.warren.test"); !ok || len(addrs) != 1 || addrs[0] != "192.0.2.7" {
		t.Errorf("open sandbox: any.warren.test resolved to %v", addrs)
	}
	start := time.Now()
	res := e.sh("op", "nslookup -type=aaaa any.warren.test")
	if strings.Contains(string(res.Stdout), "Address:") && strings.Count(string(res.Stdout), "Address:") > 1 || time.Since(start) > time.Second {
		t.Errorf("AAAA: %q after %v, want no address at once", res.Stdout, time.Since(start))
	}
	if conf := e.shOK("no", "cat /etc/resolv.conf"); strings.Contains(conf, "nameserver") {
		t.Errorf("mode none's resolv.conf names a nameserver:\n%s", conf)
	}
	if res := e.sh("ke", "cat /etc/resolv.conf"); res.ExitCode == 0 {
		t.Errorf("--keep-etc: the image has no resolv.conf, the sandbox has %q", res.Stdout)
	}
	e.create(&warrenv1.CreateRequest{Id: "m1", Hostname: "db", Network: &warrenv1.NetworkPolicy{Mode: "none", Group: "g"}})
	e.create(&warrenv1.CreateRequest{Id: "m2", Network: &warrenv1.NetworkPolicy{Mode: "allowlist", Group: "g"}})
	e.create(&warrenv1.CreateRequest{Id: "outsider", Network: policy("open")})
	m1 := e.sb("m1").NetworkAddress
	for _, name := range []string{"db", "m1"} {
		if addrs, ok := e.lookup("m2", name); !ok || len(addrs) != 1 || addrs[0] != m1 {
			t.Errorf("member m2 resolves %s to %v, want [%s]", name, addrs, m1)
		}
	}
	if addrs, ok := e.lookup("m1", "m2"); !ok || len(addrs) != 1 || addrs[0] != e.sb("m2").NetworkAddress {
		t.Errorf("member m1 (mode none) resolves m2 to %v", addrs)
	}
	if conf := e.shOK("m1", "cat /etc/resolv.conf"); !strings.Contains(conf, "nameserver") {
		t.Errorf("a group member in mode none has no nameserver:\n%s", conf)
	}
	for _, name := range []string{"db", "m1"} {
		if addrs, ok := e.lookup("outsider", name); ok {
			t.Errorf("a sandbox outside the group resolves %s to %v", name, addrs)
		}
	}
	if addrs, ok := e.lookup("m1", "any.warren.test"); ok {
		t.Errorf("a group member in mode none resolves an outside name: %v", addrs)
	}
}

// TestDNSResolvConfFollowsUpdates: a sandbox created in mode none has a
// resolv.conf without a nameserver; an update that gives it a network
// makes it name its gateway (Warren's resolver, which then answers it),
// and one back to none takes the nameserver away again, across a daemon
// restart in between (the record keeps what Warren wrote), also in a
// user namespace (the file stays root's inside). Commits leave the file
// Warren wrote out whichever it is. A sandbox that edited its
// resolv.conf, or made it a symlink, keeps what it made; keep_etc keeps
// the image's (none here).
func TestDNSResolvConfFollowsUpdates(t *testing.T) {
	t.Parallel()
	th := testutil.NewTestHost(t)
	up := newTestDNS(t, th.NS, th.Addr)
	up.set("any.warren.test", netip.MustParseAddr("192.0.2.9"))
	e := newEnv(t, envOptions{serveArgs: []string{"--dns-upstream", up.addr}})
	ctx := ctxFor(t, 3*time.Minute)
	yes := true
	e.create(&warrenv1.CreateRequest{Id: "fl"})
	e.create(&warrenv1.CreateRequest{Id: "mapped", UserNamespace: &yes})
	e.create(&warrenv1.CreateRequest{Id: "edited"})
	e.create(&warrenv1.CreateRequest{Id: "linked"})
	e.create(&warrenv1.CreateRequest{Id: "kept", KeepEtc: true})
	for _, id := range []string{"fl", "mapped"} {
		if conf := e.shOK(id, "cat /etc/resolv.conf"); strings.Contains(conf, "nameserver") {
			t.Fatalf("%s in mode none: resolv.conf names a nameserver:\n%s", id, conf)
		}
	}
	e.shOK("edited", "echo 'nameserver 192.0.2.53' >> /etc/resolv.conf")
	edited := e.shOK("edited", "cat /etc/resolv.conf")
	// A symlink to a copy of Warren's file: the link is the sandbox's
	// own, and what it leads to is never written.
	e.shOK("linked", "cp /etc/resolv.conf /tmp/r && ln -sf /tmp/r /etc/resolv.conf")
	linked := e.shOK("linked", "cat /tmp/r")
	setNet := func(mode string) {
		t.Helper()
		for _, id := range []string{"fl", "mapped", "edited", "linked", "kept"} {
			if _, err := e.c.Update(ctx, id, client.SandboxUpdate{Network: policy(mode)}); err != nil {
				t.Fatalf("update %s to %s: %v", id, mode, err)
			}
		}
	}
	// others checks that the sandboxes with files of their own kept them.
	others := func(when string) {
		t.Helper()
		if got := e.shOK("edited", "cat /etc/resolv.conf"); got != edited {
			t.Errorf("%s: the sandbox's edited resolv.conf became %q", when, got)
		}
		if got := e.shOK("linked", "readlink /etc/resolv.conf; cat /tmp/r"); got != "/tmp/r\n"+linked {
			t.Errorf("%s: the symlinked resolv.conf became %q", when, got)
		}
		if res := e.sh("kept", "cat /etc/resolv.conf"); res.ExitCode == 0 {
			t.Errorf("%s: keep_etc sandbox has a resolv.conf %q", when, res.Stdout)
		}
	}
	// noResolv commits id and checks that the layer has no resolv.conf.
	noResolv := func(id, layer string) {
		t.Helper()
		if _, err := e.c.CommitSandbox(ctx, id, layer); err != nil {
			t.Fatal(err)
		}
		c := e.create(&warrenv1.CreateRequest{Layers: []string{layer}, KeepEtc: true})
		if res := e.sh(c.Id, "cat /etc/resolv.conf"); res.ExitCode == 0 {
			t.Errorf("the commit of %s carries Warren's resolv.conf: %q", id, res.Stdout)
		}
	}

	// Created with a network, its file names the gateway from the start.
	e.create(&warrenv1.CreateRequest{Id: "born-open", Network: policy("open")})
	noResolv("born-open", "born-open")

	setNet("open")
	for _, id := range []string{"fl", "mapped"} {
		gw := e.gateway(id)
		if conf := e.shOK(id, "cat /etc/resolv.conf"); gw == "" || !strings.Contains(conf, "\nnameserver "+gw+"\n") {
			t.Errorf("%s after an update to open: resolv.conf does not name its gateway %q:\n%s", id, gw, conf)
		}
		if addrs, ok := e.lookup(id, "any.warren.test"); !ok || len(addrs) != 1 || addrs[0] != "192.0.2.9" {
			t.Errorf("%s after an update to open: any.warren.test resolved to %v", id, addrs)
		}
	}
	if got := e.shOK("mapped", "stat -c %u:%g:%a /etc/resolv.conf"); got != "0:0:644\n" {
		t.Errorf("in a user namespace the rewritten resolv.conf is %q, want root's 0644", got)
	}
	others("after an update to open")
	noResolv("fl", "fl-open")

	// The record keeps what Warren wrote: a restarted daemon still
	// recognises the file as its own.
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	setNet("none")
	for _, id := range []string{"fl", "mapped"} {
		if conf := e.shOK(id, "cat /etc/resolv.conf"); strings.Contains(conf, "nameserver") {
			t.Errorf("%s back in mode none after a daemon restart: resolv.conf names a nameserver:\n%s", id, conf)
		}
	}
	others("back in mode none")
	noResolv("fl", "fl-none")
	if got := e.shOK("fl", "ls -a /etc | grep -c warren || true"); got != "0\n" {
		t.Errorf("temporary files left in /etc: %s", e.shOK("fl", "ls -a /etc"))
	}
}

// hostPython is the Debian python3 of the host (not a pyenv shim):
// its standard library is where its binary says, under /usr.
const hostPython = "/usr/bin/python3"

var lddPathRE = regexp.MustCompile(`(?m)(?:=>\s*|^\s*)(/\S+)`)

// copyHostBinary copies the host's program bin and the shared libraries
// ldd lists for it (the loader included) into root at the same paths.
func copyHostBinary(t *testing.T, root, bin string) {
	t.Helper()
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bin, err)
	}
	files := []string{bin}
	for _, m := range lddPathRE.FindAllStringSubmatch(string(out), -1) {
		files = append(files, m[1])
	}
	for _, f := range files {
		copyHostFile(t, root, f)
	}
}

// copyHostFile copies the host's file f (its content, symlinks followed)
// to the same path under root.
func copyHostFile(t *testing.T, root, f string) {
	t.Helper()
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(root, f)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, st.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

// importHostResolvers imports, as image name, the busybox root plus the
// host's glibc getent and, where the host has Debian's python3, that
// python3 with the standard-library modules its socket code loads (28
// small files, not the 54 MB library): glibc's getaddrinfo and Python's
// socket module resolve the way they do on a real distribution, from a
// tree made in a second on any machine. glibc 2.34 and later build
// nss_files and nss_dns into libc; older ones need their NSS modules and
// libresolv, copied where present. nsswitch.conf says "files dns" as
// Debian's does (the host's names modules such as systemd that the image
// lacks). It reports whether python3 is in the image.
func importHostResolvers(t *testing.T, e *env, name string) (python bool) {
	t.Helper()
	getent, err := exec.LookPath("getent")
	if err != nil {
		t.Fatalf("no getent on the host (Debian's libc-bin): %v", err)
	}
	_, err = os.Stat(hostPython)
	python = err == nil
	var modules []string
	if python {
		// What the test's script loads: getaddrinfo encodes the name
		// with the idna codec (encodings.idna, stringprep).
		out, err := exec.Command(hostPython, "-c", `import socket, time, sys, sysconfig
socket.getaddrinfo("localhost", 1, type=socket.SOCK_STREAM)
print(sysconfig.get_path("stdlib"))
for m in list(sys.modules.values()):
    if getattr(m, "__file__", None): print(m.__file__)`).Output()
		if err != nil {
			t.Fatalf("%s: %v", hostPython, err)
		}
		modules = strings.Fields(string(out))
	}
	importVariant(t, e, name, func(root string) {
		copyHostBinary(t, root, getent)
		libc, _ := filepath.Glob("/lib/*/libc.so.6")
		for _, dir := range libc {
			for _, lib := range []string{"libnss_files.so.2", "libnss_dns.so.2", "libresolv.so.2"} {
				if _, err := os.Stat(filepath.Join(filepath.Dir(dir), lib)); err == nil {
					copyHostFile(t, root, filepath.Join(filepath.Dir(dir), lib))
				}
			}
		}
		if err := os.WriteFile(filepath.Join(root, "etc/nsswitch.conf"), []byte("hosts: files dns\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if !python {
			return
		}
		copyHostBinary(t, root, hostPython)
		stdlib := modules[0]
		// Present, if empty: without it python3 warns that it cannot find
		// its platform-dependent libraries.
		if err := os.MkdirAll(filepath.Join(root, stdlib, "lib-dynload"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range modules[1:] {
			if strings.HasPrefix(f, stdlib+"/") {
				copyHostFile(t, root, f)
			}
		}
	})
	return python
}

// TestDNSGlibcAndPython: glibc's resolver (getent, getaddrinfo through
// nss_dns) and Python's socket module resolve an allowed name through
// Warren's resolver (AAAA answered empty, so getaddrinfo's A+AAAA pair
// returns at once) and Python connects to the address it got; a name off
// the allowlist does not resolve; an answer too big for UDP comes over
// TCP. The binaries are the host's (importHostResolvers), so the test
// runs on any machine.
func TestDNSGlibcAndPython(t *testing.T) {
	t.Parallel()
	th := testutil.NewTestHost(t)
	p := httpHost(t, th.NS, th.Addr.String()+":0", "py")
	up := newTestDNS(t, th.NS, th.Addr)
	up.set("py.warren.test", th.Addr)
	// Too many records for a UDP answer: TC, then TCP, both to the
	// upstream and from the sandbox.
	var big []netip.Addr
	for i := range 100 {
		big = append(big, netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}))
	}
	up.set("big.warren.test", big...)
	e := newEnv(t, envOptions{serveArgs: []string{"--dns-upstream", up.addr}})
	python := importHostResolvers(t, e, "glibc")
	e.create(&warrenv1.CreateRequest{Id: "py", Image: "glibc", Network: policy("allowlist", hostRule("py.warren.test", p, "tcp"), hostRule("*.warren.test", 443, "tcp"))})
	out := e.shOK("py", "/usr/bin/getent ahostsv4 py.warren.test | head -1")
	if !strings.HasPrefix(out, th.Addr.String()) {
		t.Errorf("getent ahostsv4: %q, want %s", out, th.Addr)
	}
	// ahosts asks A and AAAA (getaddrinfo with AF_UNSPEC): the empty AAAA
	// answer must not hold it up.
	start := time.Now()
	res := e.sh("py", "/usr/bin/getent ahosts py.warren.test")
	took := time.Since(start)
	if res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), th.Addr.String()) || strings.Contains(string(res.Stdout), ":") || took > time.Second {
		t.Errorf("getent ahosts: exit %d, %q %q after %v, want %s alone at once", res.ExitCode, res.Stdout, res.Stderr, took, th.Addr)
	}
	if res := e.sh("py", "/usr/bin/getent hosts not-allowed.example"); res.ExitCode == 0 {
		t.Errorf("getent resolved a name off the allowlist: %q", res.Stdout)
	}
	if n := strings.TrimSpace(e.shOK("py", "/usr/bin/getent ahostsv4 big.warren.test | awk '{print $1}' | sort -u | wc -l")); n != "100" {
		t.Errorf("a 100-record answer (TCP) gave %s addresses", n)
	}
	if got, err := e.net.ResolvedAddrs("py", "*.warren.test"); err != nil || len(got) != 101 {
		t.Errorf("the wildcard rule allows %d addresses (%v), want 100 of big and py's", len(got), err)
	}
	if !python {
		t.Logf("no %s on the host: Python's socket module not checked", hostPython)
		return
	}
	script := fmt.Sprintf(`import socket, time
t = time.monotonic()
infos = socket.getaddrinfo("py.warren.test", %d, type=socket.SOCK_STREAM)
took = time.monotonic() - t
s = socket.create_connection(("py.warren.test", %d), timeout=3)
s.sendall(b"GET / HTTP/1.0\r\n\r\n")
print(sorted({i[4][0] for i in infos}), round(took, 3), s.recv(4096).split(b"\r\n\r\n", 1)[1].decode().strip())
`, p, p)
	res = e.sh("py", "/usr/bin/python3 -c '"+script+"'")
	want := fmt.Sprintf("['%s']", th.Addr)
	if res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), want) || !strings.HasSuffix(strings.TrimSpace(string(res.Stdout)), "hello py") || len(res.Stderr) > 0 {
		t.Errorf("python: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// getaddrinfo asks A and AAAA: the empty AAAA must not hold it up.
	if f := strings.Fields(string(res.Stdout)); len(f) >= 2 {
		if took, err := strconv.ParseFloat(f[1], 64); err != nil || took > 1 {
			t.Errorf("python's getaddrinfo took %s s", f[1])
		}
	}
}

var resolverPortRE = regexp.MustCompile(`resolver for sandboxes started.*port=(\d+)`)

// resolverPort is the port the daemon's resolver listens on, from its
// log (the latest start).
func (e *env) resolverPort() string {
	e.t.Helper()
	m := resolverPortRE.FindAllStringSubmatch(e.logTail(10000), -1)
	if len(m) == 0 {
		e.t.Fatalf("no resolver in the daemon's log:\n%s", e.logTail(30))
	}
	return m[len(m)-1][1]
}

package fullvm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestFullVMNetworkAllowlistUpdateAndAgentRestart: a full VM with an
// allowlist policy gets a virtio-net device on a tap of the node, which
// the guest's agent configures after the boot (the interface of the MAC
// address the host gave it, eth0) with the sandbox's address, a
// default route through its gateway and a resolv.conf naming the
// gateway's resolver. It reaches the allowed test host and not the
// other; Update moves it to the other; the agent's restart by systemd
// and a daemon's adoption leave the guest's network as it was (the guest
// kernel holds it, nothing resets it); Destroy leaves no tap and no rule.
func TestFullVMNetworkAllowlistUpdateAndAgentRestart(t *testing.T) {
	img := testImage(t)
	o := testNetwork(t)
	n, err := netpolicy.New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	opts := Options{StateDir: t.TempDir(), CgroupParent: testCgroupParent, ImageDir: img, Network: n}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	a, other := testutil.NewTestHost(t), testutil.NewTestHost(t)
	pa := testutil.EchoServer(t, a.NS, a.Addr.String()+":0")
	po := testutil.EchoServer(t, other.NS, other.Addr.String()+":0")
	base := conformance.NetworkResources(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	only := func(h netip.Addr) netpolicy.Policy {
		return netpolicy.Policy{Mode: netpolicy.Allowlist, Allow: []netpolicy.Rule{{Prefix: netip.PrefixFrom(h, 32)}}}
	}
	t0 := time.Now()
	// Warren's /etc files, as the daemon gives them (not with keep_etc).
	sb, err := b.Create(ctx, backend.Spec{ID: "fvnet", Layers: testLayers, Network: only(a.Addr), Etc: etcfiles.Files("fvnet", etcfiles.None)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	t.Logf("create: %v", time.Since(t0))
	sh := func(sb backend.Sandbox, cmd string) string {
		t.Helper()
		return conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", cmd}}, "").Stdout
	}
	// nc echoes the server's answer; a refused connect gets none (the
	// rules drop it) within its timeout.
	reaches := func(sb backend.Sandbox, when string, wantA, wantOther bool) {
		t.Helper()
		for _, h := range []struct {
			addr netip.Addr
			port int
			want bool
		}{{a.Addr, pa, wantA}, {other.Addr, po, wantOther}} {
			got := sh(sb, fmt.Sprintf("echo ping | nc -w 5 %s %d; true", h.addr, h.port)) == "ping\n"
			if got != h.want {
				t.Errorf("%s: %s reachable %v, want %v", when, h.addr, got, h.want)
			}
		}
	}
	addr, gw := sb.(backend.Networked).NetworkAddress(), sb.(backend.Resolved).Nameserver()
	if !gw.IsValid() || addr == "" {
		t.Fatalf("address %q, nameserver %v", addr, gw)
	}
	// The guest's interface: its name, address, hardware address; its
	// default route; its resolver.
	const look = `set -- $(ip -4 -o addr show scope global); echo $2 $4; cat /sys/class/net/$2/address
ip -4 route show default | cut -d' ' -f1-5; grep ^nameserver /etc/resolv.conf`
	network := func(sb backend.Sandbox) string {
		t.Helper()
		return sh(sb, look)
	}
	got := network(sb)
	l := strings.Split(strings.TrimSpace(got), "\n")
	mac := guestMAC(netip.MustParseAddr(addr))
	if len(l) != 4 || !strings.HasSuffix(l[0], " "+addr+"/31") || l[1] != mac ||
		l[2] != "default via "+gw.String()+" dev "+strings.Fields(l[0])[0] || l[3] != "nameserver "+gw.String() {
		t.Fatalf("the guest's network:\n%s\nwant %s/31 on the interface of MAC %s, the default route through %s, nameserver %s", got, addr, mac, gw, gw)
	}
	// The kernel's name, as in a microVM (the image boots with
	// net.ifnames=0: no rename by udev racing the agent).
	if !strings.HasPrefix(l[0], "eth0 ") {
		t.Errorf("the guest's interface is not eth0: %s", l[0])
	}
	t.Logf("the guest's interface: %s", l[0])
	reaches(sb, "at create", true, false)

	up := sb.(backend.Updater)
	p := only(other.Addr)
	if err := up.Update(ctx, backend.Update{Network: &p}); err != nil {
		t.Fatal(err)
	}
	reaches(sb, "after the update", false, true)

	sb2 := restartAgent(t, ctx, sb, opts)
	if now := network(sb2); now != got {
		t.Errorf("the guest's network after the agent's restart and an adoption:\n%s\nwas\n%s", now, got)
	}
	reaches(sb2, "after the agent's restart and an adoption", false, true)
	if err := sb2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if got := conformance.NetworkResources(t, o); !slices.Equal(got, base) {
		t.Errorf("after Destroy: %v, want %v", got, base)
	}
}

// restartAgent has systemd restart the guest's agent (from a timer's
// unit: the restart ends the agent's unit's processes, this command's
// caller among them), waits until the same handle reaches the next agent
// (microvm/liveness.go), and returns the sandbox as a daemon adopting the
// VM then has it. Each call is given up after 30 s.
func restartAgent(t *testing.T, ctx context.Context, sb backend.Sandbox, opts Options) backend.Sandbox {
	t.Helper()
	agentPid := func() (string, error) {
		c := make(chan string, 1)
		go func() {
			r, err := conformance.TryExec(sb, backend.ProcSpec{Argv: []string{"pgrep", "-x", "warren-guest"}}, "")
			if err != nil || r.Status.Code != 0 {
				c <- ""
				return
			}
			c <- strings.TrimSpace(r.Stdout)
		}()
		select {
		case pid := <-c:
			return pid, nil
		case <-time.After(30 * time.Second):
			return "", errors.New("no answer in 30 s")
		}
	}
	old, err := agentPid()
	if err != nil || old == "" {
		t.Fatalf("the agent's pid: %q %v", old, err)
	}
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"systemd-run", "--on-active=2", "systemctl", "restart", "warren-guest"}}, ""); r.Status.Code != 0 {
		t.Fatalf("systemd-run: %+v", r)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(3 * time.Second) {
		pid, err := agentPid()
		if err == nil && pid != "" && pid != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no restarted agent answered (old pid %s): %q %v", old, pid, err)
		}
	}
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	sb2, err := b2.Adopt(ctx, sb.ID(), sb.State())
	if err != nil {
		t.Fatal(err)
	}
	return sb2
}

package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/testutil"
)

var subnetSeq atomic.Int32

// testNetwork gives a test its own sandbox networking: a name (nftables
// table, interface prefix) and a subnet no other process takes
// (testutil.Subnet), and removes whatever its sandboxes left when it ends.
func testNetwork(t *testing.T) netpolicy.Options {
	seq := subnetSeq.Add(1)
	return conformance.NodeNetwork(t, fmt.Sprintf("warren-test-microvm-%d-%d", os.Getpid(), seq), testutil.Subnet(t), Name)
}

// TestVMNetworkAllowlistAndLeaks: a VM with an allowlist policy reaches
// an allowed address (a test host on the node) through its virtio-net
// device and tap, and not a denied one, under the rules a container's
// veth gets; its resolver is its gateway. Nothing of its network stays
// after Destroy (TestCheckpointOfAVMWithANetwork: nor after a restore's);
// a VM whose QEMU was killed loses its tap at once (the
// tap is QEMU's), and Destroy then removes its rules.
func TestVMNetworkAllowlistAndLeaks(t *testing.T) {
	cfg := testConfig(t)
	lab := conformance.NewNetLab(t, testNetwork(t))
	n := lab.Node
	b, err := New(Options{StateDir: t.TempDir(), QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent, Network: n})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	layers := []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}}

	// Warren's /etc files, as the daemon gives them (not with keep_etc).
	etc := etcfiles.Files("vmnet-allow", etcfiles.None)
	spec := backend.Spec{ID: "vmnet-allow", Layers: layers, Network: conformance.Only(lab.A.Addr), Etc: etc}
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	vm := sb.(*sandbox).vm
	lab.Reaches(t, sb, "at create", true, false)
	gw, addr := n.Addrs(sb.(*sandbox).att.Index)
	if got := sb.(backend.Networked).NetworkAddress(); got != addr.String() {
		t.Errorf("NetworkAddress %q, want %s", got, addr)
	}
	if got := sb.(backend.Resolved).Nameserver(); got != gw {
		t.Errorf("Nameserver %s, want %s", got, gw)
	}
	if r, err := vm.Exec(ctx, []string{"cat", "/etc/resolv.conf"}, nil); err != nil || !strings.Contains(string(r.Stdout), "nameserver "+gw.String()) {
		t.Errorf("resolv.conf: %q %v, want nameserver %s", r.Stdout, err, gw)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	lab.NoLeaks(t, "after Destroy")

	sb, err = b.Create(ctx, backend.Spec{ID: "vmnet-kill", Layers: layers, Network: netpolicy.Policy{Mode: netpolicy.Open}})
	if err != nil {
		t.Fatal(err)
	}
	// Without Warren's /etc files (keep_etc) the image's resolv.conf
	// stays.
	gw, _ = n.Addrs(sb.(*sandbox).att.Index)
	if r, err := sb.(*sandbox).vm.Exec(ctx, []string{"sh", "-c", "cat /etc/resolv.conf 2>/dev/null; true"}, nil); err != nil || strings.Contains(string(r.Stdout), gw.String()) {
		t.Errorf("resolv.conf with keep_etc: %q %v", r.Stdout, err)
	}
	tap := n.Ifname(sb.(*sandbox).att.Index)
	if _, err := netlink.LinkByName(tap); err != nil {
		t.Fatalf("tap %s: %v", tap, err)
	}
	if err := syscall.Kill(sb.(*sandbox).vm.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Exited().Done():
	case <-ctx.Done():
		t.Fatal("Exited not done after QEMU was killed")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := netlink.LinkByName(tap); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tap %s still there 30 s after its QEMU was killed", tap)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	lab.NoLeaks(t, "after a killed QEMU and Destroy")
}

// TestCheckpointOfAVMWithANetwork: a VM with an allowlist policy
// checkpoints; its restore and a fork each get a tap of their own under
// the same policy, and their guests the address the node gave them (a
// fork's differs from its source's): each reaches the allowed host and
// not the denied one, its eth0 has its NetworkAddress. Their Destroy
// leaves no tap and no rule.
func TestCheckpointOfAVMWithANetwork(t *testing.T) {
	cfg := testConfig(t)
	lab := conformance.NewNetLab(t, testNetwork(t))
	state := t.TempDir()
	b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent, Network: lab.Node})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec := backend.Spec{ID: "vmnet-ckpt", Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}},
		Network: conformance.Only(lab.A.Addr), Etc: etcfiles.Files("vmnet-ckpt", etcfiles.None)}
	src, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Destroy(context.Background())
	lab.Reaches(t, src, "before the checkpoint", true, false)
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := src.(backend.Checkpointer).Checkpoint(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if err := src.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	// The fork first: the restore's /31 is then not its source's either.
	fork, again := restoreAs(ctx, t, b, spec, "vmnet-ckpt-fork", dir), restoreAs(ctx, t, b, spec, "vmnet-ckpt", dir)
	addrs := map[string]bool{}
	for _, sb := range []backend.Sandbox{again, fork} {
		addr := sb.(backend.Networked).NetworkAddress()
		addrs[addr] = true
		if got := sh(t, sb, "ip -4 -o addr show eth0"); !strings.Contains(got, " "+addr+"/31 ") {
			t.Errorf("%s: eth0 %q, want %s/31", sb.ID(), got, addr)
		}
		lab.Reaches(t, sb, "restored", true, false)
	}
	if len(addrs) != 2 {
		t.Errorf("the restore and the fork have one address: %v", addrs)
	}
	for _, sb := range []backend.Sandbox{again, fork} {
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lab.NoLeaks(t, "after Destroy")
	if left := leftovers(state); len(left) > 0 {
		t.Errorf("after Destroy: %v", left)
	}
}

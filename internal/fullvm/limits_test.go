package fullvm

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
)

// TestFullVMLimitsDiskAndNetwork: one full VM with every per-sandbox
// setting the guest applies after its boot (a Debian boot costs a minute
// of TCG, so the settings share one), each checked at create, after an
// Update, after systemd restarts the guest's agent and after a daemon's
// adoption:
//
//   - Disk: with a disk limit the guest's root is an overlay whose upper
//     is the VM's disk of the limit's size (the image's warren-root,
//     before systemd): writing past it fails with ENOSPC in the guest,
//     the sandbox stays usable, the node's disk holds only what was
//     written (DiskUsage).
//   - Cgroup: commands run in a cgroup of the guest with the sandbox's
//     memory and pids limits, beside the agent's own leaf: the agent is
//     outside it and exempt from the OOM killer, the commands are not.
//     Update changes the limits up to the VM's memory less the OS's
//     (Invalid beyond, naming the most).
//   - Network: an allowlist policy gives the VM a virtio-net device on a
//     tap of the node, which the agent configures (the interface of the
//     MAC address the host gave it, eth0) with the sandbox's address, a
//     default route through its gateway and a resolv.conf naming the
//     gateway's resolver. It reaches the allowed test host and not the
//     other; Update moves it to the other.
//   - The agent's restart: a process in flight ends at once with the
//     reason (Unavailable), the same handle reaches the next agent (QEMU's
//     VSERPORT_CHANGE ends the session and the VM connects again:
//     microvm/liveness.go), whose cgroup takes the limits again; the guest
//     kernel holds the network, nothing resets it.
//   - Destroy (of the adopted sandbox) leaves no VM directory, tap or rule.
func TestFullVMLimitsDiskAndNetwork(t *testing.T) {
	img := testImage(t)
	lab := conformance.NewNetLab(t, testNetwork(t))
	state := t.TempDir()
	opts := Options{StateDir: state, CgroupParent: testCgroupParent, ImageDir: img, Network: lab.Node}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	t0 := time.Now()
	// Warren's /etc files, as the daemon gives them (not with keep_etc).
	sb, err := b.Create(ctx, backend.Spec{ID: "fvlim", Layers: testLayers, MemoryBytes: 64 << 20, PidsMax: 100, DiskBytes: 64 << 20,
		Network: conformance.Only(lab.A.Addr), Etc: etcfiles.Files("fvlim", etcfiles.None)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	t.Logf("create: %v", time.Since(t0))
	sh := func(sb backend.Sandbox, script string) conformance.Result {
		t.Helper()
		return conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", script}}, "")
	}

	// The command's cgroup and its limits, the agent's cgroup and both
	// OOM scores.
	const lookCgroup = `cg=$(sed -n 's/^0:://p' /proc/self/cgroup); echo $cg
cat /sys/fs/cgroup$cg/memory.max /sys/fs/cgroup$cg/pids.max /sys/fs/cgroup$cg/memory.swap.max
a=$(pgrep -x warren-guest); sed -n 's/^0:://p' /proc/$a/cgroup; cat /proc/$a/oom_score_adj /proc/self/oom_score_adj`
	cgroup := func(sb backend.Sandbox, mem, pids string) {
		t.Helper()
		r := sh(sb, lookCgroup)
		l := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if r.Status.Code != 0 || len(l) != 7 || !strings.HasSuffix(l[0], "/warren-guest.service/sandbox") ||
			l[1] != mem || l[2] != pids || l[3] != "0" || l[4] != strings.TrimSuffix(l[0], "sandbox")+"agent" ||
			l[5] != "-1000" || l[6] != "0" {
			t.Fatalf("want the command in <unit>/sandbox with memory.max %s, pids.max %s, no swap, and the agent in <unit>/agent at -1000; got %+v", mem, pids, r)
		}
	}
	// The guest's interface: its name, address, hardware address; its
	// default route; its resolver.
	const lookNetwork = `set -- $(ip -4 -o addr show scope global); echo $2 $4; cat /sys/class/net/$2/address
ip -4 route show default | cut -d' ' -f1-5; grep ^nameserver /etc/resolv.conf`
	var network string

	ok := t.Run("Disk", func(t *testing.T) {
		if r := sh(sb, "findmnt -n -o FSTYPE,OPTIONS / && findmnt -n -o SIZE /run/warren-upper"); !strings.HasPrefix(r.Stdout, "overlay ") ||
			!strings.Contains(r.Stdout, "upperdir=/run/warren-upper/upper") {
			t.Fatalf("the root with a disk limit: %+v, want an overlay over the upper disk", r)
		}
		r := sh(sb, "dd if=/dev/zero of=/root/fill bs=1M count=100 2>&1; sync")
		if !strings.Contains(r.Stdout, "No space left") {
			t.Fatalf("100 MiB under a 64 MiB disk limit: %+v", r)
		}
		use, err := sb.(backend.DiskUser).DiskUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if use.Bytes < 48<<20 || use.Bytes > 72<<20 {
			t.Fatalf("DiskUsage after filling a 64 MiB disk: %d bytes", use.Bytes)
		}
		if r := sh(sb, "rm /root/fill && echo ok > /root/after && cat /root/after"); r.Stdout != "ok\n" {
			t.Fatalf("after filling the disk: %+v", r)
		}
	}) && t.Run("Cgroup", func(t *testing.T) {
		cgroup(sb, "67108864", "100")
		up := sb.(backend.Updater)
		i64 := func(v int64) *int64 { return &v }
		err := up.Update(ctx, backend.Update{MemoryBytes: i64(65 << 20)})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "at most 67108864 bytes") {
			t.Fatalf("a memory limit above the VM's 64 MiB for the sandbox: %v, want invalid naming the most", err)
		}
		if err := up.Update(ctx, backend.Update{MemoryBytes: i64(48 << 20), PidsMax: i64(50)}); err != nil {
			t.Fatal(err)
		}
		cgroup(sb, "50331648", "50")
	}) && t.Run("Network", func(t *testing.T) {
		addr, gw := sb.(backend.Networked).NetworkAddress(), sb.(backend.Resolved).Nameserver()
		if !gw.IsValid() || addr == "" {
			t.Fatalf("address %q, nameserver %v", addr, gw)
		}
		network = sh(sb, lookNetwork).Stdout
		l := strings.Split(strings.TrimSpace(network), "\n")
		mac := guestMAC(netip.MustParseAddr(addr))
		if len(l) != 4 || !strings.HasSuffix(l[0], " "+addr+"/31") || l[1] != mac ||
			l[2] != "default via "+gw.String()+" dev "+strings.Fields(l[0])[0] || l[3] != "nameserver "+gw.String() {
			t.Fatalf("the guest's network:\n%s\nwant %s/31 on the interface of MAC %s, the default route through %s, nameserver %s", network, addr, mac, gw, gw)
		}
		// The kernel's name, as in a microVM (the image boots with
		// net.ifnames=0: no rename by udev racing the agent).
		if !strings.HasPrefix(l[0], "eth0 ") {
			t.Errorf("the guest's interface is not eth0: %s", l[0])
		}
		t.Logf("the guest's interface: %s", l[0])
		lab.Reaches(t, sb, "at create", true, false)
		p := conformance.Only(lab.Other.Addr)
		if err := sb.(backend.Updater).Update(ctx, backend.Update{Network: &p}); err != nil {
			t.Fatal(err)
		}
		lab.Reaches(t, sb, "after the update", false, true)
	})
	if !ok {
		return
	}

	var sb2 backend.Sandbox
	if !t.Run("AgentRestart", func(t *testing.T) {
		// A process in flight when the agent goes.
		long, err := sb.Start(ctx, backend.ProcSpec{Argv: []string{"sleep", "600"}})
		if err != nil {
			t.Fatal(err)
		}
		defer long.Close()
		type waitResult struct {
			st  backend.ExitStatus
			err error
		}
		waited := make(chan waitResult, 1)
		go func() { st, err := long.Wait(); waited <- waitResult{st, err} }()
		sb2 = restartAgent(t, ctx, sb, opts)
		select {
		case w := <-waited:
			// systemd's stop signals the whole unit's cgroup at once: the
			// sleep may die first and the agent, not yet ended, report its
			// exit (a status, killed by SIGTERM); otherwise the connection
			// closes with the process in flight (unavailable). Both are
			// true answers; anything else is not.
			switch {
			case w.err == nil && w.st.Signal == syscall.SIGTERM:
				t.Logf("the in-flight process's exit was reported before the agent went: %+v", w.st)
			case errors.Is(w.err, errdefs.ErrUnavailable) && strings.Contains(w.err.Error(), "guest agent exited"):
			default:
				t.Fatalf("a process in flight when the agent went: %+v %v, want unavailable saying the agent exited, or killed by the unit's SIGTERM", w.st, w.err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("a process in flight when the agent went never ended")
		}
		if n := sb.(*sandbox).AgentLosses(); n != 1 {
			t.Errorf("AgentLosses %d, want 1", n)
		}
		// The same handle, then the adopting daemon's.
		for _, s := range []backend.Sandbox{sb, sb2} {
			cgroup(s, "50331648", "50")
			if now := sh(s, lookNetwork).Stdout; now != network {
				t.Errorf("the guest's network after the agent's restart:\n%s\nwas\n%s", now, network)
			}
		}
		lab.Reaches(t, sb2, "after the agent's restart and an adoption", false, true)
		if use, err := sb2.(backend.DiskUser).DiskUsage(ctx); err != nil || use.Bytes == 0 {
			t.Fatalf("DiskUsage after an adoption: %+v %v", use, err)
		}
	}) {
		return
	}

	if err := sb2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(state + "/vms"); len(ents) != 0 {
		t.Errorf("after Destroy the state directory holds %d VM directories", len(ents))
	}
	lab.NoLeaks(t, "after Destroy")
}

// restartAgent has systemd restart the guest's agent (from a timer's
// unit: the restart ends the agent's unit's processes, this command's
// caller among them), waits until the same handle reaches the next agent
// (microvm/liveness.go), and returns the sandbox as a daemon adopting the
// VM then has it. Each call is given up after 30 s: before the events
// monitor a call on an agent that died under it never ended.
func restartAgent(t *testing.T, ctx context.Context, sb backend.Sandbox, opts Options) backend.Sandbox {
	t.Helper()
	agentPid := func(sb backend.Sandbox) (string, error) {
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
	old, err := agentPid(sb)
	if err != nil || old == "" {
		t.Fatalf("the agent's pid: %q %v", old, err)
	}
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"systemd-run", "--on-active=2", "systemctl", "restart", "warren-guest"}}, ""); r.Status.Code != 0 {
		t.Fatalf("systemd-run: %+v", r)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(3 * time.Second) {
		pid, err := agentPid(sb)
		if err == nil && pid != "" && pid != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the same handle never reached the restarted agent (old pid %s): %q %v", old, pid, err)
		}
	}
	// An adopting daemon reaches the new agent through a port of its own.
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(3 * time.Second) {
		b2, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		sb2, err := b2.Adopt(ctx, sb.ID(), sb.State())
		if err != nil {
			t.Fatal(err)
		}
		pid, err := agentPid(sb2)
		if err == nil && pid != "" && pid != old {
			return sb2
		}
		if time.Now().After(deadline) {
			t.Fatalf("no restarted agent (pid %s) answered an adopting daemon: %q %v", old, pid, err)
		}
	}
}

package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestMicroVMHibernateRestoreFork: a microvm sandbox hibernates, restores
// and forks through the same calls as a container: hibernated, its QEMU
// and VM directory are gone (the hibernation reports the memory the VM
// held); a daemon restart finds it HIBERNATED and Resume restores it, its
// background counter counting on from where it was and listed again, its
// files there; two forks run on from its state and diverge from each
// other and from it; delete of a hibernated VM removes its checkpoint,
// and nothing of the VMs is left.
func TestMicroVMHibernateRestoreFork(t *testing.T) {
	needMicroVM(t)
	e := microVMEnv(t)
	ctx := ctxFor(t, 5*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "vmh", Backend: "microvm", Resources: &warrenv1.Resources{MemoryBytes: 128 << 20}})
	e.shOK("vmh", "echo before > /root/f")
	pi, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "vmh", Shell: "i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/count; sleep 0.1; done"})
	if err != nil {
		t.Fatal(err)
	}
	count := func(id string) int {
		t.Helper()
		n, err := strconv.Atoi(strings.TrimSpace(e.shOK(id, "cat /tmp/count 2>/dev/null || echo 0")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	countsPast := func(id string, n int) int {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if c := count(id); c > n {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the counter stays at %d", id, n)
			}
		}
	}
	counting := func(id string) {
		t.Helper()
		countsPast(id, count(id))
		ps, err := e.c.ListProcesses(ctx, id)
		if err != nil || len(ps) != 1 || ps[0].GetProcessId() != pi.GetProcessId() || !ps[0].GetRunning() {
			t.Fatalf("%s: processes %v %v, want the counter running", id, ps, err)
		}
	}
	c0 := countsPast("vmh", 3)

	h, err := e.c.Hibernate(ctx, "vmh")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hibernate: checkpoint %d us, total %d us, %d bytes, VM's memory before %d MiB", h.GetCheckpointUs(), h.GetTotalUs(), h.GetBytes(), h.GetBefore().GetBytes()>>20)
	if h.GetSandbox().GetState() != warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED || h.GetBytes() == 0 || h.GetBefore().GetBytes() == 0 {
		t.Fatalf("hibernated: %v", h)
	}
	vmGone(t, e.vmDir("vmh"))

	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if sb, err := e.c.Get(ctx, "vmh"); err != nil || sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED {
		t.Fatalf("after a daemon restart: %v %v, want hibernated", sb.GetState(), err)
	}
	r, err := e.c.Resume(ctx, "vmh")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore: %d us", r.GetRestoreUs())
	if !r.GetRestored() {
		t.Fatalf("resume of a hibernated VM: %v", r)
	}
	if c := count("vmh"); c < c0 {
		t.Fatalf("the counter restarted: %d after %d", c, c0)
	}
	counting("vmh")
	if f := e.shOK("vmh", "cat /root/f"); f != "before\n" {
		t.Fatalf("the file written before hibernating: %q", f)
	}

	fr, err := e.c.Fork(ctx, &warrenv1.ForkRequest{Id: "vmh", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork: checkpoint %d us, restores %v us, total %d us", fr.GetCheckpointUs(), fr.GetRestoreUs(), fr.GetTotalUs())
	ids := []string{"vmh"}
	for _, f := range fr.GetSandboxes() {
		if f.GetBackend() != "microvm" || f.GetForkedFrom() != "vmh" {
			t.Fatalf("fork: %v", f)
		}
		ids = append(ids, f.GetId())
	}
	if len(ids) != 3 {
		t.Fatalf("forks: %v", fr)
	}
	for _, id := range ids {
		counting(id)
		e.shOK(id, "echo "+id+" > /root/f")
	}
	for _, id := range ids {
		if f := e.shOK(id, "cat /root/f"); f != id+"\n" {
			t.Fatalf("%s: /root/f is %q: the forks share files", id, f)
		}
	}

	// Delete of a hibernated VM removes its checkpoint.
	if _, err := e.c.Hibernate(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(e.stateDir, "checkpoints", ids[1])
	if _, err := os.Stat(filepath.Join(ckpt, "vm.state")); err != nil {
		t.Fatalf("the hibernated fork's checkpoint: %v", err)
	}
	for _, id := range ids {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		vmGone(t, e.vmDir(id))
	}
	e.checkpointsGone(10 * time.Second)
}

// TestMicroVMHibernateWithDiskAndNetwork: through the daemon, a VM with a
// disk limit and a network policy is hibernated, survives a daemon
// restart on disk, and resumes with the file it wrote on its disk and its
// network (the allowed host answers, the other does not); a fork of it
// gets its own copy of the disk and its own address, under the same
// policy; deleting them all leaves no QEMU, VM directory or checkpoint
// (and the harness's baseline: no tap).
func TestMicroVMHibernateWithDiskAndNetwork(t *testing.T) {
	needMicroVM(t)
	e := microVMEnv(t)
	ctx := ctxFor(t, 5*time.Minute)
	th, other := testutil.NewTestHost(t), testutil.NewTestHost(t)
	pAllowed := httpHost(t, th.NS, th.Addr.String()+":0", "vm")
	pOther := httpHost(t, other.NS, other.Addr.String()+":0", "other")
	reaches := func(id string) {
		t.Helper()
		if body, ok := e.fetch(id, th.Addr.String(), pAllowed); !ok || body != "hello vm\n" {
			t.Errorf("%s: the allowed host: %q %v", id, body, ok)
		}
		if _, ok := e.fetch(id, other.Addr.String(), pOther); ok {
			t.Errorf("%s: reached a host not on its allowlist", id)
		}
	}
	e.create(&warrenv1.CreateRequest{Id: "vmdn", Backend: "microvm",
		Resources: &warrenv1.Resources{MemoryBytes: 128 << 20, DiskBytes: 64 << 20},
		Network:   policy("allowlist", rule(th.Addr.String()+"/32", 0, ""))})
	// 8 MiB on the VM's disk: more than its tmpfs would take unnoticed,
	// and a digest to compare after the restore.
	sum := e.shOK("vmdn", "head -c 8388608 /dev/urandom > /root/blob && md5sum < /root/blob && sync")
	if st, err := e.c.SandboxStats(ctx, "vmdn"); err != nil || st.GetDiskBytes() != 64<<20 || st.GetDiskUsedBytes() < 8<<20 {
		t.Fatalf("stats of a VM with a 64 MiB disk holding 8 MiB: disk %d of %d (%v)", st.GetDiskUsedBytes(), st.GetDiskBytes(), err)
	}
	reaches("vmdn")
	if _, err := e.c.Hibernate(ctx, "vmdn"); err != nil {
		t.Fatal(err)
	}
	vmGone(t, e.vmDir("vmdn"))
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if r, err := e.c.Resume(ctx, "vmdn"); err != nil || !r.GetRestored() {
		t.Fatalf("resume of the hibernated VM: %v %v", r, err)
	}
	if got := e.shOK("vmdn", "md5sum < /root/blob"); got != sum {
		t.Fatalf("the file on the VM's disk after the restore: %q, want %q", got, sum)
	}
	if df := e.shOK("vmdn", "df -k /root | tail -1"); !strings.Contains(df, "/") {
		t.Fatalf("df: %q", df)
	}
	reaches("vmdn")

	fr, err := e.c.Fork(ctx, &warrenv1.ForkRequest{Id: "vmdn", Count: 1})
	if err != nil || len(fr.GetSandboxes()) != 1 {
		t.Fatalf("fork: %v %v", fr, err)
	}
	fork := fr.GetSandboxes()[0].GetId()
	reaches(fork)
	e.shOK(fork, "echo fork > /root/blob")
	if got := e.shOK("vmdn", "md5sum < /root/blob"); got != sum {
		t.Fatalf("the source's file after the fork wrote its own: %q: the disks are shared", got)
	}
	srcAddr := e.shOK("vmdn", "ip -4 -o addr show eth0 2>/dev/null || ifconfig eth0")
	forkAddr := e.shOK(fork, "ip -4 -o addr show eth0 2>/dev/null || ifconfig eth0")
	if srcAddr == forkAddr {
		t.Fatalf("the fork has the source's address: %q", forkAddr)
	}
	for _, id := range []string{"vmdn", fork} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		vmGone(t, e.vmDir(id))
	}
	e.checkpointsGone(10 * time.Second)
}

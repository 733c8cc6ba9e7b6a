package fullvm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/errdefs"
)

// TestFullVMCommandsCgroupHoldsTheLimits: a full VM's commands run in a
// cgroup of the guest with the sandbox's memory and pids limits (set
// after the boot), beside the agent's own leaf: the agent is outside it
// and exempt from the OOM killer, the commands are not. Update changes
// the limits up to the VM's memory less the OS's (Invalid beyond, naming
// the most), and the limits hold after the agent's restart by systemd
// and a daemon's adoption.
func TestFullVMCommandsCgroupHoldsTheLimits(t *testing.T) {
	img := testImage(t)
	state := t.TempDir()
	opts := Options{StateDir: state, CgroupParent: testCgroupParent, ImageDir: img}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	sb, err := b.Create(ctx, backend.Spec{ID: "fvcg", Layers: testLayers, MemoryBytes: 64 << 20, PidsMax: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	t.Logf("create: %v", time.Since(t0))

	// The command's cgroup and its limits, the agent's cgroup and both
	// OOM scores.
	const look = `cg=$(sed -n 's/^0:://p' /proc/self/cgroup); echo $cg
cat /sys/fs/cgroup$cg/memory.max /sys/fs/cgroup$cg/pids.max /sys/fs/cgroup$cg/memory.swap.max
a=$(pgrep -x warren-guest); sed -n 's/^0:://p' /proc/$a/cgroup; cat /proc/$a/oom_score_adj /proc/self/oom_score_adj`
	check := func(sb backend.Sandbox, mem, pids string) {
		t.Helper()
		r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", look}}, "")
		l := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if r.Status.Code != 0 || len(l) != 7 || !strings.HasSuffix(l[0], "/warren-guest.service/sandbox") ||
			l[1] != mem || l[2] != pids || l[3] != "0" || l[4] != strings.TrimSuffix(l[0], "sandbox")+"agent" ||
			l[5] != "-1000" || l[6] != "0" {
			t.Fatalf("want the command in <unit>/sandbox with memory.max %s, pids.max %s, no swap, and the agent in <unit>/agent at -1000; got %+v", mem, pids, r)
		}
	}
	check(sb, "67108864", "100")

	up := sb.(backend.Updater)
	i64 := func(v int64) *int64 { return &v }
	err = up.Update(ctx, backend.Update{MemoryBytes: i64(65 << 20)})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "at most 67108864 bytes") {
		t.Fatalf("a memory limit above the VM's 64 MiB for the sandbox: %v, want invalid naming the most", err)
	}
	if err := up.Update(ctx, backend.Update{MemoryBytes: i64(48 << 20), PidsMax: i64(50)}); err != nil {
		t.Fatal(err)
	}
	check(sb, "50331648", "50")

	// systemd restarts the agent (from a timer's unit: the restart ends
	// the agent's unit's processes, this command's caller among them):
	// the new agent's cgroup takes the limits again. A process in flight
	// when the agent goes ends at once with the reason (Unavailable),
	// and the same handle reaches the next agent (QEMU's VSERPORT_CHANGE
	// ends the session and the VM connects again: microvm/liveness.go);
	// so does a daemon adopting the VM, through a port of its own. Calls
	// are given up after 30 s: before the events monitor a call on an
	// agent that died under it never ended.
	agentPid := func(sb backend.Sandbox) (string, error) {
		type res struct {
			r   conformance.Result
			err error
		}
		c := make(chan res, 1)
		go func() {
			r, err := conformance.TryExec(sb, backend.ProcSpec{Argv: []string{"pgrep", "-x", "warren-guest"}}, "")
			if err == nil && r.Status.Code != 0 {
				err = errors.New(r.Stderr)
			}
			c <- res{r, err}
		}()
		select {
		case x := <-c:
			return strings.TrimSpace(x.r.Stdout), x.err
		case <-time.After(30 * time.Second):
			return "", errors.New("no answer in 30 s")
		}
	}
	old, err := agentPid(sb)
	if err != nil {
		t.Fatal(err)
	}
	long, err := sb.Start(ctx, backend.ProcSpec{Argv: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"systemd-run", "--on-active=2", "systemctl", "restart", "warren-guest"}}, ""); r.Status.Code != 0 {
		t.Fatalf("systemd-run: %+v", r)
	}
	waited := make(chan error, 1)
	go func() { _, err := long.Wait(); waited <- err }()
	select {
	case err := <-waited:
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "guest agent exited") {
			t.Fatalf("a process in flight when the agent went: %v, want unavailable saying the agent exited", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a process in flight when the agent went never ended")
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(3 * time.Second) {
		pid, err := agentPid(sb)
		if err == nil && pid != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the same handle never reached the restarted agent (old pid %s): %q %v", old, pid, err)
		}
	}
	if n := sb.(*sandbox).AgentLosses(); n != 1 {
		t.Errorf("AgentLosses %d, want 1", n)
	}
	var sb2 backend.Sandbox
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(3 * time.Second) {
		b2, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		if sb2, err = b2.Adopt(ctx, "fvcg", sb.State()); err != nil {
			t.Fatal(err)
		}
		pid, err := agentPid(sb2)
		if err == nil && pid != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no restarted agent (pid %s) answered an adopting daemon: %q %v", old, pid, err)
		}
	}
	defer sb2.Destroy(context.Background())
	check(sb2, "50331648", "50")
}

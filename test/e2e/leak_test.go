package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

const (
	stateRunning = warrenv1.SandboxState_SANDBOX_STATE_RUNNING
	stateStopped = warrenv1.SandboxState_SANDBOX_STATE_STOPPED
)

// busy gives a sandbox something to clean up: files in its writable
// layer, a background process and its children.
func busy(t *testing.T, e *env, id string) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	e.shOK(id, "mkdir -p /work && dd if=/dev/zero of=/work/blob bs=1k count=256 2>/dev/null && echo data > /work/file")
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "sleep 300 & sleep 300 & wait"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"cat"}}); err != nil {
		t.Fatal(err)
	}
}

// TestLeakAfterDelete: deleting busy sandboxes, also with calls in
// flight, leaves the node as it was.
func TestLeakAfterDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	ids := []string{"d1", "d2", "d3"}
	// A network gives a sandbox a veth and nftables chains on the node.
	nets := map[string]*warrenv1.NetworkPolicy{"d1": {Mode: "open"},
		"d2": {Mode: "allowlist", Allow: []*warrenv1.NetworkRule{{Cidr: "198.18.0.0/15"}}}}
	for _, id := range ids {
		// A disk limit gives each sandbox a mount on the host (its root is
		// mounted only inside its own mount namespace).
		e.create(&warrenv1.CreateRequest{Id: id, Resources: &warrenv1.Resources{MemoryBytes: 128 << 20, PidsMax: 100, CpuMillis: 1000, DiskBytes: 64 << 20}, Network: nets[id]})
		busy(t, e, id)
	}
	if n := e.netnsCount(); n != len(ids) {
		t.Errorf("%d network namespaces for %d sandboxes", n, len(ids))
	}
	for _, id := range ids {
		kinds := map[string]bool{}
		for _, r := range e.resourcesOf(id) {
			kinds[r.kind] = true
		}
		want := []string{"mount", "dir", "cgroup", "process", "netns"}
		if nets[id] != nil {
			want = append(want, "veth", "nft")
		}
		for _, k := range want {
			if !kinds[k] {
				t.Errorf("sandbox %s holds no %s: the leak check would not see it", id, k)
			}
		}
	}

	// An exec and a stream in flight when their sandbox is deleted end
	// promptly.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "d1", Argv: []string{"sleep", "120"}})
		errs <- err
	}()
	go func() {
		defer wg.Done()
		_, err := e.c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "d1", Shell: "while true; do echo x; sleep 0.1; done"}, nil)
		errs <- err
	}()
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	for _, id := range ids {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	wg.Wait()
	close(errs)
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("deleting took %v", took)
	}
	for err := range errs {
		if err == nil {
			t.Errorf("a call into a deleted sandbox succeeded")
		} else if cat := client.CategoryOf(err); cat != client.CategoryConflict && cat != client.CategoryNotFound && cat != client.CategoryUnavailable {
			t.Errorf("call into a sandbox being deleted: %v", err)
		}
	}
	e.expectBaseline("after delete")

	// Many at once.
	var mu sync.Mutex
	var created []string
	var cwg sync.WaitGroup
	for i := range 8 {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			id := fmt.Sprintf("m%d", i)
			if _, err := e.c.Create(ctx, &warrenv1.CreateRequest{Id: id, Image: imageName}); err != nil {
				t.Errorf("create %s: %v", id, err)
				return
			}
			mu.Lock()
			created = append(created, id)
			mu.Unlock()
		}()
	}
	cwg.Wait()
	for _, id := range created {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			if err := e.c.Delete(ctx, id); err != nil {
				t.Errorf("delete %s: %v", id, err)
			}
		}()
	}
	cwg.Wait()
	e.expectBaseline("after concurrent creates and deletes")

	// The daemon itself does not accumulate file descriptors or
	// goroutines over create/use/delete cycles.
	cycle := func(i int) {
		id := fmt.Sprintf("cy%d", i)
		e.create(&warrenv1.CreateRequest{Id: id, TimeoutSeconds: 60})
		e.shOK(id, "echo x")
		if _, err := e.c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "echo y"}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"sleep", "100"}}); err != nil {
			t.Fatal(err)
		}
		p, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: p.ProcessId}); err != nil {
			t.Fatal(err)
		}
		if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/f", Content: []byte("f")}); err != nil {
			t.Fatal(err)
		}
		rc, err := e.c.Download(ctx, id, "/etc")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, rc)
		rc.Close()
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	cycle(0)
	fds0, gor0 := e.daemonFDs(), e.goroutines(t)
	for i := 1; i <= 10; i++ {
		cycle(i)
	}
	var fds, gor int
	deadline := time.Now().Add(10 * time.Second)
	for {
		fds, gor = e.daemonFDs(), e.goroutines(t)
		if (fds <= fds0+4 && gor <= gor0+10) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("daemon: %d -> %d file descriptors, %d -> %d goroutines over 10 cycles", fds0, fds, gor0, gor)
	if fds > fds0+4 {
		t.Errorf("daemon file descriptors grew from %d to %d over 10 sandbox cycles", fds0, fds)
	}
	if gor > gor0+10 {
		t.Errorf("daemon goroutines grew from %d to %d over 10 sandbox cycles", gor0, gor)
	}
	e.expectBaseline("after the sandbox cycles")
}

// TestLeakInitKilled: a sandbox whose init is SIGKILLed from the host is
// reported DEAD with a reason, releases everything, and can be deleted.
func TestLeakInitKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	// The victim's network (veth, nftables chains) goes with it too.
	e.create(&warrenv1.CreateRequest{Id: "victim", Network: &warrenv1.NetworkPolicy{Mode: "open"}})
	e.create(&warrenv1.CreateRequest{Id: "bystander", Network: &warrenv1.NetworkPolicy{Mode: "open"}})
	busy(t, e, "victim")
	p, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "victim", Argv: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	execDone := make(chan error, 1)
	go func() {
		_, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "victim", Argv: []string{"sleep", "300"}})
		execDone <- err
	}()
	time.Sleep(300 * time.Millisecond)

	if err := unix.Kill(e.initPid("victim"), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sb, err := e.waitState("victim", stateStopped, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sb.DeadReason == "" {
		t.Errorf("dead sandbox without a reason: %v", sb)
	}
	e.expectNoResources("victim", "after its init was killed")
	select {
	case err := <-execDone:
		if err == nil {
			t.Errorf("exec in a sandbox whose init died succeeded")
		}
	case <-time.After(15 * time.Second):
		t.Errorf("exec in a sandbox whose init died did not return")
	}
	res, err := e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "victim", ProcessId: p.ProcessId, TimeoutMs: 15000})
	if err != nil {
		t.Errorf("wait for a process of a dead sandbox: %v", err)
	} else if res.ExitCode == 0 && res.Signal == 0 {
		t.Errorf("process of a dead sandbox exited cleanly: %v", res)
	}
	_, err = e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "victim", Argv: []string{"true"}})
	wantCategory(t, err, client.CategoryConflict, "exec in a dead sandbox")
	_, err = e.c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "victim", Path: "/work/file"})
	wantCategory(t, err, client.CategoryConflict, "read a file of a dead sandbox")
	// Dead sandboxes are listed until deleted.
	sbs, _ := e.c.List(ctx, nil)
	if len(sbs) != 2 {
		t.Errorf("list: %v", sbs)
	}
	e.shOK("bystander", "true")

	if err := e.c.Delete(ctx, "victim"); err != nil {
		t.Fatalf("delete a dead sandbox: %v", err)
	}
	// A dead sandbox is forgotten when its lifetime passes.
	e.create(&warrenv1.CreateRequest{Id: "shortlived", TimeoutSeconds: 3})
	if err := unix.Kill(e.initPid("shortlived"), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := e.waitState("shortlived", stateStopped, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := e.waitGone("shortlived", 10*time.Second); err != nil {
		t.Errorf("dead sandbox past its lifetime: %v", err)
	}
	_, err = e.c.Get(ctx, "victim")
	wantCategory(t, err, client.CategoryNotFound, "get after deleting a dead sandbox")
	e.shOK("bystander", "true")
	if err := e.c.Delete(ctx, "bystander"); err != nil {
		t.Fatal(err)
	}
	e.expectBaseline("after deleting the dead sandbox")
}

// TestDaemonKill9Restart: sandboxes outlive a daemon killed with SIGKILL;
// the next daemon adopts them, their files are intact, their timeouts
// still fire, and deleting them leaves nothing.
func TestDaemonKill9Restart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "keep", TimeoutSeconds: 600, Labels: map[string]string{"k": "v"}, Env: map[string]string{"E": "env"},
		Network: &warrenv1.NetworkPolicy{Mode: "allowlist", Allow: []*warrenv1.NetworkRule{{Cidr: "198.18.0.0/15"}}}})
	if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "keep", Path: "/work/api.txt", Content: []byte("via api"), MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	e.shOK("keep", "echo via exec > /work/exec.txt; dd if=/dev/urandom of=/work/rand bs=1k count=64 2>/dev/null; md5sum /work/rand > /work/rand.md5")
	keepPid := e.initPid("keep")
	// An exec in flight does not survive the daemon (the agent kills what
	// its dropped connections ran); a background process does (the agent
	// owns it).
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "keep", Shell: "sleep 300 & sleep 300"}); err != nil {
		t.Fatal(err)
	}
	cl := e.c // e.c is replaced by the restart
	go func() {
		_, _ = cl.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "keep", Shell: "sleep 301 & sleep 301"})
	}()
	// init and two sleeps for each (the shells may exec the last one).
	if err := e.waitProcs("keep", func(n int) bool { return n >= 5 }, 10*time.Second); err != nil {
		t.Errorf("before the kill: %v", err)
	}
	brief := e.create(&warrenv1.CreateRequest{Id: "brief", TimeoutSeconds: 4, Network: &warrenv1.NetworkPolicy{Mode: "open"}})

	e.kill9()
	// The sandboxes run on without a daemon.
	time.Sleep(200 * time.Millisecond)
	if pid := e.initPid("keep"); pid != keepPid {
		t.Errorf("init of keep changed from %d to %d", keepPid, pid)
	}
	if len(e.resourcesOf("brief")) == 0 {
		t.Errorf("brief vanished with the daemon")
	}

	e.start()
	sb, err := e.c.Get(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != stateRunning || sb.Labels["k"] != "v" || sb.ExpiresAtUnixMs == 0 || sb.GetNetwork().GetMode() != "allowlist" || sb.NetworkAddress == "" {
		t.Errorf("adopted sandbox: %v", sb)
	}
	// The adopted sandbox's network is the restarted daemon's to change.
	if _, err := e.c.Update(ctx, "keep", client.SandboxUpdate{Network: &warrenv1.NetworkPolicy{Mode: "open"}}); err != nil {
		t.Errorf("update the network of an adopted sandbox: %v", err)
	}
	if got := e.shOK("keep", "cat /work/api.txt; echo; cat /work/exec.txt; md5sum -c /work/rand.md5 >/dev/null && echo intact; echo $E"); got != "via api\nvia exec\nintact\nenv\n" {
		t.Errorf("files after restart: %q", got)
	}
	rd, err := e.c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "keep", Path: "/work/api.txt"})
	if err != nil || string(rd.Content) != "via api" {
		t.Errorf("read after restart: %q %v", rd.GetContent(), err)
	}
	// Streams and background processes work on the adopted sandbox.
	var streamed []byte
	if _, err := e.c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "keep", Shell: "echo s"}, func(ev *warrenv1.ExecEvent) error {
		streamed = append(streamed, ev.GetStdout()...)
		return nil
	}); err != nil || string(streamed) != "s\n" {
		t.Errorf("stream after restart: %q %v", streamed, err)
	}
	if p, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "keep", Argv: []string{"echo", "bg"}}); err != nil {
		t.Errorf("start process after restart: %v", err)
	} else if res, err := e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "keep", ProcessId: p.ProcessId, TimeoutMs: 10000}); err != nil || string(res.Stdout) != "bg\n" {
		t.Errorf("background process after restart: %v %v", res, err)
	}
	if pid := e.initPid("keep"); pid != keepPid {
		t.Errorf("keep was recreated: init %d, was %d", pid, keepPid)
	}
	// init, and the background process's sleeps (and shell): the exec's are gone.
	if err := e.waitProcs("keep", func(n int) bool { return n == 3 || n == 4 }, 10*time.Second); err != nil {
		t.Errorf("after the restart: %v", err)
	}
	if ps, err := e.c.ListProcesses(ctx, "keep"); err != nil || len(ps) != 2 || !ps[0].Running || ps[1].Running {
		t.Errorf("background processes after the restart: %v %v", ps, err)
	}
	if err := e.c.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: "keep", ProcessId: "p-1", Signal: 9, Group: true}); err != nil {
		t.Errorf("kill the background process started before the restart: %v", err)
	}
	if err := e.waitProcs("keep", func(n int) bool { return n == 1 }, 10*time.Second); err != nil {
		t.Errorf("after killing it: %v", err)
	}

	// The short timeout set before the crash still fires.
	expires := time.UnixMilli(brief.ExpiresAtUnixMs)
	if err := e.waitGone("brief", time.Until(expires)+8*time.Second); err != nil {
		t.Error(err)
	} else if early := time.Until(expires); early > 500*time.Millisecond {
		t.Errorf("brief deleted %v before its deadline", early)
	}
	e.expectNoResources("brief", "after the timeout fired on the restarted daemon")

	// A graceful restart keeps them too.
	if err := e.stop(); err != nil {
		t.Error(err)
	}
	e.start()
	if got := e.shOK("keep", "cat /work/exec.txt"); got != "via exec\n" {
		t.Errorf("after a graceful restart: %q", got)
	}
	// New sandboxes work next to adopted ones.
	e.create(&warrenv1.CreateRequest{Id: "fresh"})
	e.shOK("fresh", "true")

	for _, id := range []string{"keep", "fresh"} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	e.expectBaseline("after deleting the adopted sandboxes")
}

// TestDeathWhileDaemonDown: a sandbox killed while no daemon runs is DEAD
// after the restart, and its resources are gone.
func TestDeathWhileDaemonDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	// Networks: the killed sandbox's veth dies with its namespace, but
	// its nftables chains are the next daemon's to remove.
	open := &warrenv1.NetworkPolicy{Mode: "open"}
	e.create(&warrenv1.CreateRequest{Id: "gone", Network: open})
	e.create(&warrenv1.CreateRequest{Id: "alive", Network: open})
	busy(t, e, "gone")
	e.shOK("alive", "echo a > /a")

	e.kill9()
	pid := e.initPid("gone")
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Its pid namespace dies with it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var procs []string
		for _, r := range e.resourcesOf("gone") {
			if r.kind == "process" {
				procs = append(procs, r.what)
			}
		}
		if len(procs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the killed sandbox remain: %v", procs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.start()
	sb, err := e.c.Get(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != stateStopped || sb.DeadReason == "" {
		t.Errorf("sandbox killed while the daemon was down: %v", sb)
	}
	e.expectNoResources("gone", "after the restart")
	_, err = e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "gone", Argv: []string{"true"}})
	wantCategory(t, err, client.CategoryConflict, "exec in a dead sandbox")
	if got := e.shOK("alive", "cat /a"); got != "a\n" {
		t.Errorf("alive: %q", got)
	}
	// A sandbox whose lifetime passes while no daemon runs is deleted by
	// the next one.
	e.create(&warrenv1.CreateRequest{Id: "lapsed", TimeoutSeconds: 1, Network: open})
	e.kill9()
	time.Sleep(1500 * time.Millisecond)
	e.start()
	if err := e.waitGone("lapsed", 5*time.Second); err != nil {
		t.Error(err)
	}
	e.expectNoResources("lapsed", "after its lifetime passed while the daemon was down")

	// The DEAD record survives another restart until deleted.
	e.kill9()
	e.start()
	if sb, err := e.c.Get(ctx, "gone"); err != nil || sb.State != stateStopped {
		t.Errorf("dead sandbox after a second restart: %v %v", sb, err)
	}
	if err := e.c.Delete(ctx, "gone"); err != nil {
		t.Fatalf("delete the dead sandbox: %v", err)
	}
	if err := e.c.Delete(ctx, "alive"); err != nil {
		t.Fatal(err)
	}
	e.expectBaseline("after deleting everything")
}

// TestOrphanSweep kills the daemon in the middle of many concurrent
// creates. After the restart every resource on the node must belong to a
// running sandbox the daemon lists, every create that succeeded must be
// listed, and every listed running sandbox must work.
func TestOrphanSweep(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	for round, killAfter := range []int{1, 6} {
		const n = 20
		var (
			wg      sync.WaitGroup
			ok      atomic.Int64
			mu      sync.Mutex
			created []string
		)
		okCh := make(chan struct{}, n)
		// A client of its own: the daemon dies under its calls.
		cl, err := client.New(e.addr(), client.WithToken(""))
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("r%dc%02d", round, i)
				ctx := ctxFor(t, time.Minute)
				if _, err := cl.Create(ctx, &warrenv1.CreateRequest{Id: id, Image: imageName}); err == nil {
					ok.Add(1)
					mu.Lock()
					created = append(created, id)
					mu.Unlock()
					okCh <- struct{}{}
				}
			}()
		}
		timeout := time.After(20 * time.Second)
	wait:
		for range killAfter {
			select {
			case <-okCh:
			case <-timeout:
				break wait
			}
		}
		e.kill9()
		wg.Wait()
		cl.Close()
		if ok.Load() == n {
			t.Logf("round %d: every create finished before the kill", round)
		}
		e.start()
		ctx := ctxFor(t, time.Minute)
		sbs, err := e.c.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		states := map[string]warrenv1.SandboxState{}
		for _, sb := range sbs {
			states[sb.Id] = sb.State
		}
		t.Logf("round %d: %d creates succeeded before the kill, %d sandboxes listed after the restart", round, ok.Load(), len(sbs))
		for _, id := range created {
			if states[id] != stateRunning {
				t.Errorf("create of %s succeeded but after the restart it is %v", id, states[id])
			}
		}
		// Deleted sandboxes' files leave in the background.
		e.waitTrashEmpty(30 * time.Second)
		var orphans []string
		for _, r := range e.resources() {
			if states[r.id] != stateRunning {
				orphans = append(orphans, r.String())
			}
		}
		if len(orphans) > 0 {
			slices.Sort(orphans)
			t.Errorf("round %d: resources of no running sandbox after the restart:\n  %s", round, strings.Join(orphans, "\n  "))
		}
		for id, st := range states {
			if st != stateRunning {
				t.Errorf("round %d: sandbox %s listed as %v after the restart", round, id, st)
				continue
			}
			if res, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "hostname"}); err != nil || string(res.Stdout) != id+"\n" {
				t.Errorf("round %d: exec in %s: %v %v", round, id, res, err)
			}
			kinds := map[string]bool{}
			for _, r := range e.resourcesOf(id) {
				kinds[r.kind] = true
			}
			// No "mount": a root is mounted only in the sandbox's namespace.
			for _, k := range []string{"dir", "cgroup", "process"} {
				if !kinds[k] {
					t.Errorf("round %d: running sandbox %s has no %s", round, id, k)
				}
			}
		}
		for id := range states {
			if err := e.c.Delete(ctx, id); err != nil {
				t.Errorf("delete %s: %v", id, err)
			}
		}
		e.expectBaseline(fmt.Sprintf("round %d: after deleting everything", round))
		if t.Failed() {
			return
		}
	}
}

// TestKillDuringDeletes kills the daemon in the middle of many concurrent
// deletes: after the restart no deleted sandbox is back, and every
// resource belongs to a running sandbox the daemon lists.
func TestKillDuringDeletes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	const n = 12
	for i := range n {
		e.create(&warrenv1.CreateRequest{Id: fmt.Sprintf("del%02d", i)})
	}
	cl, err := client.New(e.addr(), client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		deleted []string
	)
	okCh := make(chan struct{}, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("del%02d", i)
			if err := cl.Delete(ctxFor(t, time.Minute), id); err == nil {
				mu.Lock()
				deleted = append(deleted, id)
				mu.Unlock()
				okCh <- struct{}{}
			}
		}()
	}
	select {
	case <-okCh:
	case <-time.After(20 * time.Second):
	}
	e.kill9()
	wg.Wait()
	cl.Close()
	e.start()
	ctx := ctxFor(t, time.Minute)
	sbs, err := e.c.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d deletes succeeded before the kill, %d sandboxes listed after the restart", len(deleted), len(sbs))
	states := map[string]warrenv1.SandboxState{}
	for _, sb := range sbs {
		states[sb.Id] = sb.State
		if sb.State != stateRunning {
			t.Errorf("sandbox %s is %v after the restart", sb.Id, sb.State)
		}
	}
	for _, id := range deleted {
		if st, ok := states[id]; ok {
			t.Errorf("sandbox %s was deleted but is back as %v", id, st)
		}
	}
	// Deleted sandboxes' files leave in the background.
	e.waitTrashEmpty(30 * time.Second)
	for _, r := range e.resources() {
		if states[r.id] != stateRunning {
			t.Errorf("resource of no running sandbox after the restart: %v", r)
		}
	}
	for id := range states {
		if got := e.shOK(id, "hostname"); got != id+"\n" {
			t.Errorf("%s: hostname %q", id, got)
		}
		if err := e.c.Delete(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	e.expectBaseline("after deleting everything")
}

// TestOrphanSweepFabricated plants resources for ids the daemon's store
// does not know (directories, cgroups with a live process in them, a
// mount on a root) and checks that a restarted daemon sweeps all of them
// while leaving its own sandboxes alone.
func TestOrphanSweepFabricated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "real"})
	e.shOK("real", "echo real > /mark")
	e.kill9()

	// ghost1: everything a sandbox has, with a process in its cgroup.
	// ghost2: only a state directory. ghost3: only an empty cgroup.
	for _, d := range []string{
		filepath.Join(e.runDir, "sb", "ghost1", "rootfs"),
		filepath.Join(e.stateDir, "sandboxes", "ghost1", "upper"),
		filepath.Join(e.stateDir, "sandboxes", "ghost2", "upper"),
	} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("tmpfs", filepath.Join(e.runDir, "sb", "ghost1", "rootfs"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	// On v1 and hybrid hosts ghost1 has the layout of older versions, a
	// group in each of six v1 hierarchies; on hybrid hosts ghost4 has the
	// current one (memory, cpu, pids and unified) with a process in it.
	var groups, hybridGroups []string
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		groups = []string{"/sys/fs/cgroup"}
	} else {
		for _, h := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "devices"} {
			groups = append(groups, filepath.Join("/sys/fs/cgroup", h))
		}
		var st unix.Statfs_t
		if unix.Statfs("/sys/fs/cgroup/unified", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			for _, h := range []string{"memory", "cpu", "pids", "unified"} {
				hybridGroups = append(hybridGroups, filepath.Join("/sys/fs/cgroup", h))
			}
		}
	}
	sleeper := func() (int, chan struct{}) {
		cmd := exec.Command("sleep", "300")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		reaped := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(reaped)
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-reaped
		})
		return cmd.Process.Pid, reaped
	}
	plant := func(groups []string, id string, pid int) {
		for _, g := range groups {
			if err := os.MkdirAll(filepath.Join(g, e.parent, id), 0o755); err != nil {
				t.Fatal(err)
			}
			if pid == 0 {
				continue
			}
			if err := os.WriteFile(filepath.Join(g, e.parent, id, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	reaped := map[string]chan struct{}{}
	pid, ch := sleeper()
	reaped["ghost1"] = ch
	plant(groups, "ghost1", pid)
	plant(groups, "ghost3", 0)
	ghosts := []string{"ghost1", "ghost2", "ghost3"}
	wantPlanted := []string{"mount ghost1", "dir ghost1", "cgroup ghost1", "process ghost1", "dir ghost2", "cgroup ghost3"}
	if hybridGroups != nil {
		pid, ch := sleeper()
		reaped["ghost4"] = ch
		plant(hybridGroups, "ghost4", pid)
		ghosts = append(ghosts, "ghost4")
		wantPlanted = append(wantPlanted, "cgroup ghost4", "process ghost4")
	}
	planted := map[string]bool{}
	for _, r := range e.resources() {
		if strings.HasPrefix(r.id, "ghost") {
			planted[r.kind+" "+r.id] = true
		}
	}
	for _, want := range wantPlanted {
		if !planted[want] {
			t.Fatalf("planting failed: no %s (have %v)", want, planted)
		}
	}

	e.start()
	for _, id := range ghosts {
		e.expectNoResources(id, "after the restart's sweep")
	}
	for id, ch := range reaped {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Errorf("the process in orphaned cgroup %s was not killed", id)
		}
	}
	sbs, err := e.c.List(ctxFor(t, time.Minute), nil)
	if err != nil || len(sbs) != 1 || sbs[0].Id != "real" || sbs[0].State != stateRunning {
		t.Errorf("after the sweep: %v %v", sbs, err)
	}
	if got := e.shOK("real", "cat /mark"); got != "real\n" {
		t.Errorf("the daemon's own sandbox after the sweep: %q", got)
	}
	if err := e.c.Delete(ctxFor(t, time.Minute), "real"); err != nil {
		t.Fatal(err)
	}
	e.expectBaseline("after the sweep and deleting the real sandbox")
}

// TestSecondDaemonRefused: a second daemon on the same socket or the same
// state directory refuses to start and disturbs neither the first daemon
// nor its sandboxes.
func TestSecondDaemonRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "first"})
	e.shOK("first", "echo 1 > /one")
	pid := e.initPid("first")
	other := t.TempDir()
	t.Cleanup(func() {
		// Only if the second daemon wrongly got that far.
		gs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", e.parent+"-x"))
		gs = append(gs, filepath.Join("/sys/fs/cgroup", e.parent+"-x"))
		for _, g := range gs {
			_ = os.Remove(g)
		}
	})
	for name, args := range map[string][]string{
		"same socket": {"serve", "--state-dir", filepath.Join(other, "state"), "--run-dir", filepath.Join(other, "run"),
			"--socket", e.sock, "--cgroup-parent", e.parent + "-x"},
		"same state dir": {"serve", "--state-dir", e.stateDir, "--run-dir", e.runDir,
			"--socket", filepath.Join(other, "other.sock"), "--cgroup-parent", e.parent},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, e.bin, args...)
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut {
			t.Errorf("%s: second daemon did not refuse to start (err %v, timed out %v):\n%s", name, err, timedOut, out)
		}
		if got := e.shOK("first", "cat /one"); got != "1\n" {
			t.Errorf("%s: first sandbox after the second daemon: %q", name, got)
		}
		if p := e.initPid("first"); p != pid {
			t.Errorf("%s: first sandbox was replaced", name)
		}
		if _, err := e.c.Version(ctxFor(t, 10*time.Second)); err != nil {
			t.Errorf("%s: first daemon after the second one: %v", name, err)
		}
	}
	if err := e.c.Delete(ctxFor(t, time.Minute), "first"); err != nil {
		t.Fatal(err)
	}
}

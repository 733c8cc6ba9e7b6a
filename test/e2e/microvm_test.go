package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/microvm"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestMicroVMSandboxThroughTheAPI: with the one parameter backend
// "microvm", a sandbox of the usual image is a QEMU microVM: exec runs in
// its root (the image's layers) with a kernel of its own, a network
// policy holds in it as in a container, files go
// through its agent, background processes and the network survive a
// daemon restart (which adopts the VM), pause and resume work, and delete leaves no QEMU
// and no VM directory.
func TestMicroVMSandboxThroughTheAPI(t *testing.T) {
	needMicroVM(t)
	t.Parallel()
	e := microVMEnv(t)
	ctx := ctxFor(t, 3*time.Minute)
	sb := e.create(&warrenv1.CreateRequest{Id: "vm1", Backend: "microvm"})
	if sb.GetBackend() != "microvm" {
		t.Fatalf("backend %q", sb.GetBackend())
	}
	res, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "vm1", Shell: "uname -r; echo out; echo err >&2; exit 7"})
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	lines := strings.Split(string(res.GetStdout()), "\n")
	if len(lines) < 2 || lines[0] == strings.TrimSpace(string(host)) || lines[1] != "out" || string(res.GetStderr()) != "err\n" || res.GetExitCode() != 7 {
		t.Fatalf("exec in the VM: stdout %q stderr %q exit %d (host kernel %s)", res.GetStdout(), res.GetStderr(), res.GetExitCode(), host)
	}
	// A network policy gives the VM the daemon's sandbox networking (a
	// tap where a container has a veth, the same rules): the allowed test
	// host answers, the other does not.
	th, other := testutil.NewTestHost(t), testutil.NewTestHost(t)
	pAllowed := httpHost(t, th.NS, th.Addr.String()+":0", "vm")
	pOther := httpHost(t, other.NS, other.Addr.String()+":0", "other")
	e.create(&warrenv1.CreateRequest{Id: "vm2", Backend: "microvm", Network: policy("allowlist", rule(th.Addr.String()+"/32", 0, ""))})
	if body, ok := e.fetch("vm2", th.Addr.String(), pAllowed); !ok || body != "hello vm\n" {
		t.Errorf("a microvm's allowed host: %q %v", body, ok)
	}
	if _, ok := e.fetch("vm2", other.Addr.String(), pOther); ok {
		t.Errorf("a microvm reached a host not on its allowlist")
	}
	if err := e.c.Delete(ctx, "vm2"); err != nil {
		t.Fatal(err)
	}
	vmGone(t, e.vmDir("vm2"))
	// Files go through the guest agent, with the container's path rules.
	if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "vm1", Path: "/root/dir/f", Content: []byte("from the host"), MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	if r := e.sh("vm1", "cat /root/dir/f; echo -n ' and back' >> /root/dir/f"); string(r.GetStdout()) != "from the host" {
		t.Fatalf("the file written through the API, in the VM: %q", r.GetStdout())
	}
	rf, err := e.c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "vm1", Path: "/root/dir/f"})
	if err != nil || string(rf.GetContent()) != "from the host and back" {
		t.Fatalf("read back: %q %v", rf.GetContent(), err)
	}
	if _, err := e.c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "vm1", Path: "/root/none"}); !client.IsNotFound(err) {
		t.Fatalf("read of a missing file: %v, want not found", err)
	}
	// The guest agent writes a sparse archive when asked: a 1 GiB file
	// of holes crosses as its few bytes of data.
	e.sh("vm1", "truncate -s 1G /root/holes && echo end >> /root/holes")
	if n, err := archiveLen(ctx, e.c, "vm1", "/root/holes"); err != nil || n > 64<<10 {
		t.Errorf("sparse archive of a 1 GiB file of holes from the VM: %d bytes, %v", n, err)
	}
	// A background process is the guest agent's: it runs on across a
	// daemon restart, which adopts the VM (a port of its own on the
	// running QEMU), and is fed and waited for through the new daemon.
	// Its network too: the new daemon adopts the tap's attachment, and
	// neither backend's sweep takes it (they share the node's networking).
	e.create(&warrenv1.CreateRequest{Id: "vm3", Backend: "microvm", Network: policy("allowlist", rule(th.Addr.String()+"/32", 0, ""))})
	pi, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "vm3", Shell: "echo before; read x; echo after $x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if sb, err := e.c.Get(ctx, "vm3"); err != nil || sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("a microvm after a daemon restart: %v %v, want running", sb.GetState(), err)
	}
	if err := e.c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: "vm3", ProcessId: pi.GetProcessId(), Data: []byte("x\n"), Close: true}); err != nil {
		t.Fatal(err)
	}
	wr, err := e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "vm3", ProcessId: pi.GetProcessId()})
	if err != nil || string(wr.GetStdout()) != "before\nafter x\n" || wr.GetExitCode() != 0 {
		t.Fatalf("the background process across the restart: %+v %v", wr, err)
	}
	if body, ok := e.fetch("vm3", th.Addr.String(), pAllowed); !ok || body != "hello vm\n" {
		t.Errorf("a microvm's allowed host after a daemon restart: %q %v", body, ok)
	}
	// Pause stops the VM (QMP), resume runs it on.
	if _, err := e.c.Pause(ctx, "vm3", false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Resume(ctx, "vm3"); err != nil {
		t.Fatal(err)
	}
	if r := e.sh("vm3", "echo resumed"); string(r.GetStdout()) != "resumed\n" {
		t.Fatalf("exec after resume: %+v", r)
	}
	vm3 := e.vmDir("vm3")
	if err := e.c.Delete(ctx, "vm3"); err != nil {
		t.Fatal(err)
	}
	vmGone(t, vm3)
	if err := e.c.Delete(ctx, "vm1"); err != nil && !client.IsNotFound(err) {
		t.Fatal(err)
	}
	vmGone(t, e.vmDir("vm1"))
}

// vmGone waits (bounded) until the VM directory dir and its QEMU are gone.
func vmGone(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := os.Stat(dir)
		if os.IsNotExist(err) && !qemuRunsFor(dir) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after delete: VM directory %v, QEMU running %v", err, qemuRunsFor(dir))
		}
	}
}

// qemuRunsFor: a process's command line names dir.
func qemuRunsFor(dir string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), dir) {
			return true
		}
	}
	return false
}

// twoHosts are two test hosts, each serving HTTP, that a VM's network
// policy lets it reach or not.
type twoHosts struct {
	a, b   *testutil.TestHost
	pa, pb int
}

func newTwoHosts(t *testing.T) twoHosts {
	a, b := testutil.NewTestHost(t), testutil.NewTestHost(t)
	return twoHosts{a: a, b: b, pa: httpHost(t, a.NS, a.Addr.String()+":0", "a"), pb: httpHost(t, b.NS, b.Addr.String()+":0", "b")}
}

// reaches checks which of the hosts sandbox id reaches.
func (h twoHosts) reaches(t *testing.T, e *env, id, when string, wantA, wantB bool) {
	t.Helper()
	if _, ok := e.fetch(id, h.a.Addr.String(), h.pa); ok != wantA {
		t.Errorf("%s: host a reachable %v, want %v", when, ok, wantA)
	}
	if _, ok := e.fetch(id, h.b.Addr.String(), h.pb); ok != wantB {
		t.Errorf("%s: host b reachable %v, want %v", when, ok, wantB)
	}
}

// policyMoves: VM id, made with an allowlist of host a, reaches a only;
// an Update moves it to b; an update to none (losing the VM's network
// device) is Unsupported and changes nothing; the rules outlive a daemon
// restart.
func (h twoHosts) policyMoves(ctx context.Context, t *testing.T, e *env, id string) {
	t.Helper()
	h.reaches(t, e, id, "at create", true, false)
	if _, err := e.c.Update(ctx, id, client.SandboxUpdate{Network: policy("allowlist", rule(h.b.Addr.String()+"/32", 0, ""))}); err != nil {
		t.Fatal(err)
	}
	h.reaches(t, e, id, "after the update", false, true)
	if _, err := e.c.Update(ctx, id, client.SandboxUpdate{Network: policy("none")}); !client.IsUnsupported(err) {
		t.Fatalf("update to none: %v, want unsupported", err)
	}
	h.reaches(t, e, id, "after a refused update", false, true)
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	h.reaches(t, e, id, "after a daemon restart", false, true)
}

// TestMicroVMNetworkUpdate: a running VM's network policy changes
// through the daemon's Update, as a container's does: the host it may
// reach moves from one test host to the other, the change outlives a
// daemon restart (the adopted VM keeps its new rules), and what a VM
// cannot do (lose its network device, or gain one) is Unsupported and
// changes nothing.
func TestMicroVMNetworkUpdate(t *testing.T) {
	needMicroVM(t)
	e := microVMEnv(t)
	ctx := ctxFor(t, 3*time.Minute)
	h := newTwoHosts(t)
	e.create(&warrenv1.CreateRequest{Id: "vmn", Backend: "microvm", Network: policy("allowlist", rule(h.a.Addr.String()+"/32", 0, ""))})
	h.policyMoves(ctx, t, e, "vmn")
	if _, err := e.c.Update(ctx, "vmn", client.SandboxUpdate{Network: policy("open")}); err != nil {
		t.Fatal(err)
	}
	h.reaches(t, e, "vmn", "open", true, true)

	e.create(&warrenv1.CreateRequest{Id: "vmoff", Backend: "microvm"})
	if _, err := e.c.Update(ctx, "vmoff", client.SandboxUpdate{Network: policy("open")}); !client.IsUnsupported(err) {
		t.Fatalf("a VM without a network device given one: %v, want unsupported", err)
	}
	for _, id := range []string{"vmn", "vmoff"} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		vmGone(t, e.vmDir(id))
	}
}

// needMicroVM skips a test where the node cannot boot microVMs: no QEMU
// (scripts/vm.sh installs it) or no guest kernel.
func needMicroVM(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skipf("no qemu-system-x86_64 (scripts/vm.sh installs it): %v", err)
	}
	if _, err := guestkernel.Find(guestkernel.Dir); err != nil {
		t.Skipf("%v", err)
	}
}

// microVMEnv is a daemon with this tree's guest agent for its microVMs.
func microVMEnv(t *testing.T) *env {
	t.Helper()
	agent := testutil.StaticBinary(t, "./cmd/warren-guest")
	return newEnv(t, envOptions{serveArgs: []string{"--guest-agent", agent}})
}

// vmDir is where the daemon keeps microVM id's files while it runs.
func (e *env) vmDir(id string) string { return filepath.Join(e.stateDir, "microvm", "vms", id) }

// checkpointsGone waits until the daemon's checkpoint directory is empty.
func (e *env) checkpointsGone(within time.Duration) {
	e.t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		ents, _ := os.ReadDir(filepath.Join(e.stateDir, "checkpoints"))
		if len(ents) == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("checkpoints left after delete: %v", ents)
		}
	}
}

// TestMicroVMOverVsockThroughTheAPI: a daemon started with --vm-transport
// vsock reaches its microVMs' agents over vsock (the kernel's vhost-vsock,
// else a vhost-device-vsock process per VM): exec, files, a network
// policy, a background process across a daemon restart (the new daemon
// connects beside nothing to hot-plug), pause and resume (a freeze of the
// VM's cgroup), hibernate refused with the reason and the VM running on,
// and delete leaving no QEMU, backend or VM directory.
func TestMicroVMOverVsockThroughTheAPI(t *testing.T) {
	needMicroVM(t)
	if _, err := microvm.PickVsock(""); err != nil {
		t.Skipf("%v", err)
	}
	t.Parallel()
	agent := testutil.StaticBinary(t, "./cmd/warren-guest")
	e := newEnv(t, envOptions{serveArgs: []string{"--guest-agent", agent, "--vm-transport", "vsock"}})
	ctx := ctxFor(t, 3*time.Minute)
	th := testutil.NewTestHost(t)
	port := httpHost(t, th.NS, th.Addr.String()+":0", "vsock")
	e.create(&warrenv1.CreateRequest{Id: "vs1", Backend: "microvm", Network: policy("allowlist", rule(th.Addr.String()+"/32", 0, ""))})
	if b, _ := os.ReadFile(filepath.Join(e.vmDir("vs1"), "vsock.log")); b == nil && !microvm.KernelVsock() {
		t.Fatalf("no vhost-user backend's log in the VM's directory")
	}
	if r := e.sh("vs1", "ls /sys/class/virtio-ports | wc -l; grep -c AF_VSOCK /proc/net/protocols"); string(r.GetStdout()) != "0\n1\n" {
		t.Fatalf("the guest's transport: %+v", r)
	}
	if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "vs1", Path: "/root/f", Content: []byte("via vsock")}); err != nil {
		t.Fatal(err)
	}
	if body, ok := e.fetch("vs1", th.Addr.String(), port); !ok || body != "hello vsock\n" {
		t.Errorf("the allowed host from a vsock VM: %q %v", body, ok)
	}
	pi, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "vs1", Shell: "cat /root/f; read x; echo; echo after $x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if err := e.c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: "vs1", ProcessId: pi.GetProcessId(), Data: []byte("x\n"), Close: true}); err != nil {
		t.Fatal(err)
	}
	wr, err := e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: "vs1", ProcessId: pi.GetProcessId()})
	if err != nil || string(wr.GetStdout()) != "via vsock\nafter x\n" || wr.GetExitCode() != 0 {
		t.Fatalf("the background process across the restart: %+v %v", wr, err)
	}
	if ports, _ := filepath.Glob(filepath.Join(e.vmDir("vs1"), "a*.sock")); len(ports) != 0 {
		t.Fatalf("the restarted daemon hot-plugged agent ports: %v", ports)
	}
	if _, err := e.c.Pause(ctx, "vs1", false); err != nil {
		t.Fatal(err)
	}
	// The daemon goes and comes back while the VM is paused: its
	// connection closes meanwhile, which the paused VM takes after the
	// resume.
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if _, err := e.c.Resume(ctx, "vs1"); err != nil {
		t.Fatal(err)
	}
	if r := e.sh("vs1", "cat /root/f"); string(r.GetStdout()) != "via vsock" {
		t.Fatalf("exec after a pause across a restart: %+v", r)
	}
	if _, err := e.c.Hibernate(ctx, "vs1"); !client.IsUnsupported(err) || !strings.Contains(err.Error(), "vsock") {
		t.Fatalf("hibernate of a vsock VM: %v, want unsupported naming vsock", err)
	}
	if r := e.sh("vs1", "echo on"); string(r.GetStdout()) != "on\n" {
		t.Fatalf("exec after a refused hibernate: %+v", r)
	}
	dir := e.vmDir("vs1")
	if err := e.c.Delete(ctx, "vs1"); err != nil {
		t.Fatal(err)
	}
	vmGone(t, dir)
}

// TestVMAccelFlag: --vm-accel takes auto, kvm or tcg; anything else is
// refused before the daemon makes anything, and a daemon says which
// accelerator its VMs get and why (here TCG: /dev/kvm is PVM's or absent).
func TestVMAccelFlag(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	bin := testutil.StaticBinary(t, "./cmd/warren")
	dir := t.TempDir()
	_, stderr, code := runCLI(t, bin, nil, nil, "serve",
		"--state-dir", filepath.Join(dir, "state"), "--run-dir", filepath.Join(dir, "run"),
		"--socket", filepath.Join(dir, "s.sock"), "--cgroup-parent", "warren-e2e-accel", "--vm-accel", "hvf")
	if code == 0 || !strings.Contains(stderr, `--vm-accel "hvf": auto, kvm or tcg`) {
		t.Errorf("serve --vm-accel hvf: exit %d %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); err == nil {
		t.Errorf("a daemon that refused to start created its state directory")
	}
	e := newEnv(t, envOptions{})
	kvm, why, err := microvm.ResolveAccel(microvm.AccelAuto)
	if err != nil {
		t.Fatal(err)
	}
	want := map[bool]string{true: "VMs run under KVM", false: "VMs run under TCG"}[kvm]
	if log := e.logTail(200); !strings.Contains(log, want) || !strings.Contains(log, why) {
		t.Errorf("the daemon's log lacks %q (%s):\n%s", want, why, log)
	}
}

package e2e

// The adversarial suite's kernel-facing part (issue #11): each test runs
// an attack inside a real sandbox and asserts the refusal (the exact
// errno) or the containment. test/e2e/attack makes the calls raw.

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// attackImage imports the busybox image with test/e2e/attack at
// /bin/attack.
func attackImage(t *testing.T, e *env) string {
	t.Helper()
	bin := testutil.StaticBinary(t, "./test/e2e/attack")
	importVariant(t, e, "attack", func(root string) {
		dst := filepath.Join(root, "bin", "attack")
		if out, err := exec.Command("cp", bin, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v\n%s", err, out)
		}
	})
	return "attack"
}

// attack runs /bin/attack with the named attacks in sandbox id and
// returns each one's outcome ("ok" or the errno's name).
func (e *env) attack(id string, names ...string) map[string]string {
	e.t.Helper()
	out := e.shOK(id, "/bin/attack "+strings.Join(names, " "))
	got := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, res, _ := strings.Cut(sc.Text(), " ")
		got[name] = res
	}
	return got
}

// refusals are the attacks the default hardening refuses, with the errno
// each must get. Without the filter most of them get EINVAL (bad
// arguments reached the kernel), ENOSYS-less kernels' answers, or
// succeed: ficlone is ENOTSUP on ext4 either way, so it is checked with
// its high bits set in the unit test instead.
var refusals = map[string]string{
	"bpf":              "EPERM",
	"perf_event_open":  "EPERM",
	"userfaultfd":      "EPERM",
	"keyctl":           "EPERM",
	"add_key":          "EPERM",
	"init_module":      "EPERM",
	"finit_module":     "EPERM",
	"kexec_load":       "EPERM",
	"open_by_handle":   "EPERM",
	"io_uring_setup":   "ENOSYS",
	"unshare_user":     "EPERM",
	"unshare_user_net": "EPERM",
	"clone_user":       "EPERM",
	"clone3":           "ENOSYS",
	"setns":            "EPERM",
	"mount_tmpfs":      "EPERM",
	"vsock":            "EAFNOSUPPORT",
	"raw_socket":       "EPERM",
	"packet_socket":    "EPERM",
	"sethostname":      "EPERM",
	"settimeofday":     "EPERM",
	"ptrace_pid1":      "EPERM",
	"ficlone":          "ENOTSUP",
	"move_ext":         "EPERM",
	"swapext":          "EPERM",
	"ficlone_layer":    "ENOTSUP",
	"move_ext_layer":   "EPERM",
	"swapext_layer":    "EPERM",
	"setflags_upper":   "EPERM",
	"setflags_layer":   "EPERM",
	"getflags":         "ok",
	"sync":             "ok",
}

// TestAttacksOnTheKernelAreRefused: the calls agents and kernel exploits
// use against the node (modules, kexec, bpf, perf, userfaultfd, keyrings,
// user namespaces, mounts, vsock, raw sockets, the clock, filesystem-
// metadata ioctls on the writable layer and on image layers, ptrace of the
// agent) fail with the errno the policy names, as root in the sandbox, in
// an exec and in a background process. With --seccomp=false the same
// sandbox still has no_new_privs, and the filter-only refusals are gone:
// userfaultfd among them, on a node set as warren serve sets it
// (vm.unprivileged_userfaultfd=1, for lazy restores).
func TestAttacksOnTheKernelAreRefused(t *testing.T) {
	holdUffdKnob(t, "1")
	e := newEnv(t, envOptions{})
	img := attackImage(t, e)
	sb := e.create(&warrenv1.CreateRequest{Image: img, Id: "attacker"})
	names := make([]string, 0, len(refusals))
	for n := range refusals {
		names = append(names, n)
	}
	got := e.attack(sb.Id, names...)
	for n, want := range refusals {
		if got[n] != want {
			t.Errorf("%s in a sandbox: %q, want %s", n, got[n], want)
		}
	}
	if out := e.shOK(sb.Id, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"); out != "NoNewPrivs:\t1\nSeccomp:\t2\n" {
		t.Errorf("an exec's status:\n%s", out)
	}
	// PID 1 (the agent) runs under the filter too.
	if out := e.shOK(sb.Id, "grep -E '^(NoNewPrivs|Seccomp):' /proc/1/status"); out != "NoNewPrivs:\t1\nSeccomp:\t2\n" {
		t.Errorf("PID 1's status:\n%s", out)
	}
	// Every process carries the init's host pid as its audit login uid
	// (the daemon attributes the kernel's audit records by it), and
	// cannot change it. In a user namespace the host pid is no id the
	// sandbox can name: it reads as unset (-1), and stays so.
	if _, err := os.Stat("/proc/self/loginuid"); err == nil {
		want := fmt.Sprint(e.initPid(sb.Id))
		if sb.UserNamespace {
			want = "4294967295"
		}
		if out := e.shOK(sb.Id, "cat /proc/self/loginuid; echo; echo 7 > /proc/self/loginuid 2>/dev/null && echo changed; cat /proc/self/loginuid"); out != want+"\n"+want {
			t.Errorf("audit login uid in the sandbox: %q, want %s (unchangeable)", out, want)
		}
	}
	// The sandbox still works as a machine: a new hostname is refused,
	// the old one stays.
	if out := e.shOK(sb.Id, "hostname"); out != "attacker\n" {
		t.Errorf("hostname after sethostname: %q", out)
	}

	// Without the filter the daemon leaves the node's userfaultfd
	// setting alone (the filter is what keeps it from sandboxes); the
	// test then sets it as warren serve would have.
	if err := os.WriteFile(uffdKnob, []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	off := newEnv(t, envOptions{serveArgs: []string{"--seccomp=false"}, nodeUffd: true})
	if v := readUffdKnob(t); v != "0" || !strings.Contains(off.logTail(1<<20), "left vm.unprivileged_userfaultfd as it is") {
		t.Errorf("warren serve --seccomp=false: vm.unprivileged_userfaultfd %s, want it left at 0 and the log to say so", v)
	}
	if err := os.WriteFile(uffdKnob, []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	attackImage(t, off)
	plain := off.create(&warrenv1.CreateRequest{Image: img, Id: "plain"})
	if out := off.shOK(plain.Id, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"); out != "NoNewPrivs:\t1\nSeccomp:\t0\n" {
		t.Errorf("--seccomp=false: status:\n%s", out)
	}
	filterOnly := []string{"bpf", "vsock", "clone3", "setflags_upper", "unshare_user", "userfaultfd"}
	pg := off.attack(plain.Id, filterOnly...)
	for _, n := range filterOnly {
		if pg[n] == refusals[n] {
			t.Errorf("--seccomp=false: %s still %s: the test does not tell the filter from the kernel", n, pg[n])
		}
	}
}

// TestSetuidGrantsNothing: no_new_privs means a setuid-root binary run by
// an unprivileged user of the sandbox keeps that user's ids, unless the
// sandbox was created with allow_setuid.
func TestSetuidGrantsNothing(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := attackImage(t, e)
	sb := e.create(&warrenv1.CreateRequest{Image: img, Id: "suid"})
	// Root in the sandbox makes the setuid-root binary, as an agent would.
	if mode := e.shOK(sb.Id, "cp /bin/attack /tmp/suid && chmod 4755 /tmp/suid && stat -c %a:%u /tmp/suid"); mode != "4755:0\n" {
		t.Fatalf("setuid copy is %q, want 4755:0: the test proves nothing", mode)
	}
	res, err := e.c.Exec(ctxFor(t, time.Minute), &warrenv1.ExecRequest{SandboxId: sb.Id, Argv: []string{"/tmp/suid", "euid"}, User: "65534"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Stdout); got != "euid=65534 euid ok\n" {
		t.Errorf("setuid-root binary as uid 65534 printed %q, want euid=65534", got)
	}
	// allow_setuid turns no_new_privs off for a sandbox whose image needs
	// sudo: the same binary then runs as root, and the filter stays.
	open := e.create(&warrenv1.CreateRequest{Image: img, Id: "suid-allowed", AllowSetuid: true})
	if !open.AllowSetuid {
		t.Errorf("sandbox created with allow_setuid does not say so")
	}
	e.shOK(open.Id, "cp /bin/attack /tmp/suid && chmod 4755 /tmp/suid")
	res, err = e.c.Exec(ctxFor(t, time.Minute), &warrenv1.ExecRequest{SandboxId: open.Id, Argv: []string{"/tmp/suid", "euid", "bpf"}, User: "65534"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Stdout); got != "euid=0 euid ok\nbpf EPERM\n" {
		t.Errorf("with allow_setuid, the setuid-root binary printed %q, want euid=0 and bpf still refused", got)
	}
	if out := e.shOK(open.Id, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"); out != "NoNewPrivs:\t0\nSeccomp:\t2\n" {
		t.Errorf("allow_setuid status:\n%s", out)
	}
}

// TestNodeInformationIsMasked: what would show the node's physical pages,
// kernel addresses or log reads empty or not at all, and reading every
// file below / finishes (nothing blocks it or feeds it forever).
func TestNodeInformationIsMasked(t *testing.T) {
	e := newEnv(t, envOptions{})
	sb := e.create(&warrenv1.CreateRequest{Image: attackImage(t, e), Id: "masks"})
	for _, f := range []string{"/proc/kpagecgroup", "/proc/kpageflags", "/proc/kpagecount", "/proc/kcore", "/proc/vmallocinfo", "/proc/timer_list", "/proc/sched_debug"} {
		if _, err := os.Stat(f); err != nil {
			continue // this kernel lacks it
		}
		if out := e.shOK(sb.Id, "wc -c < "+f+" 2>/dev/null || echo refused"); out != "0\n" && out != "refused\n" {
			t.Errorf("%s reads %s bytes in a sandbox", f, strings.TrimSpace(out))
		}
	}
	if out := e.shOK(sb.Id, "cat /sys/kernel/vmcoreinfo 2>/dev/null | wc -c"); out != "0\n" {
		t.Errorf("/sys/kernel/vmcoreinfo reads %s bytes", strings.TrimSpace(out))
	}
	for _, d := range []string{"/sys/kernel/slab", "/sys/kernel/debug", "/sys/kernel/tracing", "/sys/kernel/security"} {
		if out := e.shOK(sb.Id, "ls -A "+d+" 2>/dev/null | wc -l"); out != "0\n" {
			t.Errorf("%s lists %s entries", d, strings.TrimSpace(out))
		}
	}
	// grep -r / as GNU grep does it (busybox's grep opens the pipes of
	// other processes through /proc/PID/fd and blocks on any machine).
	res, err := e.c.Exec(ctxFor(t, 3*time.Minute), &warrenv1.ExecRequest{SandboxId: sb.Id, Argv: []string{"/bin/attack", "walk"}, TimeoutMs: 150_000})
	if err != nil {
		t.Fatal(err)
	}
	if out := string(res.Stdout); res.TimedOut || !strings.HasSuffix(out, " walk ok\n") || !strings.HasPrefix(out, "walk read=") {
		t.Errorf("a read of every file below / did not finish: timed out %v, stdout %q, stderr %q", res.TimedOut, res.Stdout, res.Stderr)
	}
}

// dirtyBytes is how much of sandbox id's page cache waits to be written
// back, from its memory cgroup (v1 "dirty", v2 "file_dirty").
func (e *env) dirtyBytes(id string) (int64, error) {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory", e.parent, id, "memory.stat"),
		filepath.Join("/sys/fs/cgroup", e.parent, id, "memory.stat"),
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, " ")
			if k == "dirty" || k == "file_dirty" {
				return strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no memory.stat with a dirty count for %s", id)
}

// TestSyncDoesNotFlushNeighbours: sync(2) in one sandbox returns at once
// and writes back nothing of another sandbox's: without the filter it
// flushed the node's whole page cache (every sandbox's dirty pages), so
// a loop of it slowed every neighbour's writes.
func TestSyncDoesNotFlushNeighbours(t *testing.T) {
	e := newEnv(t, envOptions{})
	victim := e.create(&warrenv1.CreateRequest{Id: "victim"})
	syncer := e.create(&warrenv1.CreateRequest{Id: "syncer"})
	e.shOK(victim.Id, "dd if=/dev/zero of=/root/dirty bs=1M count=96 2>/dev/null")
	before, err := e.dirtyBytes(victim.Id)
	if err != nil {
		t.Fatal(err)
	}
	if before < 64<<20 {
		t.Skipf("only %d bytes of the victim's writes are still dirty (writeback is eager on this node): nothing to measure", before)
	}
	e.shOK(syncer.Id, "for i in 1 2 3 4 5 6 7 8 9 10; do sync; done")
	after, err := e.dirtyBytes(victim.Id)
	if err != nil {
		t.Fatal(err)
	}
	if after < before/2 {
		t.Errorf("a neighbour's sync wrote back the victim's pages: dirty %d -> %d bytes", before, after)
	}
	// The victim's own fsync still writes its file.
	e.shOK(victim.Id, "dd if=/dev/zero of=/root/dirty bs=1M count=1 conv=notrunc,fsync 2>/dev/null")
}

// TestOverwrittenBinaryStaysInItsSandbox: replacing a system binary
// changes that sandbox's view only; the image layer and every other
// sandbox keep the original.
func TestOverwrittenBinaryStaysInItsSandbox(t *testing.T) {
	e := newEnv(t, envOptions{})
	a := e.create(&warrenv1.CreateRequest{Id: "overwriter"})
	b := e.create(&warrenv1.CreateRequest{Id: "bystander"})
	e.shOK(a.Id, "rm /bin/ls && printf '#!/bin/sh\\necho pwned\\n' > /bin/ls && chmod 755 /bin/ls")
	// /bin/ls by path: busybox's shell runs its own applets without one.
	if out := e.shOK(a.Id, "/bin/ls /"); out != "pwned\n" {
		t.Fatalf("the overwrite did not take in its own sandbox: %q", out)
	}
	if out := e.shOK(b.Id, "/bin/ls /"); strings.Contains(out, "pwned") || !strings.Contains(out, "bin") {
		t.Errorf("another sandbox's ls printed %q", out)
	}
	c := e.create(&warrenv1.CreateRequest{Id: "newcomer"})
	if out := e.shOK(c.Id, "/bin/ls /"); strings.Contains(out, "pwned") {
		t.Errorf("a new sandbox of the image got the overwritten ls: %q", out)
	}
}

// TestPlatformSocketsAreOutOfReach: a sandbox finds no unix socket of the
// platform (no socket file below its root, none named in its
// /proc/net/unix but its agent's, by a name without a path), cannot connect to the daemon's socket by its host
// path, and cannot open PID 1's (the agent's) listening socket.
func TestPlatformSocketsAreOutOfReach(t *testing.T) {
	e := newEnv(t, envOptions{})
	sb := e.create(&warrenv1.CreateRequest{Image: attackImage(t, e), Id: "prober"})
	got := e.attack(sb.Id, "agent_fd")
	// The agent's listening socket is in the sandbox's network namespace
	// (CRIU checkpoints only those), so /proc/net/unix names it, by its
	// bare name: no path of the node's.
	if s := e.shOK(sb.Id, "/bin/attack sockets"); s != "sockets=net:agent.sock sockets ok\n" {
		t.Errorf("sockets visible in a sandbox: %q", s)
	}
	if got["agent_fd"] != "EACCES" && got["agent_fd"] != "EPERM" {
		t.Errorf("open /proc/1/fd/4 (the agent's socket): %q, want EACCES", got["agent_fd"])
	}
	for _, p := range []string{e.sock, filepath.Join(e.runDir, "sb", sb.Id, "agent.sock")} {
		if out := e.shOK(sb.Id, "ATTACK_PATH="+p+" /bin/attack connect_path"); out != "connect_path ENOENT\n" {
			t.Errorf("connect to %s from the sandbox: %q, want ENOENT", p, out)
		}
	}
}

// TestRefusalsAreEventsOfTheirSandbox: the filter's deliberate refusals
// (bpf, keyctl) become seccomp events of the sandbox that made them, even
// though the process exited at once (the audit login uid names the
// sandbox), while what the filter answers without refusing on purpose (an
// unknown call's ENOSYS, sync's no-op) makes none, nor does anything show
// up in a neighbour's events.
func TestRefusalsAreEventsOfTheirSandbox(t *testing.T) {
	e := newEnv(t, envOptions{})
	if strings.Contains(e.logTail(200), "no seccomp events") {
		t.Skipf("the daemon cannot read audit records here:\n%s", e.logTail(20))
	}
	img := attackImage(t, e)
	sb := e.create(&warrenv1.CreateRequest{Image: img, Id: "refused"})
	calm := e.create(&warrenv1.CreateRequest{Image: img, Id: "calm"})
	e.attack(calm.Id, "sync", "clone3")
	got := e.attack(sb.Id, "bpf", "keyctl", "sync", "clone3")
	if got["bpf"] != "EPERM" || got["keyctl"] != "EPERM" {
		t.Fatalf("attacks: %v", got)
	}
	want := map[string]bool{fmt.Sprintf("system call %d ", unix.SYS_BPF): false, fmt.Sprintf("system call %d ", unix.SYS_KEYCTL): false}
	deadline := time.Now().Add(5 * time.Second)
	for {
		evs, err := e.c.SandboxEvents(ctxFor(t, 10*time.Second), sb.Id)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			for k := range want {
				if ev.Kind == "seccomp" && strings.Contains(ev.Detail, k) {
					want[k] = true
				}
			}
			for _, nr := range []int{unix.SYS_SYNC, unix.SYS_CLONE3} {
				if strings.Contains(ev.Detail, fmt.Sprintf("system call %d ", nr)) {
					t.Errorf("an event for a call the filter does not refuse on purpose: %v", ev)
				}
			}
		}
		if want[fmt.Sprintf("system call %d ", unix.SYS_BPF)] && want[fmt.Sprintf("system call %d ", unix.SYS_KEYCTL)] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events of %s: %v; found %v", sb.Id, evs, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if evs, err := e.c.SandboxEvents(ctxFor(t, 10*time.Second), calm.Id); err != nil || len(evs) != 0 {
		t.Errorf("the neighbour's events: %v %v", evs, err)
	}
}

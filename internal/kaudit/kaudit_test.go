package kaudit

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/events"
	"github.com/warrenrl/warren/internal/testutil"
)

func TestParseSeccomp(t *testing.T) {
	rec, ok := ParseSeccomp([]byte(`audit(1733112345.678:1234): auid=4294967295 uid=0 gid=0 ses=4294967295 subj=unconfined pid=4321 comm=6D7920636D64 exe="/bin/busybox" sig=0 arch=c000003e syscall=163 compat=0 ip=0x4a3b1e code=0x50001`))
	if !ok || rec.Pid != 4321 || rec.Comm != "my cmd" || rec.Exe != "/bin/busybox" || rec.Syscall != 163 || rec.Arch != "c000003e" {
		t.Fatalf("%+v %v", rec, ok)
	}
	if a := rec.Action(); a != "refused with EPERM" {
		t.Errorf("action %q", a)
	}
	if r := (Seccomp{Code: 0x80000000}); r.Action() != "process killed" {
		t.Errorf("kill_process: %q", r.Action())
	}
	if _, ok := ParseSeccomp([]byte(`audit(1:2): pid=x syscall=1`)); ok {
		t.Error("a record without a pid parsed")
	}
	if rec.Auid != unsetAuid {
		t.Errorf("auid of a record without one: %d", rec.Auid)
	}
	if rec, _ := ParseSeccomp([]byte(`audit(1:2): auid=28919 uid=0 pid=28921 syscall=321 code=0x50000`)); rec.Auid != 28919 {
		t.Errorf("auid %d, want 28919", rec.Auid)
	}
}

// byAuid attributes by audit login uid only, as for a process gone
// before its record was read.
type byAuid map[uint32]string

func (byAuid) SandboxOfPid(int) (string, int, bool) { return "", 0, false }
func (m byAuid) AuditSandbox(a uint32) (string, bool) {
	id, ok := m[a]
	return id, ok
}

// TestGoneProcessAttributedByAuid: a record whose process is gone is
// still its sandbox's event when the attributor knows the login uid.
func TestGoneProcessAttributedByAuid(t *testing.T) {
	s := &Source{Attributor: byAuid{28919: "sb-1"}}
	e, ok := s.event([]byte(`audit(1:2): auid=28919 uid=0 pid=28921 comm="attack" exe="/bin/attack" arch=c000003e syscall=321 code=0x50000`))
	if !ok || e.Sandbox != "sb-1" || e.Process != "" {
		t.Fatalf("event %+v ok %v, want sandbox sb-1 with no process", e, ok)
	}
	if _, ok := s.event([]byte(`audit(1:2): auid=4294967295 pid=28921 syscall=321 code=0x50000`)); ok {
		t.Error("a record without a login uid was attributed")
	}
}

// helperEnv makes the test binary the denied process: it installs a
// seccomp filter with SECCOMP_FILTER_FLAG_LOG that refuses acct(2) with
// EPERM, calls it, and waits for its stdin to close.
const helperEnv = "WARREN_KAUDIT_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		denyAcct()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func denyAcct() {
	runtime.LockOSThread() // the filter binds this thread only
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_ACCT},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_LOG, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		panic(e)
	}
	_, _, e := unix.Syscall(unix.SYS_ACCT, 0, 0, 0)
	os.Stdout.WriteString(e.Error() + "\n")
	var b [1]byte
	os.Stdin.Read(b[:])
}

type pidMap struct {
	mu   sync.Mutex
	pids map[int]string
}

func (p *pidMap) SandboxOfPid(pid int) (string, int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.pids[pid]
	return id, 7, ok
}

type recorder struct {
	mu  sync.Mutex
	evs []events.Event
}

func (r *recorder) Record(e events.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

func (r *recorder) list() []events.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]events.Event(nil), r.evs...)
}

// TestSeccompDenialBecomesEvent: a system call a logging seccomp filter
// refuses becomes a seccomp event of the sandbox its pid belongs to,
// with the syscall and the action; a process of no sandbox gives none.
func TestSeccompDenialBecomesEvent(t *testing.T) {
	testutil.RequireRoot(t)
	attr := &pidMap{pids: map[int]string{}}
	src, err := Open(attr)
	if err != nil {
		t.Skipf("no audit multicast here: %v", err)
	}
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, rec) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	run := func(sandbox string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=1")
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Wait()
		defer in.Close()
		if sandbox != "" {
			attr.mu.Lock()
			attr.pids[cmd.Process.Pid] = sandbox
			attr.mu.Unlock()
		}
		b := make([]byte, 64)
		n, _ := out.Read(b)
		// Attribution happens while the process lives: wait for it.
		deadline := time.Now().Add(5 * time.Second)
		for sandbox != "" && len(rec.list()) == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		return strings.TrimSpace(string(b[:n]))
	}
	if got := run("sb1"); got != "operation not permitted" {
		t.Fatalf("acct under the filter: %q", got)
	}
	evs := rec.list()
	if len(evs) != 1 || evs[0].Sandbox != "sb1" || evs[0].Kind != events.Seccomp || evs[0].Process != "pid 7" ||
		!strings.Contains(evs[0].Detail, "system call "+strconv.Itoa(unix.SYS_ACCT)+" ") || !strings.Contains(evs[0].Detail, "refused with") {
		t.Fatalf("events: %+v", evs)
	}
	before := src.Unattributed.Load()
	run("")
	deadline := time.Now().Add(5 * time.Second)
	for src.Unattributed.Load() == before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(rec.list()) != 1 || src.Unattributed.Load() == before {
		t.Errorf("a process of no sandbox: events %+v, unattributed %d", rec.list(), src.Unattributed.Load())
	}
}

// The kernel gives audit messages their unpadded length.
func TestAuditMessageUnpadded(t *testing.T) {
	text := "audit(1:2): pid=5 syscall=1"
	b := make([]byte, unix.NLMSG_HDRLEN+len(text))
	h := (*unix.NlMsghdr)(unsafe.Pointer(&b[0]))
	h.Len, h.Type = uint32(len(b)), unix.AUDIT_SECCOMP
	copy(b[unix.NLMSG_HDRLEN:], text)
	typ, data, ok := auditMessage(b)
	if !ok || typ != unix.AUDIT_SECCOMP || string(data) != text {
		t.Fatalf("%d %q %v", typ, data, ok)
	}
	if _, _, ok := auditMessage(b[:10]); ok {
		t.Error("a short datagram parsed")
	}
}

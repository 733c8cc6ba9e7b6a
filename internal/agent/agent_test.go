package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/agentbin"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// agentBin is the standalone agent (internal/agentbin) that the container
// backend execs as each sandbox's PID 1, written out by TestMain: the only
// build of the agent there is.
var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "warren-agent-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "standalone")
	code := 1
	if err := os.WriteFile(agentBin, agentbin.Binary(), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

type testAgent struct {
	cmd    *exec.Cmd
	pid    int
	sock   string
	client *Client
}

// startAgent runs the agent binary on a fresh listening socket, the way a
// backend does: the socket is inherited as fd 3 and named by EnvFD.
func startAgent(t *testing.T, attr *syscall.SysProcAttr) *testAgent {
	t.Helper()
	return startAgentArgv(t, attr, agentBin)
}

// startAgentArgv starts the agent through argv, which must exec agentBin
// in the same process (a shell that sets up signals first, say).
func startAgentArgv(t *testing.T, attr *syscall.SysProcAttr, argv ...string) *testAgent {
	t.Helper()
	dir, err := os.MkdirTemp("", "wa") // unix socket paths must be short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	l.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{EnvFD + "=3"}
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &testAgent{cmd: cmd, pid: cmd.Process.Pid, sock: sock, client: NewClient(sock)}
	t.Cleanup(func() {
		// Kill whatever a failed test left running, then the agent.
		for _, c := range children(a.pid) {
			syscall.Kill(-c.pid, syscall.SIGKILL)
			syscall.Kill(c.pid, syscall.SIGKILL)
		}
		cmd.Process.Kill()
		cmd.Wait()
	})
	// The reply proves the constructor took over the process.
	if _, err := a.client.Ping(ctx(t)); err != nil {
		t.Fatal(err)
	}
	return a
}

type procInfo struct {
	pid   int
	state byte
	comm  string
}

// children lists the processes whose parent is pid.
func children(pid int) []procInfo {
	ents, _ := os.ReadDir("/proc")
	var out []procInfo
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may contain spaces and parens.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			out = append(out, procInfo{pid: p, state: f[0][0], comm: s[strings.IndexByte(s, '(')+1 : i]})
		}
	}
	return out
}

// agentFDs lists the agent's open fds and what they are.
func agentFDs(pid int) []string {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	var out []string
	for _, e := range ents {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		out = append(out, e.Name()+"->"+target)
	}
	return out
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return f[0] != "Z" && f[0] != "X"
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still exists", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

type result struct {
	stdout, stderr string
	status         backend.ExitStatus
}

// run starts spec, feeds stdin, collects both streams and waits.
func run(t *testing.T, c *Client, spec backend.ProcSpec, stdin string) result {
	t.Helper()
	p, err := c.Start(ctx(t), spec)
	if err != nil {
		t.Fatalf("Start(%q): %v", spec.Argv, err)
	}
	defer p.Close()
	var res result
	var wg sync.WaitGroup
	read := func(r io.Reader, dst *string) {
		defer wg.Done()
		b, _ := io.ReadAll(r)
		*dst = string(b)
	}
	if spec.Stdout {
		wg.Add(1)
		go read(p.Stdout(), &res.stdout)
	}
	if spec.Stderr {
		wg.Add(1)
		go read(p.Stderr(), &res.stderr)
	}
	if spec.Stdin {
		if _, err := io.WriteString(p.Stdin(), stdin); err != nil {
			t.Errorf("write stdin: %v", err)
		}
		p.Stdin().Close()
	}
	wg.Wait()
	res.status, err = p.Wait()
	if err != nil {
		t.Fatalf("Wait(%q): %v", spec.Argv, err)
	}
	return res
}

func sh(script string) backend.ProcSpec {
	return backend.ProcSpec{Argv: []string{"sh", "-c", script}, Stdout: true, Stderr: true}
}

func TestExitCodes(t *testing.T) {
	a := startAgent(t, nil)
	for _, tc := range []struct {
		argv []string
		code int
	}{
		{[]string{"true"}, 0},
		{[]string{"false"}, 1},
		{[]string{"/bin/sh", "-c", "exit 42"}, 42},
	} {
		res := run(t, a.client, backend.ProcSpec{Argv: tc.argv}, "")
		if res.status != (backend.ExitStatus{Code: tc.code}) {
			t.Errorf("%q: status %+v, want code %d", tc.argv, res.status, tc.code)
		}
	}
}

func TestStreams(t *testing.T) {
	a := startAgent(t, nil)
	res := run(t, a.client, sh("echo out; echo err >&2; echo out2"), "")
	if res.stdout != "out\nout2\n" || res.stderr != "err\n" {
		t.Errorf("stdout %q stderr %q", res.stdout, res.stderr)
	}

	spec := backend.ProcSpec{Argv: []string{"cat"}, Stdin: true, Stdout: true}
	in := strings.Repeat("hello, sandbox\n", 10000) // more than a pipe buffer
	if res := run(t, a.client, spec, in); res.stdout != in {
		t.Errorf("cat returned %d bytes, want %d", len(res.stdout), len(in))
	}

	// Streams not asked for are nil interfaces, and /dev/null inside.
	p, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Stdin() != nil || p.Stdout() != nil || p.Stderr() != nil {
		t.Error("unrequested streams are not nil")
	}
	p.Wait()
}

func TestEnvAndCwd(t *testing.T) {
	a := startAgent(t, nil)
	spec := sh(`echo "$FOO"; pwd; echo "$PATH"`)
	spec.Env = []string{"FOO=bar baz", "PATH=/usr/bin:/bin"}
	spec.Cwd = "/tmp"
	if res := run(t, a.client, spec, ""); res.stdout != "bar baz\n/tmp\n/usr/bin:/bin\n" {
		t.Errorf("got %q", res.stdout)
	}
	// Empty cwd is "/"; the environment is exactly the request's.
	spec = sh(`pwd; env | grep -v '^PWD=' | wc -l`)
	spec.Env = []string{"ONLY=1"}
	if res := run(t, a.client, spec, ""); strings.Fields(res.stdout)[0] != "/" || strings.Fields(res.stdout)[1] != "1" {
		t.Errorf("got %q", res.stdout)
	}
}

func TestUIDGID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	a := startAgent(t, nil)
	spec := sh("id -u; id -g; id -G")
	spec.UID, spec.GID = 65534, 65534
	if res := run(t, a.client, spec, ""); res.stdout != "65534\n65534\n65534\n" {
		t.Errorf("got %q (stderr %q)", res.stdout, res.stderr)
	}
	// A directory only root may enter is checked as the target user.
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	spec = backend.ProcSpec{Argv: []string{"true"}, Cwd: dir, UID: 65534, GID: 65534}
	_, err := a.client.Start(ctx(t), spec)
	if errdefs.CategoryOf(err) != errdefs.Invalid || !errors.Is(err, syscall.EACCES) {
		t.Errorf("chdir as nobody into a 0700 dir: %v", err)
	}
}

func TestStartErrors(t *testing.T) {
	a := startAgent(t, nil)
	for _, tc := range []struct {
		spec backend.ProcSpec
		cat  errdefs.Category
		msg  string
	}{
		{backend.ProcSpec{Argv: []string{"no-such-command-xyz"}}, errdefs.NotFound, "executable file not found: no-such-command-xyz"},
		{backend.ProcSpec{Argv: []string{"/no/such/file"}}, errdefs.NotFound, "executable file not found"},
		{backend.ProcSpec{Argv: []string{"/etc/passwd"}}, errdefs.Invalid, "cannot execute"},
		{backend.ProcSpec{Argv: []string{"/"}}, errdefs.Invalid, "cannot execute"},
		{backend.ProcSpec{Argv: []string{"true"}, Cwd: "/no/such/dir"}, errdefs.Invalid, `working directory "/no/such/dir" does not exist`},
		{backend.ProcSpec{Argv: []string{"true"}, Cwd: "/etc/passwd"}, errdefs.Invalid, "does not exist"},
		{backend.ProcSpec{Argv: []string{"true"}, Env: []string{"PATH=/nonexistent"}}, errdefs.NotFound, "executable file not found"},
		{backend.ProcSpec{}, errdefs.Invalid, "empty command"},
		{backend.ProcSpec{Argv: []string{"true", "a\x00b"}}, errdefs.Invalid, "NUL"},
	} {
		p, err := a.client.Start(ctx(t), tc.spec)
		if err == nil {
			p.Close()
			t.Errorf("%q: started", tc.spec.Argv)
			continue
		}
		if errdefs.CategoryOf(err) != tc.cat || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%q cwd %q: got %v (%v), want %v containing %q", tc.spec.Argv, tc.spec.Cwd, err, errdefs.CategoryOf(err), tc.cat, tc.msg)
		}
	}
	// The failed starts left nothing behind.
	waitNoChildren(t, a.pid)
}

// waitNoChildren waits until the agent has no child processes at all, so
// every exited process, and every orphan handed to it, has been reaped.
func waitNoChildren(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		kids := children(pid)
		if len(kids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent still has children: %+v", kids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startWithGrandchild runs a shell that forks a long sleep into its
// process group and prints its pid.
func startWithGrandchild(t *testing.T, c *Client) (backend.Process, int) {
	t.Helper()
	p, err := c.Start(ctx(t), backend.ProcSpec{Argv: []string{"sh", "-c", "sleep 100 & echo $!; wait"}, Stdout: true})
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(p.Stdout()).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	gpid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	return p, gpid
}

func TestSignal(t *testing.T) {
	a := startAgent(t, nil)

	t.Run("single", func(t *testing.T) {
		p, gpid := startWithGrandchild(t, a.client)
		defer p.Close()
		if err := p.Signal(syscall.SIGKILL, false); err != nil {
			t.Fatal(err)
		}
		st, err := p.Wait()
		if err != nil || st != (backend.ExitStatus{Code: -1, Signal: syscall.SIGKILL}) {
			t.Fatalf("Wait: %+v, %v", st, err)
		}
		if st2, err2 := p.Wait(); st2 != st || err2 != nil {
			t.Errorf("second Wait: %+v, %v", st2, err2)
		}
		if !alive(gpid) {
			t.Error("signalling the process alone killed its group")
		}
		if err := p.Signal(syscall.SIGTERM, false); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("Signal after exit: %v", err)
		}
		syscall.Kill(gpid, syscall.SIGKILL)
		waitGone(t, gpid) // the agent, as subreaper, reaps the orphan
	})

	t.Run("group", func(t *testing.T) {
		p, gpid := startWithGrandchild(t, a.client)
		defer p.Close()
		// Wait concurrently with Signal.
		done := make(chan backend.ExitStatus)
		go func() {
			st, err := p.Wait()
			if err != nil {
				t.Error(err)
			}
			done <- st
		}()
		time.Sleep(20 * time.Millisecond)
		if err := p.Signal(syscall.SIGTERM, true); err != nil {
			t.Fatal(err)
		}
		if st := <-done; st != (backend.ExitStatus{Code: -1, Signal: syscall.SIGTERM}) {
			t.Errorf("status %+v", st)
		}
		waitGone(t, gpid)
	})
}

func TestCloseKillsProcessGroup(t *testing.T) {
	a := startAgent(t, nil)
	p, gpid := startWithGrandchild(t, a.client)
	pid := p.Pid()
	if !alive(pid) || !alive(gpid) {
		t.Fatal("not running")
	}
	p.Close()
	waitGone(t, pid)
	waitGone(t, gpid)
	if _, err := p.Wait(); err == nil {
		t.Error("Wait after Close succeeded")
	}
	if err := p.Signal(syscall.SIGTERM, false); err == nil {
		t.Error("Signal after Close succeeded")
	}

	// Cancelling the context during Start also kills.
	c, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-c.Done()
	if _, err := a.client.Start(c, backend.ProcSpec{Argv: []string{"sleep", "100"}}); errdefs.CategoryOf(err) != errdefs.DeadlineExceeded {
		t.Errorf("Start with expired context: %v", err)
	}
	waitNoChildren(t, a.pid)
}

func TestReapsOrphans(t *testing.T) {
	a := startAgent(t, nil)
	for i := 0; i < 20; i++ {
		// The shell exits at once; its children become the agent's.
		res := run(t, a.client, backend.ProcSpec{Argv: []string{"sh", "-c", "(sleep 0.3; true) & sleep 0.2 & exit 0"}}, "")
		if res.status.Code != 0 {
			t.Fatalf("status %+v", res.status)
		}
	}
	if kids := children(a.pid); len(kids) == 0 {
		t.Error("orphans were not reparented to the agent")
	}
	waitNoChildren(t, a.pid) // no <defunct> entries either
	if info, err := a.client.Ping(ctx(t)); err != nil || info.Running != 0 {
		t.Errorf("Ping: %+v, %v", info, err)
	}
}

func TestConcurrentStarts(t *testing.T) {
	a := startAgent(t, nil)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"echo", strconv.Itoa(i)}, Stdout: true})
			if err != nil {
				errs <- err
				return
			}
			defer p.Close()
			out, _ := io.ReadAll(p.Stdout())
			st, err := p.Wait()
			if err != nil || st.Code != 0 || string(out) != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("%d: out %q status %+v err %v", i, out, st, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitNoChildren(t, a.pid)
}

func TestLargeEnv(t *testing.T) {
	a := startAgent(t, nil)
	spec := sh(`printf %s "$V99" | wc -c; env | grep -c '^V'`)
	val := strings.Repeat("x", 2000)
	for i := 0; i < 100; i++ {
		spec.Env = append(spec.Env, fmt.Sprintf("V%d=%s", i, val))
	}
	spec.Env = append(spec.Env, "PATH=/usr/bin:/bin")
	res := run(t, a.client, spec, "")
	if f := strings.Fields(res.stdout); len(f) != 2 || f[0] != "2000" || f[1] != "100" {
		t.Errorf("got %q, stderr %q", res.stdout, res.stderr)
	}

	// Past the kernel's limit, exec fails cleanly.
	spec.Env = []string{"BIG=" + strings.Repeat("x", 200<<10)}
	if _, err := a.client.Start(ctx(t), spec); errdefs.CategoryOf(err) != errdefs.Invalid || !errors.Is(err, syscall.E2BIG) {
		t.Errorf("oversized env var: %v", err)
	}
	// A frame of several MiB goes out in parts, fds first; exec refuses it.
	spec.Env = nil
	for i := 0; i < 3000; i++ {
		spec.Env = append(spec.Env, fmt.Sprintf("W%d=%s", i, strings.Repeat("y", 1000)))
	}
	spec.Stdin = true
	if _, err := a.client.Start(ctx(t), spec); !errors.Is(err, syscall.E2BIG) {
		t.Errorf("3 MB env: %v", err)
	}
	// Past the protocol's limit, the client refuses.
	spec.Env = []string{"BIG=" + strings.Repeat("x", 5<<20)}
	if _, err := a.client.Start(ctx(t), spec); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Errorf("oversized frame: %v", err)
	}
}

func TestPing(t *testing.T) {
	a := startAgent(t, nil)
	info, err := a.client.Ping(ctx(t))
	if err != nil || info != (Info{Version: ProtocolVersion, Running: 0}) {
		t.Fatalf("Ping: %+v, %v", info, err)
	}
	p, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := a.client.Ping(ctx(t)); info.Running != 1 {
		t.Errorf("running %d, want 1", info.Running)
	}
	p.Close()
	waitGone(t, p.Pid())
	if info, _ := a.client.Ping(ctx(t)); info.Running != 0 {
		t.Errorf("running %d after close, want 0", info.Running)
	}
}

func TestFDHygiene(t *testing.T) {
	a := startAgent(t, nil)
	// Another live process gives the agent more fds that must not leak.
	other, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"sleep", "100"}, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	res := run(t, a.client, backend.ProcSpec{Argv: []string{"ls", "-l", "/proc/self/fd"}, Stdout: true}, "")
	re := regexp.MustCompile(`(\d+) -> (.*)`)
	fds := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(res.stdout, -1) {
		fds[m[1]] = m[2]
	}
	if fds["0"] != "/dev/null" || !strings.HasPrefix(fds["1"], "pipe:") || fds["2"] != "/dev/null" {
		t.Errorf("standard fds: %v", fds)
	}
	for fd, target := range fds {
		// ls itself holds the directory it lists open.
		if fd != "0" && fd != "1" && fd != "2" && !regexp.MustCompile(`^/proc/\d+/fd$`).MatchString(target) {
			t.Errorf("leaked fd %s -> %s", fd, target)
		}
	}
	if len(fds) > 4 {
		t.Errorf("fds: %v", fds)
	}

	// The agent itself holds only its stdio, listener, signalfd, epoll
	// fd and one socket per connection.
	t.Logf("agent fds: %v", agentFDs(a.pid))
}

func TestAgentIdentity(t *testing.T) {
	// Started with signals ignored, as under nohup: programs must not
	// inherit that.
	a := startAgentArgv(t, nil, "/bin/sh", "-c", `trap "" HUP PIPE USR1; exec "$0"`, agentBin)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "Name:\twarren-init\n") {
		t.Error("agent is not named warren-init")
	}
	if strings.Contains(string(status), "SigBlk:\t0000000000000000") {
		t.Error("agent does not block signals")
	}
	// The program starts with an empty signal mask and no ignored signals,
	// and cannot open the non-dumpable agent's fds as another user.
	spec := sh(fmt.Sprintf("grep -E '^Sig(Blk|Ign)' /proc/self/status; ls /proc/%d/fd >/dev/null 2>&1 && echo open || echo denied", a.pid))
	spec.UID, spec.GID = 65534, 65534
	res := run(t, a.client, spec, "")
	if !strings.Contains(res.stdout, "SigBlk:\t0000000000000000") || !strings.Contains(res.stdout, "SigIgn:\t0000000000000000") {
		t.Errorf("child signal state: %q", res.stdout)
	}
	if os.Getuid() == 0 && !strings.HasSuffix(res.stdout, "denied\n") {
		t.Errorf("agent fds readable: %q", res.stdout)
	}
}

func TestAgentRSS(t *testing.T) {
	a := startAgent(t, nil)
	const n = 1000
	start := time.Now()
	for i := 0; i < n; i++ {
		p, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := p.Wait(); err != nil || st.Code != 0 {
			t.Fatalf("status %+v, %v", st, err)
		}
		p.Close()
	}
	elapsed := time.Since(start)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.pid))
	if err != nil {
		t.Fatal(err)
	}
	kb := map[string]int{}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			kb[k], _ = strconv.Atoi(f[0])
		}
	}
	t.Logf("agent after %d execs: VmRSS %d KiB (anon %d, file %d), VmHWM %d KiB; %v per start+wait round trip",
		n, kb["VmRSS"], kb["RssAnon"], kb["RssFile"], kb["VmHWM"], elapsed/n)
	if kb["VmRSS"] == 0 || kb["VmRSS"] >= 2048 {
		t.Errorf("agent VmRSS %d KiB, want < 2 MiB", kb["VmRSS"])
	}
	// No connection left open: the listener is the only socket.
	deadline := time.Now().Add(2 * time.Second)
	for {
		sockets := 0
		fds := agentFDs(a.pid)
		for _, fd := range fds {
			if strings.Contains(fd, "socket:") {
				sockets++
			}
		}
		if sockets <= 1 { // the listener
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("agent holds fds %v after %d execs", fds, n)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestUnavailable(t *testing.T) {
	_, err := NewClient("/nonexistent/agent.sock").Ping(ctx(t))
	if errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "not reachable") {
		t.Errorf("missing socket: %v", err)
	}

	// A socket file nobody listens on: connection refused.
	dir, _ := os.MkdirTemp("", "wa")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := NewClient(sock).Start(ctx(t), backend.ProcSpec{Argv: []string{"true"}}); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Errorf("refused: %v", err)
	}

	// The agent dies while a process runs.
	a := startAgent(t, nil)
	p, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a.cmd.Process.Kill()
	a.cmd.Wait()
	if _, err := p.Wait(); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Errorf("Wait after agent death: %v", err)
	}
	syscall.Kill(p.Pid(), syscall.SIGKILL) // not PID 1 here, so it survived
}

func TestProtocolErrors(t *testing.T) {
	a := startAgent(t, nil)
	exchange := func(name string, frames ...[]byte) (byte, int32, string) {
		t.Helper()
		conn, err := net.Dial("unix", a.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for _, f := range frames {
			conn.Write(f)
		}
		typ, body, err := readFrame(conn)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if _, _, err := readFrame(conn); err != io.EOF {
			t.Errorf("%s: connection not closed after failure: %v", name, err)
		}
		if len(body) < 5 {
			return typ, 0, ""
		}
		return typ, int32(binary.LittleEndian.Uint32(body)), strings.TrimRight(string(body[4:]), "\x00")
	}
	huge := make([]byte, 5)
	binary.LittleEndian.PutUint32(huge, 4<<20+1)
	huge[4] = 'E'
	bad, _ := encodeExec(1, backend.ProcSpec{Argv: []string{"true"}}) // stdin flag without an fd
	for name, frames := range map[string][][]byte{
		"oversized":      {huge},
		"unknown type":   {frame('Z', nil)},
		"signal first":   {frame(frameSignal, []byte{15, 0, 0, 0, 0})},
		"missing fd":     {frame(frameExec, bad)},
		"short exec":     {frame(frameExec, []byte{0, 0, 0})},
		"ping with body": {frame(framePing, []byte{1})},
	} {
		if typ, errno, step := exchange(name, frames...); typ != frameFailed || syscall.Errno(errno) != syscall.EINVAL || step != "proto" {
			t.Errorf("%s: got %q %v %q", name, typ, syscall.Errno(errno), step)
		}
	}
	// The agent is still fine.
	if _, err := a.client.Ping(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestAsPID1(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	a := startAgent(t, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID})
	res := run(t, a.client, sh("echo $PPID; (sleep 0.05 &) ; exit 3"), "")
	if res.stdout != "1\n" || res.status.Code != 3 {
		t.Errorf("got %q %+v", res.stdout, res.status)
	}
	waitNoChildren(t, a.pid)
	// Killing PID 1 takes the whole sandbox down.
	p, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	kids := children(a.pid)
	if len(kids) != 1 {
		t.Fatalf("children %+v", kids)
	}
	a.cmd.Process.Kill()
	a.cmd.Wait()
	waitGone(t, kids[0].pid)
}

// TestNoVDSO: the idle agent unmaps the vDSO (its page tables are memory
// every sandbox pays for); the processes it starts get their own.
func TestNoVDSO(t *testing.T) {
	a := startAgent(t, nil)
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", a.pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(maps), "[vdso]") || strings.Contains(string(maps), "[vvar]") {
		t.Errorf("agent still maps the vDSO:\n%s", maps)
	}
	res := run(t, a.client, sh(`grep -c '\[vdso\]' /proc/self/maps; date +%s`), "")
	if f := strings.Fields(res.stdout); len(f) != 2 || f[0] != "1" {
		t.Errorf("child: %q, stderr %q", res.stdout, res.stderr)
	}
}

// TestStandaloneLayout: the standalone agent runs on a stack in its own
// .bss with the heap right after it, so that after serving requests its
// whole address space sits in one 2 MiB page-table page, and the kernel
// still reports its command line.
func TestStandaloneLayout(t *testing.T) {
	a := startAgent(t, nil)
	for i := 0; i < 20; i++ {
		res := run(t, a.client, sh(`echo ok`), "")
		if res.stdout != "ok\n" {
			t.Fatalf("exec %d: %+v", i, res)
		}
	}
	// A burst: many connection records at once, and payloads of all sizes.
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"/bin/sh", "-c", "echo ${#X}"},
				Env: []string{"X=" + strings.Repeat("x", i*1000)}, Stdout: true})
			if err != nil {
				t.Errorf("exec %d: %v", i, err)
				return
			}
			defer p.Close()
			out, _ := io.ReadAll(p.Stdout())
			if st, err := p.Wait(); err != nil || st.Code != 0 || string(out) != strconv.Itoa(i*1000)+"\n" {
				t.Errorf("exec %d: out %q status %+v err %v", i, out, st, err)
			}
		}()
	}
	wg.Wait()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", a.pid))
	if err != nil {
		t.Fatal(err)
	}
	var lo, hi uint64 = ^uint64(0), 0
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		if strings.HasSuffix(line, "[vsyscall]") {
			continue // a fixed kernel page, not in the process's page tables
		}
		var s, e uint64
		if _, err := fmt.Sscanf(line, "%x-%x", &s, &e); err != nil {
			t.Fatalf("maps line %q: %v", line, err)
		}
		lo, hi = min(lo, s), max(hi, e)
	}
	if lo>>21 != (hi-1)>>21 {
		t.Errorf("mappings span %#x-%#x, more than one 2 MiB page-table page:\n%s", lo, hi, maps)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", a.pid))
	if err != nil || string(cmdline) != "warren-init\x00" {
		t.Errorf("cmdline %q, %v; want \"warren-init\\x00\"", cmdline, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmPTE:"); ok {
			if kb, _ := strconv.Atoi(strings.Fields(v)[0]); kb > 12 {
				t.Errorf("VmPTE %d KiB, want <= 12 (one page per level)", kb)
			}
		}
	}
}

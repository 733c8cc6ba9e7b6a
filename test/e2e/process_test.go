package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// attachAll follows a process from the offsets until its exit and returns
// its stdout and the offset of the first stdout chunk.
func attachAll(ctx context.Context, t *testing.T, e *env, id, proc string, off int64) (string, int64, *warrenv1.ExecResult) {
	var out bytes.Buffer
	first := int64(-1)
	res, err := e.c.AttachProcess(ctx, &warrenv1.AttachProcessRequest{SandboxId: id, ProcessId: proc, StdoutOffset: off, StderrOffset: -1}, func(ev *warrenv1.ProcessEvent) error {
		if c := ev.GetStdout(); c != nil {
			if first < 0 {
				first = c.GetOffset()
			}
			out.Write(c.GetData())
		}
		return nil
	})
	if err != nil {
		t.Errorf("attach %s from %d: %v", proc, off, err)
	}
	return out.String(), first, res
}

// TestBackgroundProcessesSurviveDaemonKill9: background processes keep
// running while the daemon is dead (kill -9), the agent keeps draining
// their output, and the restarted daemon lists, waits, signals, writes
// stdin to and attaches them; the output is complete up to the cap, and
// two clients attached from different offsets get exactly their bytes.
func TestBackgroundProcessesSurviveDaemonKill9(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	id := e.create(&warrenv1.CreateRequest{}).Id
	// p-1 writes 40 lines over 2 s, mostly while the daemon is dead, then
	// waits for a line of input.
	ticker := `i=0; while [ $i -lt 40 ]; do echo line $i; i=$((i+1)); sleep 0.05; done; read x; echo got $x`
	// p-2 writes 3 MB in a burst against a 1 MiB cap: without a drain in
	// the agent it would block on a full pipe once the daemon is gone.
	flood := `sleep 0.5; head -c 3000000 /dev/zero | tr '\0' a; echo END`
	for _, sh := range []string{ticker, flood, "sleep 1000"} {
		if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: sh}); err != nil {
			t.Fatal(err)
		}
	}
	e.kill9()
	time.Sleep(3 * time.Second)
	e.start()

	ps, err := e.c.ListProcesses(ctx, id)
	if err != nil || len(ps) != 3 {
		t.Fatalf("processes after restart: %v %v", ps, err)
	}
	if !ps[0].GetRunning() || ps[1].GetRunning() || !ps[2].GetRunning() || ps[0].GetStdoutBytes() == 0 {
		t.Fatalf("states after restart: %v", ps)
	}
	var want strings.Builder
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	want.WriteString("got x\n")

	// Two clients at once, from the start and from offset 100.
	var wg sync.WaitGroup
	var fromStart, fromLater string
	var laterFirst int64
	wg.Add(2)
	go func() { defer wg.Done(); fromStart, _, _ = attachAll(ctx, t, e, id, "p-1", 0) }()
	go func() { defer wg.Done(); fromLater, laterFirst, _ = attachAll(ctx, t, e, id, "p-1", 100) }()
	time.Sleep(300 * time.Millisecond) // both attached and caught up (the test passes either way)
	if err := e.c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: "p-1", Data: []byte("x\n")}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if fromStart != want.String() || fromLater != want.String()[100:] || laterFirst != 100 {
		t.Fatalf("attached from 0: %q\nfrom 100 (first chunk at %d): %q", fromStart, laterFirst, fromLater)
	}
	res, err := e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: "p-1"})
	if err != nil || string(res.GetStdout()) != want.String() || res.GetExitCode() != 0 {
		t.Fatalf("wait p-1: %v %v", res, err)
	}
	res, err = e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: "p-2"})
	if err != nil || len(res.GetStdout()) != 1<<20 || !bytes.HasSuffix(res.GetStdout(), []byte("aaaEND\n")) ||
		!res.GetStdoutTruncated() || res.GetStdoutDroppedBytes() != 3000004-1<<20 {
		t.Fatalf("wait p-2: %d bytes, truncated %v, dropped %d, %v", len(res.GetStdout()), res.GetStdoutTruncated(), res.GetStdoutDroppedBytes(), err)
	}
	if err := e.c.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: id, ProcessId: "p-3", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	res, err = e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: "p-3"})
	if err != nil || res.GetSignal() != 9 {
		t.Fatalf("wait p-3: %v %v", res, err)
	}
	// A second restart, the processes all exited: still listed, with output.
	e.kill9()
	e.start()
	res, err = e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: "p-1"})
	if err != nil || string(res.GetStdout()) != want.String() {
		t.Fatalf("wait p-1 after a second restart: %v %v", res, err)
	}
}

// TestPTYProcess: a pty process reports the size it was started with,
// a resize reaches it, and an interactive shell session runs to its exit.
func TestPTYProcess(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	id := e.create(&warrenv1.CreateRequest{}).Id
	p, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "stty size; [ -t 0 ] && [ -t 1 ] && echo tty", Pty: true, Rows: 33, Cols: 101})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: p.GetProcessId()})
	if err != nil || string(res.GetStdout()) != "33 101\r\ntty\r\n" {
		t.Fatalf("stty size: %q %v", res.GetStdout(), err)
	}

	p, err = e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"sh", "-i"}, Pty: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.ResizeProcess(ctx, &warrenv1.ResizeProcessRequest{SandboxId: id, ProcessId: p.GetProcessId(), Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: p.GetProcessId(), Data: []byte("stty size; echo h''i; exit 5\n")}); err != nil {
		t.Fatal(err)
	}
	out, _, exit := attachAll(ctx, t, e, id, p.GetProcessId(), 0)
	if !strings.Contains(out, "40 120\r\n") || !strings.Contains(out, "\r\nhi\r\n") || exit.GetExitCode() != 5 {
		t.Fatalf("interactive session: %q, exit %v", out, exit)
	}
	err = e.c.ResizeProcess(ctx, &warrenv1.ResizeProcessRequest{SandboxId: id, ProcessId: p.GetProcessId(), Rows: 1, Cols: 1})
	wantCategory(t, err, client.CategoryConflict, "resize after exit")
	// Exec runs on a pty too, its stdin typed into the terminal.
	res, err = e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "stty size; [ -t 2 ] && read x && echo got $x", Pty: true, Rows: 12, Cols: 34, Stdin: []byte("abc\n")})
	if err != nil || !strings.Contains(string(res.GetStdout()), "12 34\r\n") || !strings.Contains(string(res.GetStdout()), "got abc\r\n") || res.GetExitCode() != 0 {
		t.Fatalf("exec on a pty: %q %v %v", res.GetStdout(), res, err)
	}
	_, err = e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"true"}, Rows: 10})
	wantCategory(t, err, client.CategoryInvalid, "rows without pty")
}

// TestCLIProcesses: exec --background, ps, attach (-i, and a pty
// session) and kill through the real binary.
func TestCLIProcesses(t *testing.T) {
	e := newEnv(t, envOptions{})
	id := e.create(&warrenv1.CreateRequest{}).Id
	out, stderr, code := e.cli(nil, "sandbox", "exec", "--background", id, "--", "sh", "-c", "echo hello; read x; echo got $x; exit 2")
	if code != 0 || out != "p-1\n" {
		t.Fatalf("exec --background: %q %q %d", out, stderr, code)
	}
	out, _, code = e.cli(nil, "sandbox", "ps", id)
	if code != 0 || !strings.Contains(out, "p-1") || !strings.Contains(out, "running") || !strings.Contains(out, "sh -c echo hello") {
		t.Fatalf("ps: %q %d", out, code)
	}
	out, stderr, code = e.cli(strings.NewReader("there\n"), "sandbox", "attach", "-i", id, "p-1")
	if code != 2 || out != "hello\ngot there\n" {
		t.Fatalf("attach -i: %q %q %d", out, stderr, code)
	}
	out, _, _ = e.cli(nil, "sandbox", "exec", "-d", id, "sleep", "1000")
	if out != "p-2\n" {
		t.Fatalf("second process %q", out)
	}
	if _, stderr, code = e.cli(nil, "sandbox", "kill", "-s", "KILL", id, "p-2"); code != 0 {
		t.Fatalf("kill: %q %d", stderr, code)
	}
	if _, _, code = e.cli(nil, "sandbox", "attach", id, "p-2"); code != 128+9 {
		t.Fatalf("attach to the killed process: exit %d", code)
	}
	out, _, _ = e.cli(nil, "sandbox", "exec", "-d", "-t", "--rows", "30", "--cols", "90", id, "sh")
	if out != "p-3\n" {
		t.Fatalf("pty process %q", out)
	}
	out, stderr, code = e.cli(strings.NewReader("stty size; echo h''i; exit 3\n"), "sandbox", "attach", "-i", id, "p-3")
	if code != 3 || !strings.Contains(out, "30 90\r\n") || !strings.Contains(out, "\r\nhi\r\n") {
		t.Fatalf("pty session: %q %q %d", out, stderr, code)
	}
	out, _, code = e.cli(nil, "sandbox", "ps", id)
	if code != 0 || !strings.Contains(out, "exited 2") || !strings.Contains(out, "killed (killed)") || !strings.Contains(out, "exited 3, pty") {
		t.Fatalf("ps at the end: %q", out)
	}
}

// TestCLIAttachTTY: attach -t from a real terminal passes the terminal's
// size to the process's pty and relays raw bytes both ways until the
// shell exits, with the shell's exit status.
func TestCLIAttachTTY(t *testing.T) {
	e := newEnv(t, envOptions{})
	id := e.create(&warrenv1.CreateRequest{}).Id
	if out, _, _ := e.cli(nil, "sandbox", "exec", "-d", "-t", id, "sh"); out != "p-1\n" {
		t.Fatalf("pty process %q", out)
	}
	master, slave := openTerminal(t, 50, 150)
	ctx := ctxFor(t, time.Minute)
	cmd := exec.CommandContext(ctx, e.bin, "--addr", e.addr(), "sandbox", "attach", "-t", id, "p-1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	// The shell reads this once attach has put the terminal in raw mode
	// and passed its size on; until then the tty buffers it.
	time.Sleep(500 * time.Millisecond)
	if _, err := master.Write([]byte("stty size; echo h''i; exit 6\r")); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(master) // EIO once attach exits and the slave closes
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 6 {
		t.Fatalf("attach -t: %v, output %q", err, out)
	}
	if !strings.Contains(string(out), "50 150\r\n") || !strings.Contains(string(out), "\r\nhi\r\n") {
		t.Fatalf("attach -t output %q", out)
	}
}

// TestBackgroundProcessesAcrossRepeatedKills: eight processes writing all
// the time keep running through five daemon kill -9s and restarts in
// quick succession, and each one's output is complete and in order.
func TestBackgroundProcessesAcrossRepeatedKills(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	id := e.create(&warrenv1.CreateRequest{}).Id
	const procs, lines = 8, 150
	var want strings.Builder
	for i := 0; i < lines; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	for i := 0; i < procs; i++ {
		if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo $i; i=$((i+1)); sleep 0.02; done", lines)}); err != nil {
			t.Fatal(err)
		}
	}
	for k := 0; k < 5; k++ {
		e.kill9()
		time.Sleep(200 * time.Millisecond)
		e.start()
		if ps, err := e.c.ListProcesses(ctx, id); err != nil || len(ps) != procs {
			t.Fatalf("after restart %d: %d processes, %v", k+1, len(ps), err)
		}
	}
	for i := 1; i <= procs; i++ {
		res, err := e.c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: fmt.Sprintf("p-%d", i)})
		if err != nil || res.GetExitCode() != 0 || string(res.GetStdout()) != want.String() {
			t.Fatalf("p-%d: exit %d, %d bytes of output (want %d), %v", i, res.GetExitCode(), len(res.GetStdout()), want.Len(), err)
		}
	}
}

// TestPTYExecStreamResize: a foreground ExecStream on a pty announces an
// id first, ResizeProcess with it changes the running command's terminal
// (the new size and a SIGWINCH reach it), and the id goes with the exec.
func TestPTYExecStreamResize(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	id := e.create(&warrenv1.CreateRequest{}).Id
	// Waits for the size to change; the trap shows the SIGWINCH came.
	script := `trap 'echo winch' WINCH; stty size; while [ "$(stty size)" = "24 80" ]; do sleep 0.05; done; sleep 0.2; stty size`
	var (
		proc    string
		out     strings.Builder
		resized bool
	)
	res, err := e.c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: script, Pty: true, TimeoutMs: 30000}, func(ev *warrenv1.ExecEvent) error {
		if s := ev.GetStarted(); s != nil {
			if proc != "" || out.Len() > 0 || s.GetPid() <= 0 {
				t.Errorf("started event %v after %q (id %q)", s, out.String(), proc)
			}
			proc = s.GetProcessId()
			return nil
		}
		out.Write(ev.GetStdout())
		if !resized && strings.Contains(out.String(), "24 80\r\n") {
			resized = true
			return e.c.ResizeProcess(ctx, &warrenv1.ResizeProcessRequest{SandboxId: id, ProcessId: proc, Rows: 50, Cols: 132})
		}
		return nil
	})
	if err != nil || res.GetExitCode() != 0 || res.GetTimedOut() {
		t.Fatalf("exec stream: %v %v (output %q)", res, err, out.String())
	}
	if !strings.HasPrefix(proc, "e-") || !strings.Contains(out.String(), "winch\r\n") || !strings.HasSuffix(out.String(), "50 132\r\n") {
		t.Fatalf("id %q, output %q: want the new size 50 132 after a SIGWINCH", proc, out.String())
	}
	err = e.c.ResizeProcess(ctx, &warrenv1.ResizeProcessRequest{SandboxId: id, ProcessId: proc, Rows: 10, Cols: 10})
	wantCategory(t, err, client.CategoryNotFound, "resize after the exec ended")
	// Without a pty there is nothing to resize: no started event.
	_, err = e.c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"true"}}, func(ev *warrenv1.ExecEvent) error {
		if ev.GetStarted() != nil {
			t.Errorf("started event without a pty: %v", ev)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCLIExecStreamPTYFollowsTerminal: exec --stream -t from a real
// terminal gives the command that terminal's size, and a resize of the
// terminal (SIGWINCH to the CLI) reaches the running command.
func TestCLIExecStreamPTYFollowsTerminal(t *testing.T) {
	e := newEnv(t, envOptions{})
	id := e.create(&warrenv1.CreateRequest{}).Id
	master, slave := openTerminal(t, 50, 150)
	ctx := ctxFor(t, time.Minute)
	// Prints each size it is given (24 80, the default, may be replaced
	// by the terminal's before it looks), until the resized one.
	script := `p=; while :; do s=$(stty size); [ "$s" = "$p" ] || echo "size $s"; p=$s; [ "$s" = "61 161" ] && exit 0; sleep 0.05; done`
	cmd := exec.CommandContext(ctx, e.bin, "--addr", e.addr(), "sandbox", "exec", "--stream", "-t", "--timeout", "30s", id, "--", "sh", "-c", script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// Session leader on the terminal: a resize sends it SIGWINCH.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var (
		out     []byte
		resized bool
		buf     = make([]byte, 4096)
	)
	for {
		k, err := master.Read(buf)
		out = append(out, buf[:k]...)
		if !resized && strings.Contains(string(out), "size 50 150") {
			resized = true
			if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 61, Col: 161}); err != nil {
				t.Fatal(err)
			}
		}
		if err != nil {
			break // EIO once the CLI exits and the slave closes
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exec --stream -t: %v, output %q", err, out)
	}
	if !strings.Contains(string(out), "size 50 150") || !strings.Contains(string(out), "size 61 161") {
		t.Fatalf("exec --stream -t output %q: want the terminal's 50 150, then its resize to 61 161", out)
	}
}

// openTerminal opens a pty pair on the host's devpts sized rows x cols, as
// a user's terminal; both ends are closed when the test ends.
func openTerminal(t *testing.T, rows, cols uint16) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slave.Close() })
	return master, slave
}

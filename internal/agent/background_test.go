package agent

import (
	"bytes"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

func bg(t *testing.T, c *Client, shell string, o backend.BackgroundOpts) int {
	t.Helper()
	if o.OutputCap == 0 {
		o.OutputCap = 1 << 20
	}
	pid, err := c.StartBackground(ctx(t), backend.ProcSpec{Argv: []string{"/bin/sh", "-c", shell}, Env: []string{"PATH=/usr/bin:/bin"}}, o)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// attached is everything one attach saw.
type attached struct {
	stdout, stderr []byte
	firstOut       int64 // offset of the first stdout chunk, -1 if none
	exit           *backend.ExitStatus
}

// follow attaches from the offsets and reads until the exit, or until
// stdout contains until (then it returns, still attached: close is the
// caller's).
func follow(t *testing.T, c *Client, pid int, outOff, errOff int64, until string) (attached, backend.Attachment) {
	t.Helper()
	a, err := c.AttachBackground(ctx(t), pid, outOff, errOff)
	if err != nil {
		t.Fatal(err)
	}
	got := attached{firstOut: -1}
	for {
		o, err := a.Next()
		if err != nil {
			a.Close()
			t.Fatalf("attach: %v (so far %q %q)", err, got.stdout, got.stderr)
		}
		if o.Exit != nil {
			got.exit = o.Exit
			if _, err := a.Next(); err != io.EOF {
				t.Fatalf("after the exit: %v, want EOF", err)
			}
			a.Close()
			return got, nil
		}
		if o.Stderr {
			got.stderr = append(got.stderr, o.Data...)
		} else {
			if got.firstOut < 0 {
				got.firstOut = o.Offset
			}
			got.stdout = append(got.stdout, o.Data...)
		}
		if until != "" && strings.Contains(string(got.stdout), until) {
			return got, a
		}
	}
}

func listed(t *testing.T, c *Client, pid int) backend.BackgroundInfo {
	t.Helper()
	all, err := c.ListBackground(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range all {
		if i.Pid == pid {
			return i
		}
	}
	t.Fatalf("pid %d not listed in %+v", pid, all)
	return backend.BackgroundInfo{}
}

// TestBackgroundOutlivesItsClient: a background process keeps running
// with no connection open, its stdin is reachable by pid, and a later
// attach from offset 0 gets all of both streams and the exit status.
func TestBackgroundOutlivesItsClient(t *testing.T) {
	a := startAgent(t, nil)
	pid := bg(t, a.client, "echo out; echo err >&2; read x; echo got $x; exit 3", backend.BackgroundOpts{Tag: []byte("my tag")})
	time.Sleep(50 * time.Millisecond)
	info := listed(t, a.client, pid)
	if info.Exited || !info.StdinOpen || string(info.Tag) != "my tag" || info.OutputCap != 1<<20 {
		t.Fatalf("listed %+v", info)
	}
	w, err := a.client.OpenStdin(ctx(t), pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	got, _ := follow(t, a.client, pid, 0, 0, "")
	if string(got.stdout) != "out\ngot hi\n" || string(got.stderr) != "err\n" || *got.exit != (backend.ExitStatus{Code: 3}) {
		t.Fatalf("got %q %q %+v", got.stdout, got.stderr, got.exit)
	}
	info = listed(t, a.client, pid)
	if !info.Exited || info.Status.Code != 3 || info.StdinOpen || info.Stdout != (backend.StreamRange{Start: 0, Total: 11}) {
		t.Fatalf("listed after exit %+v", info)
	}
	// Its pid is not reused for signals once it exited.
	err = a.client.SignalBackground(ctx(t), pid, syscall.SIGKILL, false)
	if !(errdefs.CategoryOf(err) == errdefs.Conflict) || !IsDone(err) {
		t.Fatalf("signal after exit: %v", err)
	}
	if _, err := a.client.AttachBackground(ctx(t), 999999, 0, 0); err != nil {
		t.Fatal(err) // the failure comes with the first Next
	}
	if err := a.client.SignalBackground(ctx(t), 999999, syscall.SIGKILL, false); !(errdefs.CategoryOf(err) == errdefs.NotFound) {
		t.Fatalf("unknown pid: %v", err)
	}
}

// TestBackgroundDrainsWithoutClient: with nobody attached the agent keeps
// reading, so a process printing far more than a pipe holds (5 MB against
// a 64 KiB buffer) runs to its end instead of blocking on a full pipe, and
// the buffer keeps the latest bytes, with offsets that say what was lost.
func TestBackgroundDrainsWithoutClient(t *testing.T) {
	a := startAgent(t, nil)
	pid := bg(t, a.client, "head -c 5000000 /dev/zero; echo END", backend.BackgroundOpts{OutputCap: 64 << 10})
	deadline := time.Now().Add(20 * time.Second)
	var info backend.BackgroundInfo
	for info = listed(t, a.client, pid); !info.Exited; info = listed(t, a.client, pid) {
		if time.Now().After(deadline) {
			t.Fatalf("still running: %+v", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if info.Stdout != (backend.StreamRange{Start: 5000004 - 64<<10, Total: 5000004}) {
		t.Fatalf("stdout range %+v", info.Stdout)
	}
	got, _ := follow(t, a.client, pid, 0, 0, "")
	if got.firstOut != info.Stdout.Start || len(got.stdout) != 64<<10 || !bytes.HasSuffix(got.stdout, []byte("\x00END\n")) {
		t.Fatalf("first offset %d, %d bytes, tail %q", got.firstOut, len(got.stdout), got.stdout[len(got.stdout)-8:])
	}
}

// TestBackgroundManyAttachers: clients attached from offset 0 and from a
// later offset at once each get exactly their bytes, live, and a client
// attached with FromEnd gets only the exit.
func TestBackgroundManyAttachers(t *testing.T) {
	a := startAgent(t, nil)
	pid := bg(t, a.client, "printf 0123456789; read x; printf abc; echo e >&2", backend.BackgroundOpts{})
	first, fa := follow(t, a.client, pid, 0, 0, "9")
	later, la := follow(t, a.client, pid, 5, backend.FromEnd, "9")
	waiter, err := a.client.AttachBackground(ctx(t), pid, backend.FromEnd, backend.FromEnd)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	if string(first.stdout) != "0123456789" || string(later.stdout) != "56789" || later.firstOut != 5 {
		t.Fatalf("before input: %q, %q at %d", first.stdout, later.stdout, later.firstOut)
	}
	w, err := a.client.OpenStdin(ctx(t), pid)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("\n"))
	w.Close()
	for _, x := range []struct {
		att  backend.Attachment
		got  *attached
		want string
		werr string
	}{{fa, &first, "0123456789abc", "e\n"}, {la, &later, "56789abc", ""}, {waiter, &attached{}, "", ""}} {
		for {
			o, err := x.att.Next()
			if err != nil {
				t.Fatal(err)
			}
			if o.Exit != nil {
				break
			}
			if o.Stderr {
				x.got.stderr = append(x.got.stderr, o.Data...)
			} else {
				x.got.stdout = append(x.got.stdout, o.Data...)
			}
		}
		x.att.Close()
		if string(x.got.stdout) != x.want || string(x.got.stderr) != x.werr {
			t.Errorf("got %q %q, want %q %q", x.got.stdout, x.got.stderr, x.want, x.werr)
		}
	}
}

// TestBackgroundSignal: signals reach a running background process by
// pid, group signals its children too.
func TestBackgroundSignal(t *testing.T) {
	a := startAgent(t, nil)
	pid := bg(t, a.client, "sleep 1000 & wait", backend.BackgroundOpts{})
	time.Sleep(50 * time.Millisecond)
	if err := a.client.SignalBackground(ctx(t), pid, syscall.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	got, _ := follow(t, a.client, pid, backend.FromEnd, backend.FromEnd, "")
	if got.exit.Signal != syscall.SIGKILL {
		t.Fatalf("exit %+v", got.exit)
	}
	deadline := time.Now().Add(5 * time.Second)
	for kids := children(a.pid); len(kids) != 0; kids = children(a.pid) {
		if time.Now().After(deadline) {
			t.Fatalf("left %+v", kids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBackgroundPTY: a pty process sees the size it was started with and
// a resize, is a terminal on all three streams, and runs an interactive
// shell session to its exit.
func TestBackgroundPTY(t *testing.T) {
	a := startAgent(t, nil)
	pid := bg(t, a.client, "stty size; test -t 0 -a -t 1 -a -t 2 && echo tty", backend.BackgroundOpts{PTY: true, Rows: 33, Cols: 101})
	got, _ := follow(t, a.client, pid, 0, 0, "")
	if string(got.stdout) != "33 101\r\ntty\r\n" || got.exit.Code != 0 {
		t.Fatalf("pty output %q, exit %+v", got.stdout, got.exit)
	}

	pid = bg(t, a.client, "exec /bin/sh -i", backend.BackgroundOpts{PTY: true, Rows: 24, Cols: 80})
	if err := a.client.ResizeBackground(ctx(t), pid, 40, 120); err != nil {
		t.Fatal(err)
	}
	w, err := a.client.OpenStdin(ctx(t), pid)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write([]byte("stty size; echo h''i; exit 7\n")); err != nil {
		t.Fatal(err)
	}
	got, _ = follow(t, a.client, pid, 0, 0, "")
	if !strings.Contains(string(got.stdout), "40 120\r\n") || !strings.Contains(string(got.stdout), "\r\nhi\r\n") || got.exit.Code != 7 {
		t.Fatalf("session output %q, exit %+v", got.stdout, got.exit)
	}
	if err := a.client.ResizeBackground(ctx(t), pid, 10, 10); !(errdefs.CategoryOf(err) == errdefs.NotFound) {
		t.Fatalf("resize after exit: %v", err)
	}
	pid = bg(t, a.client, "true", backend.BackgroundOpts{})
	if err := a.client.ResizeBackground(ctx(t), pid, 10, 10); !(errdefs.CategoryOf(err) == errdefs.Invalid) {
		t.Fatalf("resize without a pty: %v", err)
	}
}

// TestExecPTY: a connection's process on a pty: the client gets the
// master, sees the size, types into it, and reads to the end.
func TestExecPTY(t *testing.T) {
	a := startAgent(t, nil)
	p, err := a.client.Start(ctx(t), backend.ProcSpec{Argv: []string{"/bin/sh", "-c", "stty size; read x; echo got $x"}, Env: []string{"PATH=/usr/bin:/bin"}, PTY: true, Rows: 7, Cols: 9})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Stderr() != nil {
		t.Fatal("a pty process has a separate stderr")
	}
	if _, err := p.Stdin().Write([]byte("yo\n")); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout()) // EIO at the end
	st, err := p.Wait()
	if err != nil || st.Code != 0 || !strings.Contains(string(out), "7 9\r\n") || !strings.Contains(string(out), "got yo\r\n") {
		t.Fatalf("output %q, %+v %v", out, st, err)
	}
}

// TestBackgroundStdinDeadline: a write the process does not read stops at
// its deadline (the stdin handle is served by the runtime poller).
func TestBackgroundStdinDeadline(t *testing.T) {
	a := startAgent(t, nil)
	pid := bg(t, a.client, "sleep 1000", backend.BackgroundOpts{})
	w, err := a.client.OpenStdin(ctx(t), pid)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	_, err = w.Write(make([]byte, 8<<20))
	if !errorsIsTimeout(err) {
		t.Fatalf("write: %v", err)
	}
	if err := a.client.CloseStdin(ctx(t), pid); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.OpenStdin(ctx(t), pid); !(errdefs.CategoryOf(err) == errdefs.Conflict) {
		t.Fatalf("open after close: %v", err)
	}
	a.client.SignalBackground(ctx(t), pid, syscall.SIGKILL, true)
}

func errorsIsTimeout(err error) bool {
	return err != nil && os.IsTimeout(err)
}

// TestBackgroundSlowAttacher: a client that does not read while the
// process writes 20 times its buffer neither blocks the process nor the
// agent; when it reads, it gets what fitted in its socket, then a jump
// in the offsets to the oldest byte still kept, and the stream's end.
func TestBackgroundSlowAttacher(t *testing.T) {
	a := startAgent(t, nil)
	pid := bg(t, a.client, "sleep 0.2; head -c 1310720 /dev/zero; echo END", backend.BackgroundOpts{OutputCap: 64 << 10})
	att, err := a.client.AttachBackground(ctx(t), pid, 0, backend.FromEnd)
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	deadline := time.Now().Add(20 * time.Second)
	for !listed(t, a.client, pid).Exited {
		if time.Now().After(deadline) {
			t.Fatal("the process blocked behind a client that does not read")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var got []byte
	next, jumps := int64(0), 0
	for {
		o, err := att.Next()
		if err != nil {
			t.Fatal(err)
		}
		if o.Exit != nil {
			break
		}
		if o.Offset != next {
			if o.Offset < next {
				t.Fatalf("offset went back from %d to %d", next, o.Offset)
			}
			jumps++
		}
		got = append(got, o.Data...)
		next = o.Offset + int64(len(o.Data))
	}
	if next != 1310724 || jumps == 0 || len(got) >= 1310724 || !bytes.HasSuffix(got, []byte("\x00END\n")) {
		t.Fatalf("end offset %d, %d jumps, %d bytes, tail %q", next, jumps, len(got), got[max(0, len(got)-8):])
	}
}

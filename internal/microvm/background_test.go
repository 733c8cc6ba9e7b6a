package microvm

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// testSandbox boots one sandbox of the microvm backend on the test's
// busybox layer; the test's end destroys it.
func testSandbox(t *testing.T) backend.Sandbox {
	t.Helper()
	cfg := testConfig(t)
	b, err := New(Options{StateDir: t.TempDir(), QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := b.Create(ctx, backend.Spec{ID: "bg-" + filepath.Base(t.TempDir()), Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}},
		MemoryBytes: 128 << 20, PidsMax: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return sb
}

// follow attaches to pid from the offsets and collects its output until
// its exit.
func follow(t *testing.T, h backend.Background, pid int, outOff, errOff int64) (stdout, stderr string, first [2]int64, exit backend.ExitStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := h.AttachBackground(ctx, pid, outOff, errOff)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	first = [2]int64{-1, -1}
	var out, errb strings.Builder
	for {
		o, err := a.Next()
		if err != nil {
			t.Fatalf("attach: %v (stdout so far %q)", err, out.String())
		}
		if o.Exit != nil {
			return out.String(), errb.String(), first, *o.Exit
		}
		i, w := 0, &out
		if o.Stderr {
			i, w = 1, &errb
		}
		if first[i] < 0 {
			first[i] = o.Offset
		}
		w.Write(o.Data)
	}
}

// TestBackgroundProcessesInTheGuest: a microVM sandbox's background
// processes are the guest agent's: listed with their tag, fed through
// stdin handles, followed from any offset (also after they exited, with
// their exit; data written to a stdin handle comes before a CloseStdin
// that follows the handle's close), bounded to the latest OutputCap bytes
// of each stream,
// signalled by pid (an exited one's signal matches os.ErrProcessDone),
// forgotten once exited; and they run on a terminal of the size asked,
// which a resize changes.
func TestBackgroundProcessesInTheGuest(t *testing.T) {
	sb := testSandbox(t)
	h := sb.(backend.Background)
	ctx := context.Background()
	env := []string{"PATH=/bin"}

	t.Run("StdinOutputExit", func(t *testing.T) {
		pid, err := h.StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", "echo before; read x; echo after $x; echo oops >&2; exit 3"}, Env: env},
			backend.BackgroundOpts{OutputCap: 1 << 20, Tag: []byte("the tag")})
		if err != nil {
			t.Fatal(err)
		}
		list, err := h.ListBackground(ctx)
		if err != nil || len(list) != 1 || list[0].Pid != pid || list[0].Exited || !list[0].StdinOpen || string(list[0].Tag) != "the tag" || list[0].OutputCap != 1<<20 {
			t.Fatalf("list: %+v %v", list, err)
		}
		w, err := h.OpenStdin(ctx, pid)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte("x\n")); err != nil {
			t.Fatal(err)
		}
		w.Close()
		out, errOut, first, ex := follow(t, h, pid, 0, 0)
		if out != "before\nafter x\n" || errOut != "oops\n" || ex.Code != 3 || first != [2]int64{0, 0} {
			t.Fatalf("followed: stdout %q stderr %q exit %+v first offsets %v", out, errOut, ex, first)
		}
		// Kept after the exit, from any offset.
		if out, errOut, first, ex := follow(t, h, pid, 7, backend.FromEnd); out != "after x\n" || errOut != "" || ex.Code != 3 || first[0] != 7 {
			t.Fatalf("followed again from 7: stdout %q stderr %q exit %+v first %v", out, errOut, ex, first)
		}
		err = h.SignalBackground(ctx, pid, syscall.SIGTERM, false)
		if !errors.Is(err, os.ErrProcessDone) || !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("signal to an exited process: %v", err)
		}
		if _, err := h.OpenStdin(ctx, pid); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("stdin of an exited process: %v", err)
		}
		list, _ = h.ListBackground(ctx)
		if len(list) != 1 || !list[0].Exited || list[0].Status.Code != 3 || list[0].StdinOpen || list[0].Stdout != (backend.StreamRange{Start: 0, Total: 15}) {
			t.Fatalf("list after the exit: %+v", list)
		}
		if err := h.(backend.Forgetter).ForgetBackground(ctx, pid); err != nil {
			t.Fatal(err)
		}
		if list, _ := h.ListBackground(ctx); len(list) != 0 {
			t.Fatalf("listed after forget: %+v", list)
		}
		a, err := h.AttachBackground(ctx, pid, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Next(); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("attach to a forgotten process: %v", err)
		}
		a.Close()
	})

	t.Run("StdinDataBeforeClose", func(t *testing.T) {
		// More than a pipe holds, to a process that reads it only later:
		// the agent is still writing when the handle closes.
		pid, err := h.StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", "sleep 1; wc -c"}, Env: env},
			backend.BackgroundOpts{OutputCap: 4096})
		if err != nil {
			t.Fatal(err)
		}
		w, err := h.OpenStdin(ctx, pid)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(make([]byte, 200000)); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if err := h.CloseStdin(ctx, pid); err != nil {
			t.Fatal(err)
		}
		if out, _, _, ex := follow(t, h, pid, 0, 0); strings.TrimSpace(out) != "200000" || ex.Code != 0 {
			t.Fatalf("the process read %q of 200000 bytes written before its stdin closed (exit %+v)", out, ex)
		}
	})

	t.Run("OutputKeepsTheLatestCap", func(t *testing.T) {
		pid, err := h.StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", "head -c 100000 /dev/zero; echo end"}, Env: env},
			backend.BackgroundOpts{OutputCap: 4096})
		if err != nil {
			t.Fatal(err)
		}
		// Once it exited (an attacher that keeps up would see it all).
		deadline := time.Now().Add(time.Minute)
		for {
			list, err := h.ListBackground(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if l := list[len(list)-1]; l.Pid == pid && l.Exited {
				if l.Stdout != (backend.StreamRange{Start: 100004 - 4096, Total: 100004}) {
					t.Fatalf("kept %+v", l.Stdout)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("not exited after a minute")
			}
			time.Sleep(20 * time.Millisecond)
		}
		out, _, first, ex := follow(t, h, pid, 0, 0)
		if ex.Code != 0 || len(out) != 4096 || !strings.HasSuffix(out, "end\n") || first[0] != 100004-4096 {
			t.Fatalf("followed %d bytes from %v, exit %+v", len(out), first, ex)
		}
	})

	t.Run("SignalRunningAndForgetRefused", func(t *testing.T) {
		pid, err := h.StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", "sleep 1000; echo not here"}, Env: env},
			backend.BackgroundOpts{OutputCap: 4096})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.(backend.Forgetter).ForgetBackground(ctx, pid); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("forget of a running process: %v", err)
		}
		// The whole group: sleep too, or it would hold the output open.
		if err := h.SignalBackground(ctx, pid, syscall.SIGKILL, true); err != nil {
			t.Fatal(err)
		}
		if out, _, _, ex := follow(t, h, pid, 0, 0); out != "" || ex.Signal != syscall.SIGKILL || ex.Code != -1 {
			t.Fatalf("killed: stdout %q exit %+v", out, ex)
		}
	})

	t.Run("TerminalAndResize", func(t *testing.T) {
		pid, err := h.StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", "tty; stty size; read x; stty size; echo got $x"}, Env: env},
			backend.BackgroundOpts{OutputCap: 4096, PTY: true, Rows: 30, Cols: 100})
		if err != nil {
			t.Fatal(err)
		}
		a, err := h.AttachBackground(ctx, pid, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		var out string
		for !strings.Contains(out, "30 100") {
			o, err := a.Next()
			if err != nil || o.Exit != nil {
				t.Fatalf("attach: %v %+v, so far %q", err, o, out)
			}
			out += string(o.Data)
		}
		if err := h.ResizeBackground(ctx, pid, 40, 120); err != nil {
			t.Fatal(err)
		}
		w, err := h.OpenStdin(ctx, pid)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("y\n"))
		w.Close()
		for {
			o, err := a.Next()
			if err != nil {
				t.Fatalf("attach: %v, so far %q", err, out)
			}
			if o.Exit != nil {
				if o.Exit.Code != 0 {
					t.Fatalf("exit %+v", o.Exit)
				}
				break
			}
			out += string(o.Data)
		}
		if !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "40 120\r\ngot y") {
			t.Fatalf("terminal output %q", out)
		}
		if err := h.ResizeBackground(ctx, pid, 10, 10); !errors.Is(err, os.ErrProcessDone) {
			t.Fatalf("resize after the exit: %v", err)
		}
	})
}

// TestPTYExec: a foreground process started with PTY runs on a terminal
// of the size asked, which Resize changes; closing its stdin sends the
// terminal's EOF.
func TestPTYExec(t *testing.T) {
	sb := testSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := sb.Start(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", "stty size; read x; stty size; cat; echo eof"}, Env: []string{"PATH=/bin"}, PTY: true, Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Stderr() != nil {
		t.Fatal("a PTY process has a separate stderr")
	}
	buf := make([]byte, 4096)
	var out string
	for !strings.Contains(out, "24 80") {
		n, err := p.Stdout().Read(buf)
		if err != nil {
			t.Fatalf("read: %v, so far %q", err, out)
		}
		out += string(buf[:n])
	}
	if err := p.(backend.Resizer).Resize(50, 132); err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin(), "go\n")
	p.Stdin().Close()
	rest, _ := io.ReadAll(p.Stdout())
	out += string(rest)
	st, err := p.Wait()
	if err != nil || st.Code != 0 || !strings.Contains(out, "50 132") || !strings.HasSuffix(out, "eof\r\n") {
		t.Fatalf("output %q status %+v %v", out, st, err)
	}
}

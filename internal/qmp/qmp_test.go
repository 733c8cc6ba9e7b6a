package qmp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStopContOnQEMU: against a real QEMU, the client negotiates
// capabilities, stops and continues the machine as query-status sees
// it, and returns QEMU's own error for a command it does not know.
func TestStopContOnQEMU(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skipf("no qemu-system-x86_64 (scripts/vm.sh installs it): %v", err)
	}
	dir := t.TempDir()
	sock, evSock := filepath.Join(dir, "qmp.sock"), filepath.Join(dir, "ev.sock")
	// A second monitor, for events only (microvm's liveness.go).
	cmd := exec.Command(qemu, "-M", "none", "-nodefaults", "-display", "none", "-S", "-qmp", "unix:"+sock+",server=on,wait=off",
		"-chardev", "socket,id=ev,path="+evSock+",server=on,wait=off", "-mon", "chardev=ev,mode=control")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var c *Client
	for {
		if c, err = Dial(ctx, sock); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer c.Close()
	ev, err := Dial(ctx, evSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	status := func() Status {
		t.Helper()
		st, err := c.QueryStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := status(); st.Running {
		t.Fatalf("started with -S: %+v", st)
	}
	if err := c.Run(ctx, "cont", nil, nil); err != nil {
		t.Fatal(err)
	}
	if st := status(); !st.Running || st.Status != "running" {
		t.Fatalf("after cont: %+v", st)
	}
	// The other monitor hears of it; a wait for another event ends with
	// its context.
	if e, err := ev.NextEvent(ctx); err != nil || e.Event != "RESUME" {
		t.Fatalf("the events monitor after cont: %+v %v", e, err)
	}
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if e, err := ev.NextEvent(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no event due: %+v %v, want the context's end", e, err)
	}
	if err := c.Run(ctx, "stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	if st := status(); st.Running || st.Status != "paused" {
		t.Fatalf("after stop: %+v", st)
	}
	var qerr *Error
	if err := c.Run(ctx, "no-such-command", nil, nil); !errors.As(err, &qerr) || qerr.Class != "CommandNotFound" {
		t.Fatalf("unknown command: %v", err)
	}
}

// TestDialEndsWithItsContext: a peer that accepts and never greets does
// not hold Dial past its context.
func TestDialEndsWithItsContext(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mute.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = io.Copy(io.Discard, c) // until the client closes
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := Dial(ctx, sock); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial of a mute peer: %v", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("dial returned after %v", d)
	}
}

// TestDialSkipsEventsBeforeTheGreeting: a connection that replaces one
// to the same monitor can get an event before the greeting (QEMU has not
// reset the monitor's negotiated state yet): Dial skips it; a line that
// is neither is still no greeting.
func TestDialSkipsEventsBeforeTheGreeting(t *testing.T) {
	serve := func(first string) string {
		sock := filepath.Join(t.TempDir(), "qmp.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			io.WriteString(c, first)
			io.WriteString(c, `{"QMP": {"version": {}, "capabilities": []}}`+"\n")
			r := bufio.NewReader(c)
			if _, err := r.ReadString('\n'); err == nil { // qmp_capabilities
				io.WriteString(c, `{"return": {}}`+"\n")
			}
			_, _ = io.Copy(io.Discard, r)
		}()
		return sock
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev := `{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "VSERPORT_CHANGE", "data": {"open": true, "id": "agentport"}}` + "\n"
	c, err := Dial(ctx, serve(ev+ev))
	if err != nil {
		t.Fatalf("dial with two events before the greeting: %v", err)
	}
	c.Close()
	if _, err := Dial(ctx, serve(`{"return": {}}`+"\n")); err == nil || !strings.Contains(err.Error(), "no greeting") {
		t.Fatalf("dial with an answer before the greeting: %v, want no greeting", err)
	}
}

package e2e

import (
	"bufio"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestWatchDirClientAndCLI: the Go client's WatchDir and `warren sandbox
// watch` follow a sandbox's directory through the daemon's API (the
// started event first, then what a command does there), the CLI exits
// with an error when the sandbox is deleted under it, and `sandbox stats`
// reads the sandbox's use.
func TestWatchDirClientAndCLI(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "watchcli"})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan *warrenv1.FileEvent, 64)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.c.WatchDir(ctx, &warrenv1.WatchDirRequest{SandboxId: "watchcli", Path: "/tmp", Recursive: true}, func(ev *warrenv1.WatchDirEvent) error {
			if ev.GetStarted() != nil {
				close(started)
			} else {
				got <- ev.GetFile()
			}
			return nil
		})
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("watch: %v", err)
	}
	e.sh("watchcli", "mkdir /tmp/d && echo x > /tmp/d/f")
	for want := "d/f"; ; {
		select {
		case ev := <-got:
			if ev.GetPath() == want && ev.GetType() == warrenv1.FileEventType_FILE_EVENT_TYPE_CREATE {
				want = ""
			}
		case <-ctx.Done():
			t.Fatalf("no create event for %s through the client", want)
		}
		if want == "" {
			break
		}
	}
	cancel()
	<-done

	out, stderr, code := e.cli(nil, "sandbox", "stats", "watchcli")
	if code != 0 || !strings.Contains(out, "memory") || !strings.Contains(out, "disk") {
		t.Fatalf("sandbox stats: %d %q %q", code, out, stderr)
	}

	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	cmd := exec.CommandContext(cctx, e.bin, "--addr", e.addr(), "sandbox", "watch", "watchcli", "/tmp", "--recursive")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderrPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The CLI says on stderr when the watch is set.
	if line, err := bufio.NewReader(stderrPipe).ReadString('\n'); err != nil || !strings.HasPrefix(line, "watching /tmp") {
		t.Fatalf("watch CLI: %q %v", line, err)
	}
	e.sh("watchcli", "echo y > /tmp/cli.txt")
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if strings.Fields(lines.Text())[0] == "create" && strings.HasSuffix(lines.Text(), " cli.txt") {
			break
		}
	}
	if err := e.c.Delete(cctx, "watchcli"); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
	}
	if err := cmd.Wait(); err == nil || cctx.Err() != nil {
		t.Fatalf("watch CLI after the sandbox was deleted: %v (deadline %v)", err, cctx.Err())
	}
}

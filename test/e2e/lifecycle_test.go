package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestLifecycle drives one daemon through the whole sandbox API.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	c := e.c
	ctx := ctxFor(t, 3*time.Minute)

	const id = "life"
	before := time.Now()
	sb := e.create(&warrenv1.CreateRequest{
		Id:             id,
		Backend:        "container",
		Resources:      &warrenv1.Resources{CpuMillis: 500, MemoryBytes: 64 << 20, PidsMax: 64},
		Env:            map[string]string{"A": "1", "B": "2"},
		Workdir:        "/tmp",
		Labels:         map[string]string{"team": "a", "run": "1"},
		TimeoutSeconds: 600,
		Hostname:       "box1",
	})

	t.Run("create", func(t *testing.T) {
		if sb.Id != id || sb.Image != imageName || sb.Backend != "container" || sb.State != warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
			t.Errorf("created sandbox %v", sb)
		}
		r := sb.GetResources()
		if r.GetCpuMillis() != 500 || r.GetMemoryBytes() != 64<<20 || r.GetPidsMax() != 64 {
			t.Errorf("resources %v", r)
		}
		if sb.Hostname != "box1" || sb.Workdir != "/tmp" || sb.Env["A"] != "1" || sb.Labels["team"] != "a" {
			t.Errorf("created sandbox %v", sb)
		}
		exp := time.UnixMilli(sb.ExpiresAtUnixMs)
		if d := exp.Sub(before); d < 599*time.Second || d > 610*time.Second {
			t.Errorf("expires %v after the request, want about 600s", d)
		}
		if sb.CreatedAtUnixMs < before.UnixMilli()-1000 || sb.CreatedAtUnixMs > time.Now().UnixMilli()+1000 {
			t.Errorf("created_at %d", sb.CreatedAtUnixMs)
		}
		// The limits reach the kernel.
		checkCgroupLimits(t, e, id, 500, 64<<20, 64)
		// Inside: hostname, workdir, env.
		if got := e.shOK(id, "hostname; pwd; echo $A $B"); got != "box1\n/tmp\n1 2\n" {
			t.Errorf("hostname/pwd/env = %q", got)
		}
		// Its own network namespace, not the host's.
		host, _ := os.Readlink("/proc/self/ns/net")
		for _, r := range e.resourcesOf(id) {
			if r.kind == "netns" && r.what == host {
				t.Errorf("sandbox shares the host network namespace %s", host)
			}
		}
		if n := e.netnsCount(); n != 1 {
			t.Errorf("%d network namespaces for one sandbox", n)
		}
	})

	t.Run("get", func(t *testing.T) {
		got, err := c.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Id != id || got.State != warrenv1.SandboxState_SANDBOX_STATE_RUNNING || got.Hostname != "box1" ||
			got.ExpiresAtUnixMs != sb.ExpiresAtUnixMs || got.GetResources().GetPidsMax() != 64 {
			t.Errorf("get: %v", got)
		}
	})

	t.Run("list by label", func(t *testing.T) {
		e.create(&warrenv1.CreateRequest{Id: "other", Labels: map[string]string{"team": "b", "run": "1"}})
		defer func() {
			if err := c.Delete(ctx, "other"); err != nil {
				t.Error(err)
			}
		}()
		if n := e.netnsCount(); n != 2 {
			t.Errorf("%d network namespaces for two sandboxes", n)
		}
		cases := []struct {
			sel  map[string]string
			want []string
		}{
			{nil, []string{"life", "other"}},
			{map[string]string{"team": "a"}, []string{"life"}},
			{map[string]string{"team": "b"}, []string{"other"}},
			{map[string]string{"run": "1"}, []string{"life", "other"}},
			{map[string]string{"team": "a", "run": "1"}, []string{"life"}},
			{map[string]string{"team": "a", "run": "2"}, nil},
			{map[string]string{"team": "c"}, nil},
		}
		for _, tc := range cases {
			sbs, err := c.List(ctx, tc.sel)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, s := range sbs {
				ids = append(ids, s.Id)
			}
			slices.Sort(ids)
			if !slices.Equal(ids, tc.want) {
				t.Errorf("list %v = %v, want %v", tc.sel, ids, tc.want)
			}
		}
	})

	t.Run("exec argv and shell", func(t *testing.T) {
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"echo", "hello", "world"}})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "hello world\n" || res.ExitCode != 0 || res.Pid == 0 {
			t.Errorf("argv exec: %v", res)
		}
		res, err = c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "echo out; echo err >&2; exit 7"})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.ExitCode != 7 || res.Signal != 0 {
			t.Errorf("shell exec: %v", res)
		}
		// An argv is not interpreted by a shell.
		res, err = c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"echo", "$A;", "`id`"}})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "$A; `id`\n" {
			t.Errorf("argv went through a shell: %q", res.Stdout)
		}
	})

	t.Run("exec env cwd", func(t *testing.T) {
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "echo $A $B $C; pwd; echo $PATH", Env: map[string]string{"B": "3", "C": "x y"}, Cwd: "/etc"})
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(res.Stdout), "\n")
		if len(lines) < 3 || lines[0] != "1 3 x y" || lines[1] != "/etc" || !strings.Contains(lines[2], "/bin") {
			t.Errorf("env/cwd: %q", res.Stdout)
		}
	})

	t.Run("exec user", func(t *testing.T) {
		cases := []struct{ user, want string }{
			{"", "0 0\n"},
			{"root", "0 0\n"},
			{"nobody", "65534 65534\n"},
			{"65534", "65534 65534\n"},
			{"1234", "1234 1234\n"},
			{"1234:4321", "1234 4321\n"},
			{"nobody:root", "65534 0\n"},
		}
		for _, tc := range cases {
			res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "echo $(id -u) $(id -g)", User: tc.user})
			if err != nil {
				t.Errorf("user %q: %v", tc.user, err)
				continue
			}
			if string(res.Stdout) != tc.want {
				t.Errorf("user %q: %q (stderr %q), want %q", tc.user, res.Stdout, res.Stderr, tc.want)
			}
		}
		// nobody cannot write root's files.
		res := e.sh(id, "echo x > /root/f")
		_ = res
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "echo y >> /root/f", User: "nobody"})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Errorf("nobody could write /root/f")
		}
	})

	t.Run("exec stdin", func(t *testing.T) {
		in := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"sh", "-c", "wc -c; echo done"}, Stdin: in})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Fields(string(res.Stdout)); len(got) != 2 || got[0] != fmt.Sprint(len(in)) || got[1] != "done" {
			t.Errorf("stdin: %q", res.Stdout)
		}
		res, err = c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"cat"}, Stdin: []byte("hello\n")})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "hello\n" {
			t.Errorf("cat: %q", res.Stdout)
		}
	})

	t.Run("exec timeout kills the process group", func(t *testing.T) {
		start := time.Now()
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id,
			Shell:     "sleep 60 & echo $! > /tmp/bg.pid; echo started; sleep 60",
			TimeoutMs: 500})
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if !res.TimedOut || res.Signal != int32(syscall.SIGKILL) || res.ExitCode != -1 {
			t.Errorf("timed-out exec: %v", res)
		}
		if string(res.Stdout) != "started\n" {
			t.Errorf("output before the timeout lost: %q", res.Stdout)
		}
		if took < 400*time.Millisecond || took > 5*time.Second {
			t.Errorf("exec with a 500ms timeout took %v", took)
		}
		// The background sleep of the same process group is gone too.
		if got := e.sh(id, "kill -0 $(cat /tmp/bg.pid) 2>/dev/null && echo alive || echo gone"); string(got.Stdout) != "gone\n" {
			t.Errorf("background child of a timed-out exec: %q", got.Stdout)
		}
		if out := e.shOK(id, "ps -o comm | grep -c sleep || true"); strings.TrimSpace(out) != "0" {
			t.Errorf("%s sleep processes left", strings.TrimSpace(out))
		}
	})

	t.Run("exec output cap", func(t *testing.T) {
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "yes | head -c 5000000; yes e | head -c 3000 >&2"})
		if err != nil {
			t.Fatal(err)
		}
		const limit = 1 << 20
		if len(res.Stdout) != limit || !res.StdoutTruncated || res.StdoutDroppedBytes != 5000000-limit {
			t.Errorf("stdout: %d bytes, truncated %v, dropped %d", len(res.Stdout), res.StdoutTruncated, res.StdoutDroppedBytes)
		}
		if !bytes.Equal(res.Stdout[:8], []byte("y\ny\ny\ny\n")) {
			t.Errorf("stdout does not start with the output's beginning: %q", res.Stdout[:8])
		}
		if len(res.Stderr) != 3000 || res.StderrTruncated || res.StderrDroppedBytes != 0 {
			t.Errorf("stderr: %d bytes, truncated %v, dropped %d", len(res.Stderr), res.StderrTruncated, res.StderrDroppedBytes)
		}
		if res.ExitCode != 0 {
			t.Errorf("exit %d", res.ExitCode)
		}
		res, err = c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "yes | head -c 5000; yes | head -c 5000 >&2", OutputLimitBytes: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Stdout) != 1000 || !res.StdoutTruncated || res.StdoutDroppedBytes != 4000 ||
			len(res.Stderr) != 1000 || !res.StderrTruncated || res.StderrDroppedBytes != 4000 {
			t.Errorf("limit 1000: stdout %d/%v/%d stderr %d/%v/%d", len(res.Stdout), res.StdoutTruncated, res.StdoutDroppedBytes,
				len(res.Stderr), res.StderrTruncated, res.StderrDroppedBytes)
		}
	})

	t.Run("exec stream", func(t *testing.T) {
		start := time.Now()
		var (
			first time.Duration
			out   []byte
			errs  []byte
		)
		res, err := c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "echo a; echo e >&2; sleep 1; echo b"}, func(ev *warrenv1.ExecEvent) error {
			if first == 0 {
				first = time.Since(start)
			}
			out = append(out, ev.GetStdout()...)
			errs = append(errs, ev.GetStderr()...)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		total := time.Since(start)
		if string(out) != "a\nb\n" || string(errs) != "e\n" {
			t.Errorf("streamed stdout %q stderr %q", out, errs)
		}
		if res.ExitCode != 0 || len(res.Stdout) != 0 || len(res.Stderr) != 0 {
			t.Errorf("stream result: %v", res)
		}
		if total < time.Second {
			t.Errorf("stream ended after %v, before the command's sleep", total)
		}
		if first == 0 || first > total-500*time.Millisecond {
			t.Errorf("first chunk after %v, result after %v: output was not streamed", first, total)
		}
	})

	t.Run("cancelled calls kill their command", func(t *testing.T) {
		waitOnlyInit := func(what string) {
			t.Helper()
			if err := e.waitProcs(id, func(n int) bool { return n == 1 }, 10*time.Second); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		sctx, cancel := context.WithCancel(ctx)
		got := make(chan struct{}, 1)
		done := make(chan error, 1)
		go func() {
			_, err := c.ExecStream(sctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "sleep 60 & echo go; sleep 60"}, func(ev *warrenv1.ExecEvent) error {
				select {
				case got <- struct{}{}:
				default:
				}
				return nil
			})
			done <- err
		}()
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("no output from the stream")
		}
		cancel()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("cancelled stream returned no error")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("cancelled stream did not return")
		}
		waitOnlyInit("after cancelling a stream")

		uctx, ucancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := c.Exec(uctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "sleep 60 & sleep 60"})
		ucancel()
		if err == nil {
			t.Errorf("exec past its call deadline returned no error")
		}
		waitOnlyInit("after an exec call's deadline passed")
	})

	t.Run("exec stream output cap", func(t *testing.T) {
		var n int
		res, err := c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "yes | head -c 5000000", OutputLimitBytes: 100000}, func(ev *warrenv1.ExecEvent) error {
			n += len(ev.GetStdout())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n != 100000 || !res.StdoutTruncated || res.StdoutDroppedBytes != 5000000-100000 {
			t.Errorf("streamed %d bytes, truncated %v, dropped %d", n, res.StdoutTruncated, res.StdoutDroppedBytes)
		}
	})

	t.Run("exec idempotency key", func(t *testing.T) {
		req := &warrenv1.ExecRequest{SandboxId: id, Shell: "echo run >> /tmp/idem; wc -l < /tmp/idem", IdempotencyKey: "once"}
		r1, err := c.Exec(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := c.Exec(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if string(r1.Stdout) != "1\n" || string(r2.Stdout) != "1\n" || r1.Pid != r2.Pid {
			t.Errorf("retried exec ran again: %q pid %d, then %q pid %d", r1.Stdout, r1.Pid, r2.Stdout, r2.Pid)
		}
		if got := e.shOK(id, "wc -l < /tmp/idem"); strings.TrimSpace(got) != "1" {
			t.Errorf("command ran %s times", strings.TrimSpace(got))
		}
	})

	t.Run("memory limit", func(t *testing.T) {
		// 64 MiB limit: holding 200 MB in a shell variable gets killed.
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived ${#x}"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(res.Stdout), "survived") {
			t.Errorf("200 MB in a 64 MiB sandbox: %q", res.Stdout)
		}
		if !res.OomKilled && res.ExitCode == 0 {
			t.Errorf("memory hog: %v", res)
		}
		t.Logf("memory hog: exit %d signal %d oom_killed %v", res.ExitCode, res.Signal, res.OomKilled)
		// The sandbox itself survives.
		e.shOK(id, "true")
	})

	t.Run("pids limit", func(t *testing.T) {
		// pids_max 64: a loop starting 100 short sleeps hits the limit.
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "for i in $(seq 100); do sleep 2 & done; echo all started", TimeoutMs: 10000})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(res.Stdout), "all started") || !strings.Contains(string(res.Stderr), "can't fork") {
			t.Errorf("100 processes with pids_max 64: stdout %q, stderr %q", res.Stdout, res.Stderr)
		}
		if n := len(e.procsOf(id)); n > 64 {
			t.Errorf("%d processes in a sandbox with pids_max 64", n)
		}
		// The sleeps end and the sandbox recovers.
		if err := e.waitProcs(id, func(n int) bool { return n == 1 }, 15*time.Second); err != nil {
			t.Errorf("after the fork loop: %v", err)
		}
		e.shOK(id, "true")
	})

	t.Run("background processes", func(t *testing.T) {
		p, err := c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"cat"}})
		if err != nil {
			t.Fatal(err)
		}
		if p.ProcessId == "" || !p.Running || p.Pid == 0 || !slices.Equal(p.Argv, []string{"cat"}) {
			t.Errorf("started: %v", p)
		}
		if err := c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: p.ProcessId, Data: []byte("hello ")}); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: p.ProcessId, Data: []byte("world\n"), Close: true}); err != nil {
			t.Fatal(err)
		}
		res, err := c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: p.ProcessId, TimeoutMs: 10000})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "hello world\n" || res.ExitCode != 0 {
			t.Errorf("cat: %v", res)
		}
		err = c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: p.ProcessId, Data: []byte("late")})
		wantCategory(t, err, client.CategoryConflict, "write stdin of an exited process")

		s, err := c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"sleep", "100"}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: s.ProcessId, TimeoutMs: 200})
		wantCategory(t, err, client.CategoryDeadlineExceeded, "wait with a timeout for a running process")
		procs, err := c.ListProcesses(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var states []string
		for _, pi := range procs {
			states = append(states, fmt.Sprintf("%s:%v", pi.ProcessId, pi.Running))
		}
		if want := []string{p.ProcessId + ":false", s.ProcessId + ":true"}; !slices.Equal(states, want) {
			t.Errorf("processes %v, want %v", states, want)
		}
		// The listed result is the exit; WaitProcess and AttachProcess
		// carry the output, whose size the list tells.
		if procs[0].GetResult() == nil || procs[0].GetResult().GetExitCode() != 0 || procs[0].GetStdoutBytes() != int64(len("hello world\n")) {
			t.Errorf("exited process info lacks its result: %v", procs[0])
		}
		if err := c.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: id, ProcessId: s.ProcessId}); err != nil {
			t.Fatal(err)
		}
		res, err = c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: s.ProcessId, TimeoutMs: 10000})
		if err != nil {
			t.Fatal(err)
		}
		if res.Signal != int32(syscall.SIGTERM) || res.ExitCode != -1 {
			t.Errorf("signalled sleep: %v", res)
		}
		err = c.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: id, ProcessId: s.ProcessId, Signal: int32(syscall.SIGKILL)})
		wantCategory(t, err, client.CategoryConflict, "signal an exited process")
		_, err = c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: "p-999"})
		wantCategory(t, err, client.CategoryNotFound, "wait for an unknown process")

		// A process with a timeout is killed with its group.
		k, err := c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "sleep 60 & sleep 60", TimeoutMs: 300})
		if err != nil {
			t.Fatal(err)
		}
		res, err = c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: k.ProcessId, TimeoutMs: 10000})
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut {
			t.Errorf("background process with a timeout: %v", res)
		}
		if out := e.shOK(id, "ps -o comm | grep -c sleep || true"); strings.TrimSpace(out) != "0" {
			t.Errorf("%s sleep processes left after the background timeout", strings.TrimSpace(out))
		}
	})

	t.Run("files", func(t *testing.T) {
		if err := c.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: id, Path: "/data/a/b", Parents: true}); err != nil {
			t.Fatal(err)
		}
		fi, err := c.StatFile(ctx, id, "/data/a/b")
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsDir || fi.Type != "dir" || fi.Mode != 0o755 {
			t.Errorf("stat dir: %v", fi)
		}
		err = c.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: id, Path: "/data/x/y"})
		if err == nil {
			t.Errorf("mkdir without parents of a missing parent succeeded")
		}
		const f = "/data/a/b/f.txt"
		if err := c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: f, Content: []byte("0123456789"), Mode: 0o600}); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: f, Content: []byte("ab"), Append: true}); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/data/new/deep/g", Content: []byte("g"), MakeParents: true}); err != nil {
			t.Fatal(err)
		}
		fi, err = c.StatFile(ctx, id, f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size != 12 || fi.Mode != 0o600 || fi.IsDir || fi.Type != "file" || fi.Name != "f.txt" || fi.MtimeUnixMs == 0 {
			t.Errorf("stat file: %v", fi)
		}
		rd, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: f, Offset: 2, Length: 3})
		if err != nil {
			t.Fatal(err)
		}
		if string(rd.Content) != "234" || rd.Size != 12 || rd.Eof {
			t.Errorf("read 2+3: %q size %d eof %v", rd.Content, rd.Size, rd.Eof)
		}
		rd, err = c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: f, Offset: 8})
		if err != nil {
			t.Fatal(err)
		}
		if string(rd.Content) != "89ab" || !rd.Eof {
			t.Errorf("read from 8: %q eof %v", rd.Content, rd.Eof)
		}
		rd, err = c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: f, Offset: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(rd.Content) != 0 || !rd.Eof {
			t.Errorf("read past the end: %q eof %v", rd.Content, rd.Eof)
		}
		// The sandbox sees what the API wrote, and the other way round.
		if got := e.shOK(id, "cat "+f+"; echo; stat -c %a "+f); got != "0123456789ab\n600\n" {
			t.Errorf("inside: %q", got)
		}
		e.shOK(id, "echo from-inside > /data/a/inside.txt; ln -s b/f.txt /data/a/link")
		rd, err = c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: "/data/a/inside.txt"})
		if err != nil || string(rd.Content) != "from-inside\n" {
			t.Errorf("read file written inside: %q %v", rd.GetContent(), err)
		}
		list, err := c.ListFiles(ctx, id, "/data/a")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, fi := range list {
			names = append(names, fmt.Sprintf("%s:%s", fi.Name, fi.Type))
			if fi.Name == "link" && (!fi.IsSymlink || fi.LinkTarget != "b/f.txt") {
				t.Errorf("symlink entry: %v", fi)
			}
		}
		slices.Sort(names)
		if want := []string{"b:dir", "inside.txt:file", "link:symlink"}; !slices.Equal(names, want) {
			t.Errorf("list /data/a = %v, want %v", names, want)
		}
		// Removal: a non-empty directory needs recursive.
		if err := c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: id, Path: "/data/a"}); err == nil {
			t.Errorf("non-recursive remove of a non-empty directory succeeded")
		}
		if err := c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: id, Path: "/data/a/inside.txt"}); err != nil {
			t.Fatal(err)
		}
		if err := c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: id, Path: "/data", Recursive: true}); err != nil {
			t.Fatal(err)
		}
		_, err = c.StatFile(ctx, id, "/data")
		wantCategory(t, err, client.CategoryNotFound, "stat a removed directory")
		_, err = c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: f})
		wantCategory(t, err, client.CategoryNotFound, "read a removed file")
		if got := e.shOK(id, "test -e /data && echo present || echo absent"); got != "absent\n" {
			t.Errorf("/data after removal: %q", got)
		}
	})

	t.Run("archives", func(t *testing.T) {
		files := map[string]string{
			"proj/main.py":         "print('hi')\n",
			"proj/sub/x.txt":       "x\n",
			"proj/sub/deeper/y.md": strings.Repeat("y", 100000),
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, d := range []string{"proj/", "proj/sub/", "proj/sub/deeper/", "proj/empty/"} {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(files)) {
			mode := int64(0o644)
			if strings.HasSuffix(name, ".py") {
				mode = 0o755
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(files[name]))}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte(files[name])); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "proj/link", Linkname: "main.py"}); err != nil {
			t.Fatal(err)
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: id, Path: "/work"}); err != nil {
			t.Fatal(err)
		}
		if err := c.Upload(ctx, id, "/work", &buf); err != nil {
			t.Fatal(err)
		}
		got := e.shOK(id, "cd /work/proj && cat sub/x.txt && wc -c < sub/deeper/y.md && readlink link && stat -c %a main.py && test -d empty && echo ok")
		if got != "x\n100000\nmain.py\n755\nok\n" {
			t.Errorf("uploaded tree seen inside: %q", got)
		}
		e.shOK(id, "echo new > /work/proj/sub/added.txt")

		rc, err := c.Download(ctx, id, "/work/proj")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		seen := map[string]string{}
		for h, tr := range testutil.TarEntries(t, rc) {
			switch h.Typeflag {
			case tar.TypeReg:
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				seen[h.Name] = string(b)
			case tar.TypeSymlink:
				seen[h.Name] = "-> " + h.Linkname
			case tar.TypeDir:
				seen[strings.TrimSuffix(h.Name, "/")+"/"] = "dir"
			}
		}
		// Entries are relative to the downloaded directory.
		norm := map[string]string{}
		for k, v := range seen {
			norm[strings.TrimPrefix(k, "./")] = v
		}
		want := map[string]string{
			"main.py":         files["proj/main.py"],
			"sub/x.txt":       "x\n",
			"sub/deeper/y.md": files["proj/sub/deeper/y.md"],
			"sub/added.txt":   "new\n",
			"link":            "-> main.py",
			"empty/":          "dir",
		}
		for k, v := range want {
			if norm[k] != v {
				keys := slices.Sorted(maps.Keys(norm))
				t.Errorf("downloaded %s = %.40q, want %.40q (entries %q)", k, norm[k], v, keys)
			}
		}
		// A single file downloads as a one-entry tar.
		rc2, err := c.Download(ctx, id, "/work/proj/sub/x.txt")
		if err != nil {
			t.Fatal(err)
		}
		defer rc2.Close()
		tr := tar.NewReader(rc2)
		h, err := tr.Next()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if filepath.Base(h.Name) != "x.txt" || string(b) != "x\n" {
			t.Errorf("single-file archive: %s %q", h.Name, b)
		}
	})

	t.Run("extend timeout and expiry", func(t *testing.T) {
		ext, err := c.ExtendTimeout(ctx, id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(time.UnixMilli(ext.ExpiresAtUnixMs)); d < 59*time.Minute || d > 61*time.Minute {
			t.Errorf("extended expiry in %v, want about 1h", d)
		}
		if got, _ := c.Get(ctx, id); got.GetExpiresAtUnixMs() != ext.ExpiresAtUnixMs {
			t.Errorf("get after extend: %v", got)
		}

		// Two sandboxes with a 2 s lifetime; one is extended in time.
		short := e.create(&warrenv1.CreateRequest{Id: "short", TimeoutSeconds: 2})
		kept := e.create(&warrenv1.CreateRequest{Id: "kept", TimeoutSeconds: 2})
		if d := time.UnixMilli(short.ExpiresAtUnixMs).Sub(time.UnixMilli(short.CreatedAtUnixMs)); d < 1900*time.Millisecond || d > 3*time.Second {
			t.Errorf("2s sandbox expires %v after creation", d)
		}
		if _, err := c.ExtendTimeout(ctx, kept.Id, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := e.waitGone("short", 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 500*time.Millisecond {
			t.Errorf("2s sandbox gone after %v", took)
		}
		e.expectNoResources("short", "after the timeout deleted the sandbox")
		time.Sleep(time.Until(time.UnixMilli(short.ExpiresAtUnixMs).Add(time.Second)))
		got, err := c.Get(ctx, "kept")
		if err != nil {
			t.Fatalf("extended sandbox: %v", err)
		}
		if got.State != warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
			t.Errorf("extended sandbox: %v", got)
		}
		e.shOK("kept", "true")
		if err := c.Delete(ctx, "kept"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("delete", func(t *testing.T) {
		if err := c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		_, err := c.Get(ctx, id)
		wantCategory(t, err, client.CategoryNotFound, "get after delete")
		err = c.Delete(ctx, id)
		wantCategory(t, err, client.CategoryNotFound, "second delete")
		sbs, err := c.List(ctx, nil)
		if err != nil || len(sbs) != 0 {
			t.Errorf("list after delete: %v %v", sbs, err)
		}
		e.expectBaseline("after delete")
		// The id can be reused.
		e.create(&warrenv1.CreateRequest{Id: id})
		e.shOK(id, "true")
		if err := c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		e.expectBaseline("after deleting a reused id")
	})
}

// checkCgroupLimits reads a sandbox's limits from the host's cgroup files.
func checkCgroupLimits(t *testing.T, e *env, id string, cpuMillis, memBytes, pids int64) {
	t.Helper()
	read := func(p string) (string, bool) {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", false
		}
		return strings.TrimSpace(string(b)), true
	}
	v2 := filepath.Join("/sys/fs/cgroup", e.parent, id)
	if _, err := os.Stat(filepath.Join(v2, "cgroup.controllers")); err == nil {
		if got, _ := read(filepath.Join(v2, "memory.max")); got != fmt.Sprint(memBytes) {
			t.Errorf("memory.max = %q", got)
		}
		if got, _ := read(filepath.Join(v2, "pids.max")); got != fmt.Sprint(pids) {
			t.Errorf("pids.max = %q", got)
		}
		if got, _ := read(filepath.Join(v2, "cpu.max")); got != fmt.Sprintf("%d 100000", cpuMillis*100) {
			t.Errorf("cpu.max = %q", got)
		}
		return
	}
	if got, _ := read(filepath.Join("/sys/fs/cgroup/memory", e.parent, id, "memory.limit_in_bytes")); got != fmt.Sprint(memBytes) {
		t.Errorf("memory.limit_in_bytes = %q", got)
	}
	if got, _ := read(filepath.Join("/sys/fs/cgroup/pids", e.parent, id, "pids.max")); got != fmt.Sprint(pids) {
		t.Errorf("pids.max = %q", got)
	}
	if got, _ := read(filepath.Join("/sys/fs/cgroup/cpu", e.parent, id, "cpu.cfs_quota_us")); got != fmt.Sprint(cpuMillis*100) {
		t.Errorf("cpu.cfs_quota_us = %q", got)
	}
}

// TestCLI drives the daemon through the warren binary itself, with --json.
func TestCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})

	out, stderr, code := e.cli(nil, "--json", "sandbox", "create", "--image", imageName, "--id", "cli1",
		"--cpu", "0.25", "--memory", "32Mi", "--pids", "50", "--env", "K=v", "--workdir", "/tmp",
		"--label", "app=e2e", "--label", "n=1", "--timeout", "10m", "--hostname", "clihost")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, stderr)
	}
	var sb warrenv1.Sandbox
	if err := protojson.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatalf("create --json output %q: %v", out, err)
	}
	if sb.Id != "cli1" || sb.State != warrenv1.SandboxState_SANDBOX_STATE_RUNNING || sb.GetResources().GetCpuMillis() != 250 ||
		sb.GetResources().GetMemoryBytes() != 32<<20 || sb.GetResources().GetPidsMax() != 50 || sb.Env["K"] != "v" ||
		sb.Workdir != "/tmp" || sb.Labels["app"] != "e2e" || sb.Hostname != "clihost" {
		t.Errorf("created: %v", &sb)
	}
	checkCgroupLimits(t, e, "cli1", 250, 32<<20, 50)

	// Plain output: the id only.
	out, stderr, code = e.cli(nil, "sandbox", "create", "--image", imageName)
	if code != 0 || !validID(strings.TrimSpace(out)) {
		t.Fatalf("create: exit %d, %q %s", code, out, stderr)
	}
	second := strings.TrimSpace(out)

	out, _, code = e.cli(nil, "--json", "sandbox", "ls", "--label", "app=e2e")
	var list warrenv1.ListResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &list) != nil || len(list.Sandboxes) != 1 || list.Sandboxes[0].Id != "cli1" {
		t.Errorf("ls --label app=e2e: exit %d %q", code, out)
	}
	out, _, code = e.cli(nil, "--json", "sandbox", "ls")
	if code != 0 || protojson.Unmarshal([]byte(out), &list) != nil || len(list.Sandboxes) != 2 {
		t.Errorf("ls: exit %d %q", code, out)
	}
	out, _, code = e.cli(nil, "--json", "sandbox", "get", "cli1")
	if code != 0 || protojson.Unmarshal([]byte(out), &sb) != nil || sb.Hostname != "clihost" {
		t.Errorf("get: exit %d %q", code, out)
	}

	// exec: the command's exit status, output and JSON result.
	out, stderr, code = e.cli(nil, "sandbox", "exec", "cli1", "--", "sh", "-c", "echo out; echo err >&2; hostname; exit 3")
	if code != 3 || out != "out\nclihost\n" || stderr != "err\n" {
		t.Errorf("exec: exit %d stdout %q stderr %q", code, out, stderr)
	}
	out, _, code = e.cli(nil, "--json", "sandbox", "exec", "-e", "X=1", "-u", "nobody", "-w", "/etc", "cli1", "--", "sh", "-c", "echo $X $K $(id -u) $(pwd)")
	var res warrenv1.ExecResult
	if code != 0 || protojson.Unmarshal([]byte(out), &res) != nil || string(res.Stdout) != "1 v 65534 /etc\n" || res.ExitCode != 0 {
		t.Errorf("exec --json: exit %d %q", code, out)
	}
	out, _, code = e.cli(strings.NewReader("piped"), "sandbox", "exec", "-i", "cli1", "cat")
	if code != 0 || out != "piped" {
		t.Errorf("exec -i: exit %d %q", code, out)
	}
	_, stderr, code = e.cli(nil, "sandbox", "exec", "--timeout", "300ms", "cli1", "sleep", "30")
	if code != 124 || !strings.Contains(stderr, "timed out") {
		t.Errorf("exec --timeout: exit %d stderr %q", code, stderr)
	}
	out, stderr, code = e.cli(nil, "sandbox", "exec", "--output-limit", "10", "cli1", "--", "sh", "-c", "yes | head -c 100")
	if code != 0 || len(out) != 10 || !strings.Contains(stderr, "90 bytes dropped") {
		t.Errorf("exec --output-limit: exit %d stdout %q stderr %q", code, out, stderr)
	}
	// --stream --json prints one event per line, the result last.
	out, _, code = e.cli(nil, "--json", "sandbox", "exec", "--stream", "cli1", "--", "sh", "-c", "echo a; sleep 0.2; echo b")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var streamed []byte
	for i, l := range lines {
		var ev warrenv1.ExecEvent
		if err := protojson.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("stream line %q: %v", l, err)
		}
		streamed = append(streamed, ev.GetStdout()...)
		if (ev.GetResult() != nil) != (i == len(lines)-1) {
			t.Errorf("stream event %d of %d: %q", i, len(lines), l)
		}
	}
	if code != 0 || string(streamed) != "a\nb\n" {
		t.Errorf("exec --stream --json: exit %d %q", code, out)
	}

	// Errors: category on stderr, exit status 1; usage errors 2.
	_, stderr, code = e.cli(nil, "sandbox", "exec", "cli1", "nope-not-here")
	if code != 1 || !strings.Contains(stderr, "not_found") {
		t.Errorf("exec of a missing binary: exit %d %q", code, stderr)
	}
	_, stderr, code = e.cli(nil, "sandbox", "exec", "-u", "nosuchuser", "cli1", "true")
	if code != 1 || !strings.Contains(stderr, "invalid") {
		t.Errorf("exec as an unknown user: exit %d %q", code, stderr)
	}
	_, stderr, code = e.cli(nil, "--json", "sandbox", "get", "nosuch")
	if code != 1 || !strings.Contains(stderr, "error: not_found") {
		t.Errorf("get of an unknown sandbox: exit %d %q", code, stderr)
	}
	_, stderr, code = e.cli(nil, "sandbox", "create", "--image", "nosuchimage")
	if code != 1 || !strings.Contains(stderr, "not_found") {
		t.Errorf("create of an unknown image: exit %d %q", code, stderr)
	}
	_, stderr, code = e.cli(nil, "sandbox", "create", "--image", imageName, "--id", "cli1")
	if code != 1 || !strings.Contains(stderr, "conflict") {
		t.Errorf("create of a duplicate id: exit %d %q", code, stderr)
	}
	_, _, code = e.cli(nil, "sandbox", "create")
	if code != 2 {
		t.Errorf("create without --image: exit %d, want 2", code)
	}

	// cp both ways.
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "d", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "d", "e", "f.txt"), []byte("copied\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code = e.cli(nil, "sandbox", "cp", filepath.Join(src, "d"), "cli1:/tmp/"); code != 0 {
		t.Fatalf("cp in: exit %d %s", code, stderr)
	}
	if got := e.shOK("cli1", "cat /tmp/d/e/f.txt"); got != "copied\n" {
		t.Errorf("cp in: %q", got)
	}
	dst := t.TempDir()
	if _, stderr, code = e.cli(nil, "sandbox", "cp", "cli1:/tmp/d", filepath.Join(dst, "back")); code != 0 {
		t.Fatalf("cp out: exit %d %s", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "back", "e", "f.txt")); err != nil || string(b) != "copied\n" {
		t.Errorf("cp out: %q %v", b, err)
	}

	out, _, code = e.cli(nil, "--json", "sandbox", "extend", "cli1", "--timeout", "2h")
	if code != 0 || protojson.Unmarshal([]byte(out), &sb) != nil || time.Until(time.UnixMilli(sb.ExpiresAtUnixMs)) < 119*time.Minute {
		t.Errorf("extend: exit %d %q", code, out)
	}

	// image build busybox, use, rm (refused while in use).
	out, stderr, code = e.cli(nil, "--json", "image", "build", "busybox", "built")
	var img warrenv1.Image
	if code != 0 || protojson.Unmarshal([]byte(out), &img) != nil || img.Name != "built" || !strings.HasPrefix(img.Id, "sha256:") || len(img.Layers) == 0 {
		t.Fatalf("image build: exit %d %q %s", code, out, stderr)
	}
	out, stderr, code = e.cli(nil, "sandbox", "create", "--image", "built", "--id", "frombuilt")
	if code != 0 {
		t.Fatalf("create from the built image: exit %d %s", code, stderr)
	}
	if got := e.shOK("frombuilt", "busybox true && echo ok"); got != "ok\n" {
		t.Errorf("sandbox of the built image: %q", got)
	}
	_, stderr, code = e.cli(nil, "image", "rm", "built")
	if code != 1 || !strings.Contains(stderr, "conflict") {
		t.Errorf("image rm of an image in use: exit %d %q", code, stderr)
	}
	if _, stderr, code = e.cli(nil, "sandbox", "rm", "frombuilt"); code != 0 {
		t.Errorf("rm: %s", stderr)
	}
	if out, stderr, code = e.cli(nil, "image", "rm", "built"); code != 0 || out != "built\n" {
		t.Errorf("image rm: exit %d %q %s", code, out, stderr)
	}

	out, _, code = e.cli(nil, "--json", "image", "ls")
	var imgs warrenv1.ListImagesResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &imgs) != nil || len(imgs.Images) != 1 || imgs.Images[0].Name != imageName {
		t.Errorf("image ls: exit %d %q", code, out)
	}
	out, _, code = e.cli(nil, "--json", "version")
	if code != 0 || !strings.Contains(out, "container") {
		t.Errorf("version: exit %d %q", code, out)
	}

	out, stderr, code = e.cli(nil, "sandbox", "rm", "cli1", second)
	if code != 0 || len(strings.Fields(out)) != 2 {
		t.Errorf("rm: exit %d %q %s", code, out, stderr)
	}
	_, stderr, code = e.cli(nil, "sandbox", "rm", "cli1")
	if code != 1 || !strings.Contains(stderr, "not_found") {
		t.Errorf("rm of a deleted sandbox: exit %d %q", code, stderr)
	}
	e.expectBaseline("after rm")

	// rm --all --label deletes only the matching ones.
	for i, l := range []string{"g=1", "g=1", "g=2"} {
		if _, stderr, code := e.cli(nil, "sandbox", "create", "--image", imageName, "--id", fmt.Sprintf("g%d", i), "--label", l); code != 0 {
			t.Fatalf("create: %s", stderr)
		}
	}
	out, _, code = e.cli(nil, "sandbox", "rm", "--all", "--label", "g=1")
	if got := strings.Fields(out); code != 0 || len(got) != 2 {
		t.Errorf("rm --all --label g=1: exit %d %q", code, out)
	}
	out, _, _ = e.cli(nil, "--json", "sandbox", "ls")
	if protojson.Unmarshal([]byte(out), &list) != nil || len(list.Sandboxes) != 1 || list.Sandboxes[0].Id != "g2" {
		t.Errorf("after rm --all --label: %q", out)
	}
	if _, _, code = e.cli(nil, "sandbox", "rm", "--all"); code != 0 {
		t.Errorf("rm --all: exit %d", code)
	}
	e.expectBaseline("after rm --all")
}

func validID(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return false
		}
	}
	return true
}

// TestInheritedFDs: a daemon started with an fd its parent forgot to mark
// close-on-exec does not pass it on: not to sandboxes, not to anything else
// it runs.
func TestInheritedFDs(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	e := newEnv(t, envOptions{inherit: []*os.File{w}})
	ctx := ctxFor(t, 30*time.Second)
	sb, err := e.c.Create(ctx, &warrenv1.CreateRequest{Image: imageName})
	if err != nil {
		t.Fatal(err)
	}
	e.shOK(sb.GetId(), "true")
	// The daemon still holds it (fd 3), now close-on-exec.
	e.mu.Lock()
	pid := e.cmd.Process.Pid
	e.mu.Unlock()
	info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/3", pid))
	if err != nil {
		t.Fatal(err)
	}
	var flags uint64
	for _, l := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(l, "flags:"); ok {
			flags, _ = strconv.ParseUint(strings.TrimSpace(v), 8, 64)
		}
	}
	if flags&syscall.O_CLOEXEC == 0 {
		t.Errorf("daemon's inherited fd 3 is not close-on-exec: %s", info)
	}
	// The sandbox's PID 1 does not hold it.
	target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", pid))
	init := e.initPid(sb.GetId())
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", init))
	for _, ent := range ents {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", init, ent.Name())); l == target {
			t.Errorf("sandbox PID 1 (%d) holds the daemon's inherited fd as %s", init, ent.Name())
		}
	}
}

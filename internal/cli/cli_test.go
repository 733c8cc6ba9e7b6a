package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
	"github.com/warrenrl/warren/internal/server"
	"github.com/warrenrl/warren/internal/tarx"
)

// fakeManager implements the calls the CLI makes; the embedded nil
// interface makes any other call panic (an internal error on the wire).
type fakeManager struct {
	server.Manager
	root string // the single sandbox "sb1"'s filesystem

	mu         sync.Mutex
	lastCreate *warrenv1.CreateRequest
	lastExec   *warrenv1.ExecRequest
	lastUpdate *warrenv1.UpdateSandboxRequest
	execResult *warrenv1.ExecResult
	deleted    []string
	sandboxes  []*warrenv1.Sandbox
	lastLayer  *warrenv1.BuildLayerRequest // BuildLayer, or Path "upload:<bytes>" for uploads
	lastPull   *warrenv1.PullImageRequest
	removed    []string
}

func (f *fakeManager) Create(_ context.Context, r *warrenv1.CreateRequest) (*warrenv1.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastCreate = r
	id := r.Id
	if id == "" {
		id = "gen-1"
	}
	return &warrenv1.Sandbox{Id: id, Image: r.Image, State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING}, nil
}

func (f *fakeManager) Get(_ context.Context, r *warrenv1.GetRequest) (*warrenv1.Sandbox, error) {
	return nil, errdefs.NotFoundf("sandbox %s not found", r.Id)
}

func (f *fakeManager) List(_ context.Context, r *warrenv1.ListRequest) (*warrenv1.ListResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := &warrenv1.ListResponse{}
outer:
	for _, s := range f.sandboxes {
		for k, v := range r.Labels {
			if s.Labels[k] != v {
				continue outer
			}
		}
		res.Sandboxes = append(res.Sandboxes, s)
	}
	return res, nil
}

func (f *fakeManager) Delete(_ context.Context, r *warrenv1.DeleteRequest) (*warrenv1.DeleteResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Id == "missing" {
		return nil, errdefs.NotFoundf("sandbox %s not found", r.Id)
	}
	f.deleted = append(f.deleted, r.Id)
	return &warrenv1.DeleteResponse{}, nil
}

func (f *fakeManager) Exec(_ context.Context, r *warrenv1.ExecRequest) (*warrenv1.ExecResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastExec = r
	return f.execResult, nil
}

func (f *fakeManager) ExecStream(_ context.Context, r *warrenv1.ExecRequest, send func(*warrenv1.ExecEvent) error) error {
	f.mu.Lock()
	f.lastExec = r
	res := f.execResult
	f.mu.Unlock()
	send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Stdout{Stdout: res.Stdout}})
	send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Stderr{Stderr: res.Stderr}})
	r2 := proto.Clone(res).(*warrenv1.ExecResult)
	r2.Stdout, r2.Stderr = nil, nil
	return send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Result{Result: r2}})
}

func (f *fakeManager) StatFile(_ context.Context, r *warrenv1.StatFileRequest) (*warrenv1.FileInfo, error) {
	fi, err := os.Lstat(filepath.Join(f.root, r.Path))
	if err != nil {
		return nil, errdefs.NotFoundf("%s: no such file", r.Path)
	}
	target, _ := os.Readlink(filepath.Join(f.root, r.Path))
	return &warrenv1.FileInfo{Name: fi.Name(), Path: r.Path, IsDir: fi.IsDir(), IsSymlink: fi.Mode()&os.ModeSymlink != 0, LinkTarget: target}, nil
}

func (f *fakeManager) TarOut(ctx context.Context, _, p string, w io.Writer, _ sandboxfs.TarOptions) error {
	return tarx.Create(ctx, f.root, w, p)
}

func (f *fakeManager) TarIn(ctx context.Context, _, p string, r io.Reader) error {
	_, err := tarx.Extract(ctx, f.root, r, tarx.Options{Dir: p})
	return err
}

func (f *fakeManager) CommitSandbox(_ context.Context, r *warrenv1.CommitSandboxRequest) (*warrenv1.Layer, error) {
	if r.SandboxId != "sb1" {
		return nil, errdefs.NotFoundf("sandbox %s not found", r.SandboxId)
	}
	l := &warrenv1.Layer{Name: r.Name, Digest: "sha256:0123456789abcdef", Files: 3, BlobSizeBytes: 8192, SetuidKept: r.KeepSetuid}
	if !r.KeepSetuid {
		l.SetuidStripped = 2
	}
	return l, nil
}

func (f *fakeManager) PullImage(_ context.Context, r *warrenv1.PullImageRequest, send func(*warrenv1.PullImageEvent) error) error {
	f.mu.Lock()
	f.lastPull = r
	f.mu.Unlock()
	for _, e := range []*warrenv1.PullImageEvent{
		{Phase: "resolve", Message: "resolving " + r.Ref},
		{Phase: "layer", Layers: 2, Layer: 0, Digest: "sha256:aaaaaaaaaaaaaaaa", Status: "waiting"},
		{Phase: "layer", Layers: 2, Layer: 1, Digest: "sha256:bbbbbbbbbbbbbbbb", Status: "waiting"},
		{Phase: "layer", Layers: 2, Layer: 0, Digest: "sha256:aaaaaaaaaaaaaaaa", Status: "exists"},
		{Phase: "layer", Layers: 2, Layer: 1, Digest: "sha256:bbbbbbbbbbbbbbbb", Status: "downloading", Current: 10, Total: 100},
		{Phase: "layer", Layers: 2, Layer: 1, Digest: "sha256:bbbbbbbbbbbbbbbb", Status: "done", Current: 100, Total: 100},
		{Phase: "record", Layers: 2, Message: "writing image record x"},
	} {
		if err := send(e); err != nil {
			return err
		}
	}
	if strings.Contains(r.Ref, "missing") {
		return errdefs.NotFoundf("image not found in the registry")
	}
	return send(&warrenv1.PullImageEvent{Phase: "done", Image: &warrenv1.Image{Name: "x", Id: "sha256:feed", Layers: []string{"a", "b"}, SizeBytes: 2048}})
}

func (f *fakeManager) BuildLayer(_ context.Context, r *warrenv1.BuildLayerRequest) (*warrenv1.Layer, error) {
	f.mu.Lock()
	f.lastLayer = r
	f.mu.Unlock()
	return &warrenv1.Layer{Name: r.Name, Digest: "sha256:0123456789abcdef", Files: 2}, nil
}

func (f *fakeManager) BuildLayerTar(_ context.Context, name string, r io.Reader) (*warrenv1.Layer, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.lastLayer = &warrenv1.BuildLayerRequest{Name: name, Path: "upload:" + string(b)}
	f.mu.Unlock()
	return &warrenv1.Layer{Name: name, Digest: "sha256:0123456789abcdef", Files: 1}, nil
}

func (f *fakeManager) ListLayers(context.Context, *warrenv1.ListLayersRequest) (*warrenv1.ListLayersResponse, error) {
	return &warrenv1.ListLayersResponse{Layers: []*warrenv1.Layer{
		{Name: "zeta", Digest: "sha256:2222222222222222", BlobSizeBytes: 4096, Files: 1},
		{Name: "alpha", Digest: "sha256:1111111111111111", BlobSizeBytes: 1 << 20, Files: 10},
	}}, nil
}

func (f *fakeManager) RemoveLayer(_ context.Context, r *warrenv1.RemoveLayerRequest) (*warrenv1.RemoveLayerResponse, error) {
	if r.Name == "busy" {
		return nil, errdefs.Conflictf("layer busy is used by sandbox sb1")
	}
	f.mu.Lock()
	f.removed = append(f.removed, r.Name)
	f.mu.Unlock()
	return &warrenv1.RemoveLayerResponse{}, nil
}

func (f *fakeManager) ImageStats(_ context.Context, r *warrenv1.ImageStatsRequest) (*warrenv1.ImageStatsResponse, error) {
	owner := "debian"
	if len(r.Names) > 0 {
		owner = r.Names[0]
	}
	return &warrenv1.ImageStatsResponse{Layers: []*warrenv1.LayerStat{
		{Owner: owner, Digest: "sha256:3333333333333333", Format: "erofs", Size: 8192, Resident: 2048, Files: 5, Mounted: true, Refs: 2,
			BlobResident: 1024, FilesResident: 2048, DirectIo: true, ReadAheadKb: 128},
	}}, nil
}

func (f *fakeManager) VerifyImage(_ context.Context, r *warrenv1.VerifyImageRequest) (*warrenv1.VerifyImageResponse, error) {
	res := &warrenv1.VerifyImageResponse{Layers: []*warrenv1.LayerVerification{{Digest: "sha256:a", Ok: true}}}
	if len(r.Names) > 0 && r.Names[0] == "bad" {
		res.Layers = append(res.Layers, &warrenv1.LayerVerification{Digest: "sha256:b", Owner: "bad", Error: "internal: layer sha256:b is corrupt"})
	}
	return res, nil
}

func (f *fakeManager) Version(context.Context, *warrenv1.VersionRequest) (*warrenv1.VersionResponse, error) {
	return &warrenv1.VersionResponse{Version: "v9", Backends: []string{"container"}, CgroupMode: "v2"}, nil
}

func startDaemon(t *testing.T) (*fakeManager, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "wcli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeManager{root: filepath.Join(dir, "root")}
	os.Mkdir(f.root, 0o755)
	sock := filepath.Join(dir, "w.sock")
	s, err := server.New(server.Config{SocketPath: sock, Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx, f); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f, "unix://" + sock
}

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, addr, stdin string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	all := append([]string{"--addr", addr}, args...)
	code := Run(context.Background(), all, strings.NewReader(stdin), &out, &errb)
	return result{code, out.String(), errb.String()}
}

func TestUsageErrors(t *testing.T) {
	_, addr := startDaemon(t)
	for _, args := range [][]string{
		{"sandbox", "create"},
		{"sandbox", "create", "--image", "x", "--memory", "lots"},
		{"sandbox", "create", "--image", "x", "--label", "nokey"},
		{"sandbox", "create", "--bogus"},
		{"nosuchcommand"},
		{"sandbox", "nosuch"},
		{"sandbox", "get"},
		{"sandbox", "exec", "sb1"},
		{"sandbox", "exec", "--shell", "x", "sb1", "ls"},
		{"sandbox", "rm"},
		{"sandbox", "rm", "--all", "x"},
		{"sandbox", "cp", "a", "b"},
		{"sandbox", "cp", "sb1:/a", "sb2:/b"},
		{"sandbox", "extend", "sb1"},
		{"image", "build", "ubuntu", "x"},
	} {
		r := run(t, addr, "", args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "error: ") {
			t.Errorf("%v: code %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

func TestErrorOutput(t *testing.T) {
	_, addr := startDaemon(t)
	r := run(t, addr, "", "sandbox", "get", "nope")
	if r.code != 1 || r.stderr != "error: not_found: sandbox nope not found\n" {
		t.Fatalf("%+v", r)
	}
	r = run(t, "unix:///nonexistent/w.sock", "", "sandbox", "ls")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "error: unavailable: ") {
		t.Fatalf("no daemon: %+v", r)
	}
	r = run(t, addr, "", "sandbox", "rm", "a", "missing", "b")
	if r.code != 1 || !strings.Contains(r.stderr, "not_found") || !strings.Contains(r.stdout, "a\n") || !strings.Contains(r.stdout, "b\n") {
		t.Fatalf("rm: %+v", r)
	}
}

func TestCreate(t *testing.T) {
	f, addr := startDaemon(t)
	r := run(t, addr, "", "sandbox", "create", "--image", "debian", "--id", "x1", "--cpu", "1.5", "--memory", "512Mi",
		"--pids", "64", "-e", "A=1", "-e", "B=x=y", "--label", "team=rl", "--timeout", "30m", "--hostname", "h", "--workdir", "/w",
		"--layer", "ws", "--layer", "tools")
	if r.code != 0 || r.stdout != "x1\n" {
		t.Fatalf("%+v", r)
	}
	c := f.lastCreate
	if c.Image != "debian" || c.Resources.CpuMillis != 1500 || c.Resources.MemoryBytes != 512<<20 || c.Resources.PidsMax != 64 ||
		c.Env["A"] != "1" || c.Env["B"] != "x=y" || c.Labels["team"] != "rl" || c.TimeoutSeconds != 1800 || c.Hostname != "h" || c.Workdir != "/w" ||
		strings.Join(c.Layers, ",") != "ws,tools" {
		t.Fatalf("request %v", c)
	}
	r = run(t, addr, "", "--json", "sandbox", "create", "--image", "debian")
	var sb map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb["id"] != "gen-1" || sb["state"] != "SANDBOX_STATE_RUNNING" {
		t.Fatalf("json: %v %q", err, r.stdout)
	}
}

func TestListAndRemoveAll(t *testing.T) {
	f, addr := startDaemon(t)
	now := time.Now().UnixMilli()
	f.sandboxes = []*warrenv1.Sandbox{
		{Id: "b", Image: "debian", State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING, Labels: map[string]string{"run": "1"}, CreatedAtUnixMs: now - 90_000, ExpiresAtUnixMs: now + 3_600_000},
		{Id: "a", Image: "busybox", State: warrenv1.SandboxState_SANDBOX_STATE_STOPPED, Resources: &warrenv1.Resources{CpuMillis: 500, MemoryBytes: 1 << 30}},
	}
	r := run(t, addr, "", "sandbox", "ls")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "a ") ||
		!strings.Contains(lines[1], "stopped") || !strings.Contains(lines[1], "1Gi") || !strings.Contains(lines[2], "run=1") {
		t.Fatalf("%+v", r)
	}
	r = run(t, addr, "", "--json", "sandbox", "ls", "--label", "run=1")
	var lr struct{ Sandboxes []struct{ Id string } }
	if err := json.Unmarshal([]byte(r.stdout), &lr); err != nil || len(lr.Sandboxes) != 1 || lr.Sandboxes[0].Id != "b" {
		t.Fatalf("json ls: %v %q", err, r.stdout)
	}
	r = run(t, addr, "", "sandbox", "rm", "--all", "--label", "run=1")
	if r.code != 0 || r.stdout != "b\n" || len(f.deleted) != 1 {
		t.Fatalf("rm --all: %+v %v", r, f.deleted)
	}
}

func TestExec(t *testing.T) {
	f, addr := startDaemon(t)
	f.execResult = &warrenv1.ExecResult{Stdout: []byte("out"), Stderr: []byte("err"), ExitCode: 3}
	r := run(t, addr, "", "sandbox", "exec", "-u", "1000", "-e", "K=V", "--cwd", "/tmp", "sb1", "--", "ls", "-l", "--all")
	if r.code != 3 || r.stdout != "out" || r.stderr != "err" {
		t.Fatalf("%+v", r)
	}
	e := f.lastExec
	if e.SandboxId != "sb1" || strings.Join(e.Argv, " ") != "ls -l --all" || e.User != "1000" || e.Env["K"] != "V" || e.Cwd != "/tmp" {
		t.Fatalf("request %v", e)
	}
	// Without "--", flags after the id belong to the command too.
	run(t, addr, "", "sandbox", "exec", "sb1", "ls", "-l")
	if strings.Join(f.lastExec.Argv, " ") != "ls -l" {
		t.Fatalf("argv %q", f.lastExec.Argv)
	}
	f.execResult = &warrenv1.ExecResult{Stdout: []byte("x"), ExitCode: -1, Signal: 9, StdoutTruncated: true, StdoutDroppedBytes: 10}
	r = run(t, addr, "in", "sandbox", "exec", "-i", "--shell", "cat", "--timeout", "2s", "--output-limit", "1Ki", "sb1")
	if r.code != 137 || !strings.Contains(r.stderr, "stdout truncated, 10 bytes dropped") || !strings.Contains(r.stderr, "signal 9") {
		t.Fatalf("%+v", r)
	}
	if e := f.lastExec; e.Shell != "cat" || string(e.Stdin) != "in" || e.TimeoutMs != 2000 || e.OutputLimitBytes != 1024 {
		t.Fatalf("request %v", e)
	}
	f.execResult = &warrenv1.ExecResult{Stdout: []byte("so"), Stderr: []byte("se"), TimedOut: true, ExitCode: -1, Signal: 9}
	r = run(t, addr, "", "sandbox", "exec", "--stream", "sb1", "sleep", "9")
	if r.code != 124 || r.stdout != "so" || !strings.HasPrefix(r.stderr, "se") || !strings.Contains(r.stderr, "timed out") {
		t.Fatalf("stream: %+v", r)
	}
	f.execResult = &warrenv1.ExecResult{Stdout: []byte("ok")}
	r = run(t, addr, "", "--json", "sandbox", "exec", "sb1", "true")
	if r.code != 0 || !strings.Contains(r.stdout, `"stdout": "b2s="`) {
		t.Fatalf("json: %+v", r)
	}
}

func TestCopy(t *testing.T) {
	f, addr := startDaemon(t)
	local := t.TempDir()
	src := filepath.Join(local, "proj")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "a.txt"), []byte("A"), 0o600)
	os.Symlink("sub/a.txt", filepath.Join(src, "link"))
	os.WriteFile(filepath.Join(local, "one.txt"), []byte("ONE"), 0o640)
	os.Mkdir(filepath.Join(f.root, "work"), 0o755)

	check := func(p, want string) {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil || string(b) != want {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
	mustRun := func(args ...string) {
		t.Helper()
		if r := run(t, addr, "", args...); r.code != 0 {
			t.Fatalf("%v: %+v", args, r)
		}
	}
	// Directory into an existing directory, and to a new name.
	mustRun("sandbox", "cp", src, "sb1:/work")
	check(filepath.Join(f.root, "work/proj/sub/a.txt"), "A")
	if l, _ := os.Readlink(filepath.Join(f.root, "work/proj/link")); l != "sub/a.txt" {
		t.Errorf("symlink %q", l)
	}
	os.Symlink("work", filepath.Join(f.root, "wl"))
	mustRun("sandbox", "cp", filepath.Join(src, "sub"), "sb1:/wl")
	check(filepath.Join(f.root, "work/sub/a.txt"), "A")
	mustRun("sandbox", "cp", src, "sb1:/work/renamed")
	check(filepath.Join(f.root, "work/renamed/sub/a.txt"), "A")
	// File into a directory, and to a new name.
	mustRun("sandbox", "cp", filepath.Join(local, "one.txt"), "sb1:/work")
	check(filepath.Join(f.root, "work/one.txt"), "ONE")
	mustRun("sandbox", "cp", filepath.Join(local, "one.txt"), "sb1:/work/two.txt")
	check(filepath.Join(f.root, "work/two.txt"), "ONE")
	if fi, _ := os.Stat(filepath.Join(f.root, "work/two.txt")); fi == nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", fi)
	}

	// And back.
	out := t.TempDir()
	mustRun("sandbox", "cp", "sb1:/work/proj", out)
	check(filepath.Join(out, "proj/sub/a.txt"), "A")
	mustRun("sandbox", "cp", "sb1:/work/proj", filepath.Join(out, "new"))
	check(filepath.Join(out, "new/sub/a.txt"), "A")
	mustRun("sandbox", "cp", "sb1:/work/two.txt", out)
	check(filepath.Join(out, "two.txt"), "ONE")
	mustRun("sandbox", "cp", "sb1:/work/two.txt", filepath.Join(out, "three.txt"))
	check(filepath.Join(out, "three.txt"), "ONE")

	// Tar on stdout.
	r := run(t, addr, "", "sandbox", "cp", "sb1:/work/two.txt", "-")
	if r.code != 0 || !strings.Contains(r.stdout, "ONE") || !strings.Contains(r.stdout, path.Base("two.txt")) {
		t.Fatalf("tar to stdout: %+v", r)
	}
	r = run(t, addr, "", "sandbox", "cp", "sb1:/nope", out)
	if r.code != 1 || !strings.HasPrefix(r.stderr, "error: not_found: ") {
		t.Fatalf("missing: %+v", r)
	}
}

func TestVersion(t *testing.T) {
	_, addr := startDaemon(t)
	r := run(t, addr, "", "version")
	if r.code != 0 || !strings.Contains(r.stdout, "Client: ") || !strings.Contains(r.stdout, "Server: v9") {
		t.Fatalf("%+v", r)
	}
	r = run(t, "unix:///nonexistent.sock", "", "version")
	if r.code != 0 || !strings.Contains(r.stdout, "Server: unreachable") {
		t.Fatalf("%+v", r)
	}
	r = run(t, addr, "", "--json", "version")
	var v struct{ Client, Server map[string]any }
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Server["version"] != "v9" {
		t.Fatalf("json: %v %q", err, r.stdout)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"512Mi": 512 << 20, "1.5Gi": 3 << 29, "100M": 100e6, "4096": 4096, "1KiB": 1024, "2k": 2000, "1G": 1e9, "7B": 7,
	} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("%s: %d %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "-1Mi", "1Xi", "Mi"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
	if formatBytes(512<<20) != "512Mi" || formatBytes(1536) != "1.5Ki" || formatBytes(10) != "10B" {
		t.Error(formatBytes(512<<20), formatBytes(1536), formatBytes(10))
	}
}

func TestLayersAndImages(t *testing.T) {
	f, addr := startDaemon(t)
	// Commit.
	r := run(t, addr, "", "sandbox", "commit", "sb1", "snap")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "snap 0123456789ab 8Ki 3 files") || !strings.Contains(r.stderr, "of 2 files (--keep-setuid keeps them)") {
		t.Fatalf("commit: %+v", r)
	}
	if r := run(t, addr, "", "--json", "sandbox", "commit", "--keep-setuid", "sb1", "snap"); r.code != 0 || !strings.Contains(r.stdout, `"setuidKept": true`) || r.stderr != "" {
		t.Fatalf("commit --keep-setuid: %+v", r)
	}
	if r := run(t, addr, "", "sandbox", "commit", "nope", "snap"); r.code != 1 || !strings.Contains(r.stderr, "not_found") {
		t.Fatalf("commit of a missing sandbox: %+v", r)
	}
	if r := run(t, addr, "", "sandbox", "commit", "sb1"); r.code != 2 {
		t.Fatalf("commit without a name: %+v", r)
	}

	// Layer build: by path on a local daemon, uploaded with --upload or
	// from stdin.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("content"), 0o644)
	r = run(t, addr, "", "layer", "build", "ws", dir)
	if r.code != 0 || f.lastLayer.GetPath() != dir || f.lastLayer.GetName() != "ws" || !strings.HasPrefix(r.stdout, "ws 0123456789ab") {
		t.Fatalf("build by path: %+v %v", r, f.lastLayer)
	}
	r = run(t, addr, "", "layer", "build", "--upload", "ws", dir)
	if r.code != 0 || !strings.HasPrefix(f.lastLayer.GetPath(), "upload:") || !strings.Contains(f.lastLayer.GetPath(), "content") {
		t.Fatalf("build by upload: %+v %v", r, f.lastLayer)
	}
	r = run(t, addr, "tarball", "--json", "layer", "build", "ws2", "-")
	if r.code != 0 || f.lastLayer.GetPath() != "upload:tarball" || !strings.Contains(r.stdout, `"name": "ws2"`) {
		t.Fatalf("build from stdin: %+v %v", r, f.lastLayer)
	}
	if r := run(t, addr, "", "layer", "build", "ws", filepath.Join(dir, "missing")); r.code != 1 {
		t.Fatalf("build of a missing path: %+v", r)
	}

	// ls, rm.
	r = run(t, addr, "", "layer", "ls")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "alpha ") || !strings.Contains(lines[1], "1Mi") || !strings.HasPrefix(lines[2], "zeta ") {
		t.Fatalf("layer ls: %+v", r)
	}
	r = run(t, addr, "", "layer", "rm", "a", "busy", "b")
	if r.code != 1 || r.stdout != "a\nb\n" || !strings.Contains(r.stderr, "conflict: layer busy is used") {
		t.Fatalf("layer rm: %+v", r)
	}

	// image import REF streams progress (one line per change when not on
	// a terminal); relative oci: paths are made absolute for the daemon.
	r = run(t, addr, "", "image", "import", "reg.example.com/x:1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "x sha256:feed 2Ki 2 layers") || f.lastPull.GetRef() != "reg.example.com/x:1" {
		t.Fatalf("import: %+v %v", r, f.lastPull)
	}
	for _, want := range []string{"resolving reg.example.com/x:1", "aaaaaaaaaaaa already stored", "bbbbbbbbbbbb downloading", "bbbbbbbbbbbb done", "writing image record x"} {
		if !strings.Contains(strings.Join(strings.Fields(r.stderr), " "), want) {
			t.Errorf("progress lacks %q:\n%s", want, r.stderr)
		}
	}
	r = run(t, addr, "", "image", "import", "myname", "docker://reg.example.com/y:2", "--platform", "linux/arm64")
	if r.code != 0 || f.lastPull.GetName() != "myname" || f.lastPull.GetPlatform() != "linux/arm64" {
		t.Fatalf("import NAME REF: %+v %v", r, f.lastPull)
	}
	wd, _ := os.Getwd()
	r = run(t, addr, "", "image", "import", "oci:layoutdir:v1")
	if r.code != 0 || f.lastPull.GetRef() != "oci:"+filepath.Join(wd, "layoutdir")+":v1" {
		t.Fatalf("import oci: %+v %v", r, f.lastPull)
	}
	r = run(t, addr, "", "image", "import", "reg.example.com/missing:1")
	if r.code != 1 || !strings.Contains(r.stderr, "not_found") {
		t.Fatalf("failed import: %+v", r)
	}

	// stats, verify.
	r = run(t, addr, "", "image", "stats")
	if r.code != 0 || !strings.Contains(r.stdout, "debian") || !strings.Contains(r.stdout, "25.0%") || !strings.Contains(r.stdout, "yes") || !strings.Contains(r.stdout, "direct ra=128k") {
		t.Fatalf("stats: %+v", r)
	}
	r = run(t, addr, "", "--json", "image", "stats", "layer:ws")
	if r.code != 0 || !strings.Contains(r.stdout, `"owner": "layer:ws"`) {
		t.Fatalf("stats --json: %+v", r)
	}
	r = run(t, addr, "", "image", "verify")
	if r.code != 0 || r.stdout != "sha256:a ok\n" {
		t.Fatalf("verify: %+v", r)
	}
	r = run(t, addr, "", "image", "verify", "bad")
	if r.code != 1 || !strings.Contains(r.stderr, "sha256:b (bad): internal: layer sha256:b is corrupt") || !strings.Contains(r.stderr, "1 of 2 layers are corrupt") {
		t.Fatalf("verify bad: %+v", r)
	}
}

// ListSandboxEvents serves two pages for sb1.
func (f *fakeManager) ListSandboxEvents(_ context.Context, r *warrenv1.ListSandboxEventsRequest) (*warrenv1.ListSandboxEventsResponse, error) {
	if r.SandboxId != "sb1" {
		return nil, errdefs.NotFoundf("sandbox %s not found", r.SandboxId)
	}
	if r.PageToken == "" {
		return &warrenv1.ListSandboxEventsResponse{NextPageToken: "1", Events: []*warrenv1.SecurityEvent{
			{Seq: 1, TimeUnixMs: 1700000000000, Kind: "oom_kill", Count: 2, Process: "pid 7", Detail: "2 process(es) killed"}}}, nil
	}
	return &warrenv1.ListSandboxEventsResponse{Events: []*warrenv1.SecurityEvent{
		{Seq: 2, TimeUnixMs: 1700000001000, Kind: "pids_limit", Count: 1, Detail: "1 fork(s) refused", Suppressed: 3}}}, nil
}

// TestSandboxEvents: `sandbox events` pages through every event, as a
// table or JSON; an unknown sandbox is not found.
func TestSandboxEvents(t *testing.T) {
	_, addr := startDaemon(t)
	r := run(t, addr, "", "sandbox", "events", "sb1")
	if r.code != 0 || !strings.Contains(r.stdout, "oom_kill") || !strings.Contains(r.stdout, "pid 7") ||
		!strings.Contains(r.stdout, "pids_limit") || !strings.Contains(r.stdout, "3 earlier events suppressed") {
		t.Fatalf("table: %+v", r)
	}
	r = run(t, addr, "", "sandbox", "events", "--json", "sb1")
	if r.code != 0 || strings.Count(r.stdout, `"kind"`) != 2 {
		t.Fatalf("json: %+v", r)
	}
	if r := run(t, addr, "", "sandbox", "events", "nope"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("unknown sandbox: %+v", r)
	}
}

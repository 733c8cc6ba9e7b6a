package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/container"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/metrics"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/testutil"
)

// The integration tests run the Manager against the real container
// backend: root, namespaces, cgroups, overlayfs and a busybox image.

var (
	busyboxOnce sync.Once
	busyboxDir  string
	busyboxErr  error
	envSeq      atomic.Int32
)

// busyboxRoot builds a busybox root filesystem once per test process.
func busyboxRoot(t *testing.T) string {
	t.Helper()
	busyboxOnce.Do(func() {
		dir, err := os.MkdirTemp("", "warren-daemon-busybox-")
		if err != nil {
			busyboxErr = err
			return
		}
		busyboxDir = filepath.Join(dir, "root")
		busyboxErr = image.BuildBusybox(context.Background(), busyboxDir)
	})
	if busyboxErr != nil {
		t.Fatalf("build busybox root: %v", busyboxErr)
	}
	return busyboxDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if busyboxDir != "" {
		_ = os.RemoveAll(filepath.Dir(busyboxDir))
	}
	os.Exit(code)
}

// env is one daemon instance over real directories, restartable.
type env struct {
	t        *testing.T
	dir      string
	opts     container.Options
	images   *image.Store
	metrics  *metrics.Metrics
	m        *Manager
	cfgTweak func(*Config)
	// ctr is the container backend start made: closed by stop even when
	// a tweak wrapped it in a backend the Manager cannot close.
	ctr *container.Backend
}

func newEnv(t *testing.T, tweak ...func(*Config)) *env {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	e := &env{
		t:   t,
		dir: dir,
		opts: container.Options{
			StateDir:     filepath.Join(dir, "backend"),
			RunDir:       filepath.Join(dir, "run"),
			CgroupParent: fmt.Sprintf("warren-dtest-%d-%d", os.Getpid(), envSeq.Add(1)),
		},
	}
	if len(tweak) > 0 {
		e.cfgTweak = tweak[0]
	}
	e.openImages()
	if _, err := e.images.ImportDir(context.Background(), "busybox", busyboxRoot(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanup)
	e.start()
	return e
}

// openImages opens the image store as `warren serve` does, with the
// layer mount cache under the run dir.
func (e *env) openImages() {
	e.t.Helper()
	imgs, err := image.OpenStore(image.Options{
		Root:     filepath.Join(e.dir, "images"),
		MountDir: filepath.Join(e.opts.RunDir, "layers"),
		WorkDir:  filepath.Join(e.dir, "tmp"),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.images = imgs
	e.t.Cleanup(func() {
		imgs.Close()
		imgs.Mounts().UnmountAll()
	})
}

// start creates a Manager (again), as `warren serve` would at boot.
func (e *env) start() {
	e.t.Helper()
	if e.images == nil {
		e.openImages()
	}
	b, err := container.New(e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	e.ctr = b
	e.metrics = metrics.New()
	cfg := Config{
		StateDir: filepath.Join(e.dir, "state"),
		Backends: map[string]backend.Backend{"container": b},
		Images:   e.images,
		Metrics:  e.metrics,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if e.cfgTweak != nil {
		e.cfgTweak(&cfg)
	}
	m, err := New(context.Background(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.m = m
}

// stop closes the Manager, leaving the sandboxes running, and then the
// image store (the layers of running sandboxes stay mounted), as `warren
// serve` does when it stops.
func (e *env) stop() {
	e.t.Helper()
	if e.m != nil {
		if err := e.m.Close(); err != nil {
			e.t.Errorf("close: %v", err)
		}
		e.m = nil
	}
	if e.ctr != nil {
		_ = e.ctr.Close()
		e.ctr = nil
	}
	if e.images != nil {
		if err := e.images.Close(); err != nil {
			e.t.Errorf("close image store: %v", err)
		}
		e.images = nil
	}
}

func (e *env) cleanup() {
	ctx := context.Background()
	if e.m != nil {
		list, _ := e.m.List(ctx, &warrenv1.ListRequest{})
		for _, sb := range list.GetSandboxes() {
			if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: sb.GetId()}); err != nil {
				e.t.Errorf("cleanup: delete %s: %v", sb.GetId(), err)
			}
		}
		e.stop()
	}
	if b, err := container.New(e.opts); err == nil {
		if err := b.Sweep(ctx, nil); err != nil {
			e.t.Errorf("cleanup: sweep: %v", err)
		}
		if err := b.Close(); err != nil {
			e.t.Errorf("cleanup: close backend: %v", err)
		}
	}
	for _, g := range cgroupDirs(e.opts.CgroupParent) {
		_ = os.Remove(g)
	}
	// Every sandbox is gone: closing the store (in stop) unmounted every
	// layer.
	if left := mountsBelow(e.t, e.dir); len(left) > 0 {
		e.t.Errorf("cleanup: mounts left behind: %v", left)
		for i := len(left) - 1; i >= 0; i-- {
			_ = syscall.Unmount(left[i], syscall.MNT_DETACH)
		}
	}
}

// mountsBelow lists the mount points at or below dir.
func mountsBelow(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.Under(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		out = append(out, m.Point)
	}
	return out
}

func cgroupDirs(parent string) []string {
	if cgroups.Mode() == "v2" {
		return []string{filepath.Join(cgroups.Root, parent)}
	}
	var out []string
	for _, n := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "devices", "unified", "cpuset"} {
		out = append(out, filepath.Join(cgroups.Root, n, parent))
	}
	return out
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) create(req *warrenv1.CreateRequest) *warrenv1.Sandbox {
	e.t.Helper()
	if req.Image == "" {
		req.Image = "busybox"
	}
	sb, err := e.m.Create(ctxT(e.t), req)
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	return sb
}

func (e *env) exec(req *warrenv1.ExecRequest) *warrenv1.ExecResult {
	e.t.Helper()
	res, err := e.m.Exec(ctxT(e.t), req)
	if err != nil {
		e.t.Fatalf("exec %v%q: %v", req.Argv, req.Shell, err)
	}
	return res
}

func (e *env) sh(id, script string) *warrenv1.ExecResult {
	e.t.Helper()
	return e.exec(&warrenv1.ExecRequest{SandboxId: id, Shell: script})
}

// killInit kills a sandbox's init from the host, as a crash would.
func killInit(t *testing.T, m *Manager, id string) {
	t.Helper()
	s, err := m.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	blob := s.backendState
	s.mu.Unlock()
	killPid(t, blob)
}

func wantCat(t *testing.T, err error, c errdefs.Category, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want a %s error containing %q, got nil", c, substr)
	}
	if errdefs.CategoryOf(err) != c || !strings.Contains(err.Error(), substr) {
		t.Fatalf("want a %s error containing %q, got %s: %v", c, substr, errdefs.CategoryOf(err), err)
	}
}

// eventually polls f until it returns true or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Histogram != nil:
		return float64(d.Histogram.GetSampleCount())
	}
	return 0
}

func (e *env) gauge(state string) float64 {
	return metricValue(e.t, e.metrics.Sandboxes.WithLabelValues(state))
}

func (e *env) deleted(reason string) float64 {
	return metricValue(e.t, e.metrics.Deleted.WithLabelValues(reason))
}

// killPid kills the init whose pid is in a container backend state blob.
func killPid(t *testing.T, blob []byte) {
	t.Helper()
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(blob, &st); err != nil || st.Pid <= 1 {
		t.Fatalf("backend state %s: %v", blob, err)
	}
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// SIGKILL is asynchronous (a pid namespace's init first waits for all
	// its processes to die): wait until it has exited, as a crash that a
	// later step relies on would have.
	for i := 0; i < 1000; i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", st.Pid))
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("sandbox init %d still alive 10s after SIGKILL", st.Pid)
}

// sweepLeftovers lists what is left on the host of sandbox id.
func sweepLeftovers(e *env, id string) string {
	var left []string
	paths := []string{filepath.Join(e.opts.RunDir, "sb", id), filepath.Join(e.opts.StateDir, "sandboxes", id)}
	for _, g := range cgroupDirs(e.opts.CgroupParent) {
		paths = append(paths, filepath.Join(g, id))
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	return strings.Join(left, " ")
}

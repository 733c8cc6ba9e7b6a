package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/tarx"
)

// Options say which daemon a benchmark drives.
type Options struct {
	// Addr is the address of a running daemon; "" starts a private one.
	Addr string
	// Image is an existing image of that daemon to use; "" builds a
	// busybox root filesystem and imports it (removed again at the end).
	Image string
	// Exe is the warren binary of the private daemon (default: this
	// executable).
	Exe string
	// Progress receives one line per setup step (nil: discarded).
	Progress io.Writer
	// UserAgent identifies the benchmark to the daemon.
	UserAgent string
	// ScratchDiskBytes > 0 puts the private daemon's state directory on
	// a filesystem of its own (see scratchdisk.go), so that disk writes
	// can be measured without the host's other writers.
	ScratchDiskBytes int64
	// ScratchReadAheadKB is the scratch disk's read_ahead_kb (0: the
	// backing disk's).
	ScratchReadAheadKB int
	// DaemonArgs are extra `warren serve` flags of the private daemon.
	DaemonArgs []string
}

// Env is a daemon ready for a benchmark, plus a local busybox root
// filesystem for the peers.
type Env struct {
	Client *client.Client
	Addr   string
	// Private is true when the benchmark started the daemon itself.
	Private bool
	// DaemonPid is the daemon's pid, 0 when unknown (TCP daemons).
	DaemonPid int
	// Image is the image sandboxes are created from.
	Image string
	// Rootfs is the busybox root filesystem the peers run on: the same
	// tree that was imported as Image (unless Options.Image was given).
	Rootfs string
	// Tmp is this run's scratch directory.
	Tmp string
	// Labels are set on every sandbox of this run; Close deletes them.
	Labels map[string]string

	progress      io.Writer
	importedImage bool
	cmd           *exec.Cmd
	exited        chan struct{}
	exitErr       error
	cgroupParent  string
	stateDir      string   // the private daemon's
	daemonExe     string   // the private daemon's binary (restart.go)
	daemonArgs    []string // and its arguments
	diskDir       string   // scratch disk mount point, "" without one
	closeOnce     sync.Once
}

// Setup prepares the daemon, the image and the peers' root filesystem.
// The caller must Close the Env, also after errors of the benchmark.
func Setup(ctx context.Context, o Options) (_ *Env, err error) {
	tmp, err := os.MkdirTemp("", "warren-bench-")
	if err != nil {
		return nil, err
	}
	e := &Env{
		Tmp:      tmp,
		progress: o.Progress,
		Labels:   map[string]string{"warren-bench": strconv.Itoa(os.Getpid())},
	}
	if e.progress == nil {
		e.progress = io.Discard
	}
	defer func() {
		if err != nil {
			_ = e.Close()
		}
	}()
	e.Rootfs = filepath.Join(tmp, "rootfs")
	e.logf("building busybox root filesystem in %s", e.Rootfs)
	if err := image.BuildBusybox(ctx, e.Rootfs); err != nil {
		return nil, err
	}

	ua := o.UserAgent
	if ua == "" {
		ua = "warren-bench"
	}
	e.stateDir = filepath.Join(tmp, "state")
	if o.Addr == "" && o.ScratchDiskBytes > 0 {
		if err := e.mountScratchDisk(ctx, o.ScratchDiskBytes, o.ScratchReadAheadKB); err != nil {
			return nil, err
		}
	}
	if o.Addr == "" {
		if err := e.startDaemon(ctx, o.Exe, o.DaemonArgs); err != nil {
			return nil, err
		}
	} else {
		e.Addr = o.Addr
	}
	if e.Client, err = client.New(e.Addr, client.WithUserAgent(ua)); err != nil {
		return nil, err
	}
	if e.Private {
		if err := e.waitReady(ctx); err != nil {
			return nil, err
		}
	} else {
		if _, err := e.Client.Version(ctx); err != nil {
			return nil, fmt.Errorf("daemon at %s: %w", e.Addr, err)
		}
		if p := unixSocketPath(e.Addr); p != "" {
			if pid, err := socketPeerPID(p); err == nil {
				e.DaemonPid = pid
			}
		}
	}

	if o.Image != "" {
		if _, err := e.Client.GetImage(ctx, o.Image); err != nil {
			return nil, fmt.Errorf("image %s: %w", o.Image, err)
		}
		e.Image = o.Image
		return e, nil
	}
	e.Image = "warren-bench-busybox-" + strconv.Itoa(os.Getpid())
	e.logf("importing it as image %s", e.Image)
	if e.Client.IsUnix() {
		_, err = e.Client.ImportImage(ctx, e.Image, e.Rootfs)
	} else {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarx.Create(ctx, "/", pw, e.Rootfs)) }()
		_, err = e.Client.ImportImageTar(ctx, e.Image, pr)
		pr.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("import busybox image: %w", err)
	}
	e.importedImage = true
	return e, nil
}

func (e *Env) logf(format string, args ...any) {
	fmt.Fprintf(e.progress, "bench: "+format+"\n", args...)
}

// startDaemon starts `warren serve` with private directories and cgroup
// parent. It runs in its own process group so that a ^C of the benchmark
// does not reach it before the benchmark has deleted its sandboxes.
func (e *Env) startDaemon(ctx context.Context, exe string, extra []string) error {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return err
		}
	}
	sock := filepath.Join(e.Tmp, "warren.sock")
	// A second private daemon of this process (bench hardening runs two)
	// gets a parent of its own: each daemon sweeps its parent's groups.
	e.cgroupParent = "warren-bench-" + strconv.Itoa(os.Getpid())
	if n := privateDaemons.Add(1); n > 1 {
		e.cgroupParent += "-" + strconv.FormatInt(n, 10)
	}
	args := append([]string{"serve",
		"--state-dir", e.stateDir,
		"--run-dir", filepath.Join(e.Tmp, "run"),
		"--socket", sock,
		"--cgroup-parent", e.cgroupParent,
		"--log-level", "warn"}, extra...)
	e.daemonExe, e.daemonArgs = exe, args
	e.logf("starting private daemon: %s %s", exe, strings.Join(args, " "))
	return e.execDaemon()
}

var privateDaemons atomic.Int64

// execDaemon starts the private daemon's process (again, after a
// restart: its log is appended to).
func (e *Env) execDaemon() error {
	logf, err := os.OpenFile(filepath.Join(e.Tmp, "daemon.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(e.daemonExe, e.daemonArgs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	e.cmd, e.Private, e.DaemonPid, e.Addr = cmd, true, cmd.Process.Pid, "unix://"+filepath.Join(e.Tmp, "warren.sock")
	// Locals: a restart replaces e.exited while the old waiter may run.
	exited := make(chan struct{})
	e.exited = exited
	go func() {
		err := cmd.Wait()
		e.exitErr = err
		close(exited)
	}()
	return nil
}

func (e *Env) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := e.Client.Version(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-e.exited:
			return fmt.Errorf("private daemon exited (%v): %s", e.exitErr, e.daemonLogTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("private daemon not ready after 30s: %v: %s", err, e.daemonLogTail())
		}
	}
}

// DaemonLog returns the private daemon's log file, or "".
func (e *Env) DaemonLog() string {
	if !e.Private {
		return ""
	}
	return filepath.Join(e.Tmp, "daemon.log")
}

func (e *Env) daemonLogTail() string {
	b, _ := os.ReadFile(filepath.Join(e.Tmp, "daemon.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// CreateRequest returns the request every benchmark sandbox is made with.
func (e *Env) CreateRequest() *warrenv1.CreateRequest {
	return &warrenv1.CreateRequest{Image: e.Image, Labels: e.Labels, TimeoutSeconds: 3600}
}

// DeleteAll deletes the sandboxes of this run, concurrency at a time, and
// returns how many it deleted.
func (e *Env) DeleteAll(ctx context.Context, concurrency int) (int, error) {
	sbs, err := e.Client.List(ctx, e.Labels)
	if err != nil {
		return 0, err
	}
	ids := make([]string, len(sbs))
	for i, s := range sbs {
		ids[i] = s.GetId()
	}
	return len(ids), deleteIDs(ctx, e.Client, ids, concurrency)
}

func deleteIDs(ctx context.Context, cl *client.Client, ids []string, concurrency int) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		work = make(chan string)
	)
	for w := 0; w < max(1, concurrency); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				if err := cl.Delete(ctx, id); err != nil && !client.IsNotFound(err) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("delete %s: %w", id, err))
					mu.Unlock()
				}
			}
		}()
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// Close deletes this run's sandboxes (and image, when imported), stops a
// private daemon and removes the scratch directory.
func (e *Env) Close() error {
	var errs []error
	e.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if e.Client != nil && (e.exited == nil || !isClosed(e.exited)) {
			if n, err := e.DeleteAll(ctx, 8); err != nil {
				errs = append(errs, err)
			} else if n > 0 {
				e.logf("deleted %d leftover sandboxes", n)
			}
			if e.importedImage && !e.Private {
				if err := e.Client.RemoveImage(ctx, e.Image); err != nil {
					errs = append(errs, fmt.Errorf("remove image %s: %w", e.Image, err))
				}
			}
			e.Client.Close()
		}
		if e.cmd != nil {
			errs = append(errs, e.stopDaemon())
		}
		errs = append(errs, e.unmountScratchDisk())
		if m := mountsUnder(e.Tmp); len(m) > 0 {
			errs = append(errs, fmt.Errorf("%d mounts remain below %s (first %s); not removing it", len(m), e.Tmp, m[0]))
			return
		}
		if len(errs) > 0 && errors.Join(errs...) != nil && e.Private {
			e.logf("keeping %s (daemon log: %s)", e.Tmp, e.DaemonLog())
			return
		}
		errs = append(errs, os.RemoveAll(e.Tmp))
	})
	return errors.Join(errs...)
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// stopDaemon sends SIGTERM, waits (SIGKILL after 30 s) and removes the
// daemon's now empty cgroup parent groups.
func (e *Env) stopDaemon() error {
	if !isClosed(e.exited) {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(30 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.exited
			return fmt.Errorf("private daemon did not stop within 30s of SIGTERM; killed")
		}
	}
	// The daemon leaves its (empty) parent groups behind.
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", e.cgroupParent))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", e.cgroupParent))
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			e.logf("could not remove cgroup %s: %v", d, err)
		}
	}
	return nil
}

// waitTrashEmpty waits until the private daemon's trash (deleted
// sandboxes' writable layers its reaper has not removed yet) is empty and
// returns how long that took; ok is false for a daemon given by --addr,
// whose state directory the benchmark does not know, or on timeout.
func (e *Env) waitTrashEmpty(timeout time.Duration) (float64, bool) {
	if e.stateDir == "" {
		return 0, false
	}
	t0 := time.Now()
	for time.Since(t0) < timeout {
		ents, err := os.ReadDir(filepath.Join(e.stateDir, "trash"))
		if err != nil || len(ents) == 0 {
			return time.Since(t0).Seconds(), err == nil || os.IsNotExist(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, false
}

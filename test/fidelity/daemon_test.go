package fidelity

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/testutil"
)

// daemon is one `warren serve` of the tree with private state and run
// directories and its own cgroup parent, as test/e2e's harness starts
// them (a smaller copy: this package needs one daemon, no restarts).
type daemon struct {
	t       *testing.T
	root    string
	parent  string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	c       *client.Client
}

// startDaemon builds the tree's warren statically (as `make build` does)
// and serves it below a private root. At the end of the test the
// sandboxes are deleted, the daemon stopped, and the node checked: no
// mount below the root, no cgroup under the parent, no process in it.
func startDaemon(t *testing.T) *daemon {
	t.Helper()
	bin := testutil.StaticBinary(t, "./cmd/warren")
	// Short paths: agent sockets live below the run dir (108-byte limit).
	root, err := os.MkdirTemp("", "wfid-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, root: root, parent: fmt.Sprintf("warren-fidelity-%d", os.Getpid()),
		logPath: filepath.Join(root, "daemon.log"), exited: make(chan struct{})}
	t.Cleanup(d.forceClean)
	logf, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "warren.sock")
	d.cmd = exec.Command(bin, "serve", "--state-dir", filepath.Join(root, "state"), "--run-dir", filepath.Join(root, "run"),
		"--socket", sock, "--cgroup-parent", d.parent)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	logf.Close()
	go func() { _ = d.cmd.Wait(); close(d.exited) }()
	if d.c, err = client.New("unix://"+sock, client.WithToken("")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := d.c.Version(ctx)
		cancel()
		if err == nil {
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("daemon exited during start-up:\n%s", d.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready after 30 s: %v\n%s", err, d.logTail())
		}
		time.Sleep(30 * time.Millisecond)
	}
}

func (d *daemon) logTail() string {
	b, _ := os.ReadFile(d.logPath)
	return tail(string(b), 4000)
}

// stop deletes every sandbox, stops the daemon with SIGTERM and checks
// that it left nothing on the node.
func (d *daemon) stop() {
	t := d.t
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sbs, err := d.c.List(ctx, nil)
	if err != nil {
		t.Errorf("cleanup: list sandboxes: %v", err)
	}
	for _, sb := range sbs {
		if err := d.c.Delete(ctx, sb.Id); err != nil && !client.IsNotFound(err) {
			t.Errorf("cleanup: delete %s: %v", sb.Id, err)
		}
	}
	d.c.Close()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Errorf("cleanup: the daemon did not stop within 30 s of SIGTERM")
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := d.leftovers()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("cleanup: the daemon left %v", left)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if t.Failed() {
		t.Logf("daemon log (tail):\n%s", d.logTail())
	}
}

// leftovers lists mounts below the root, cgroups under the parent and
// processes in them.
func (d *daemon) leftovers() []string {
	var out []string
	ms, _ := mountinfo.Under(d.root)
	for _, m := range ms {
		out = append(out, "mount "+m.Point)
	}
	for _, g := range d.cgroups() {
		ents, _ := os.ReadDir(g)
		for _, e := range ents {
			if e.IsDir() {
				out = append(out, "cgroup "+filepath.Join(g, e.Name()))
			}
		}
	}
	for _, pid := range d.procs() {
		out = append(out, "process "+strconv.Itoa(pid))
	}
	return out
}

// cgroups lists the parent cgroup in every hierarchy.
func (d *daemon) cgroups() []string {
	var out []string
	if fi, err := os.Stat(filepath.Join("/sys/fs/cgroup", d.parent)); err == nil && fi.IsDir() {
		out = append(out, filepath.Join("/sys/fs/cgroup", d.parent))
	}
	ms, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.parent))
	return append(out, ms...)
}

// procs lists the processes in the parent's cgroups.
func (d *daemon) procs() []int {
	var out []int
	seen := map[int]bool{}
	for _, g := range d.cgroups() {
		_ = filepath.WalkDir(g, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// forceClean removes whatever is left, whatever the daemon did.
func (d *daemon) forceClean() {
	select {
	case <-d.exited:
	default:
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	for range 100 {
		procs := d.procs()
		if len(procs) == 0 {
			break
		}
		for _, pid := range procs {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ms, _ := mountinfo.Under(d.root)
	sort.Slice(ms, func(i, j int) bool { return len(ms[i].Point) > len(ms[j].Point) })
	for _, m := range ms {
		_ = unix.Unmount(m.Point, unix.MNT_DETACH)
	}
	for _, g := range d.cgroups() {
		var dirs []string
		_ = filepath.WalkDir(g, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
	_ = os.RemoveAll(d.root)
}

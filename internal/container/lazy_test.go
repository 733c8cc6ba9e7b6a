package container

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/testutil"
)

// holderScript keeps ~130 MiB of random text in a shell variable, writes
// its checksum to /tmp/s1, and writes it again to /tmp/s2 whenever
// /tmp/go appears: the memory a restore must bring back byte for byte.
const holderScript = `x=$(head -c 100000000 /dev/urandom | base64 -w0); echo "$x" | md5sum > /tmp/s1.t && mv /tmp/s1.t /tmp/s1
while :; do if [ -e /tmp/go ]; then rm /tmp/go; echo "$x" | md5sum > /tmp/s2.t; mv /tmp/s2.t /tmp/s2; fi; sleep 0.05; done`

func requireUffd(t *testing.T) {
	t.Helper()
	if err := uffdAvailable(); err != nil {
		t.Skip(err)
	}
}

// waitFile polls until path exists and returns its contents.
func waitFile(t *testing.T, path string, wait time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil {
			return string(b)
		}
	}
	t.Fatalf("%s did not appear within %v", path, wait)
	return ""
}

// checkpointLazyHolder makes a sandbox holding the random buffer, checkpoints
// it into dir (its upper becomes the returned layers' top, as a fork's
// base) and returns the checksum taken before.
func checkpointLazyHolder(t *testing.T, b *Backend, opts Options, id string) (dir string, layers []backend.Layer, sum string) {
	t.Helper()
	layers = backend.DirLayers(testutil.BusyboxRoot(t))
	sb, err := b.Create(t.Context(), backend.Spec{ID: id, Layers: layers, MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.(backend.Background).StartBackground(t.Context(), backend.ProcSpec{Argv: []string{"sh", "-c", holderScript}}, backend.BackgroundOpts{OutputCap: 1024}); err != nil {
		t.Fatal(err)
	}
	sum = waitFile(t, filepath.Join(sb.Root(), "tmp/s1"), time.Minute)
	dir = filepath.Join(opts.StateDir, "checkpoints", id)
	if err := sb.(backend.Checkpointer).Checkpoint(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(opts.StateDir, "base-"+id)
	if err := os.Rename(filepath.Join(dir, ckptUpper), base); err != nil {
		t.Fatal(err)
	}
	return dir, append([]backend.Layer{{Digest: "base-" + id, Dir: base}}, layers...), sum
}

// TestLazyRestoreMemoryIntact: sandboxes restored with lazy pages from
// one checkpoint (two forks and the source itself), whose checkpoint is
// deleted as soon as they are restored, read back every byte of their
// memory (the checksum of a 130 MiB buffer taken before the checkpoint
// matches); their lazy-pages servers finish on their own, and deleting
// them leaves no process, socket or directory behind.
func TestLazyRestoreMemoryIntact(t *testing.T) {
	requireCRIU(t)
	requireUffd(t)
	opts := testOptions(t, "lazy-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	baseline := resources(t, opts)
	dir, layers, sum := checkpointLazyHolder(t, b, opts, "lsrc")

	var sbs []*sandbox
	var servers []int
	for _, id := range []string{"lfork1", "lfork2", "lsrc"} {
		start := time.Now()
		rs, err := b.Create(t.Context(), backend.Spec{ID: id, Layers: layers, MemoryBytes: 1 << 30, Restore: dir, LazyPages: true})
		if err != nil {
			t.Fatalf("lazy restore %s: %v", id, err)
		}
		t.Logf("lazy restore %s: %v", id, time.Since(start))
		defer rs.Destroy(context.Background())
		s := rs.(*sandbox)
		pid := s.lazyPid()
		if s.lazy == nil {
			t.Fatalf("%s: restored without a lazy-pages server", id)
		}
		if lazy, why := s.MemoryRestore(); !lazy || why != "" {
			t.Errorf("%s: MemoryRestore (%v, %q), want lazy", id, lazy, why)
		}
		sbs, servers = append(sbs, s), append(servers, pid)
	}
	// The source's checkpoint goes at once (as a resumed sandbox's does,
	// or a fork's source deleted right after the fork).
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs {
		if err := os.WriteFile(filepath.Join(s.Root(), "tmp/go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range sbs {
		if got := waitFile(t, filepath.Join(s.Root(), "tmp/s2"), time.Minute); got != sum {
			t.Errorf("%s: memory after lazy restore: checksum %q, before the checkpoint %q", s.id, got, sum)
			lg, _ := os.ReadFile(filepath.Join(s.b.runDir(s.id), "lazy-pages.log"))
			oom, _ := s.grp.OOMKills()
			t.Logf("%s: OOM kills %d; lazy-pages.log: %s", s.id, oom, lg)
		}
		if r := conformance.Exec(t, s, backend.ProcSpec{Argv: []string{"echo", "ok"}}, ""); r.Stdout != "ok\n" {
			t.Errorf("%s: exec after lazy restore: %+v", s.id, r)
		}
	}
	// Every server fills the rest and exits by itself, its links gone.
	for _, s := range sbs {
		for deadline := time.Now().Add(30 * time.Second); s.LazyPending(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: lazy-pages server still running after 30 s", s.id)
			}
		}
		if ok, err := s.lazy.finished(); !ok || err != nil {
			t.Errorf("%s: lazy-pages server: %v", s.id, err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(b.stateDir(s.id), lazyImagesDir)); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: the lazy images' links stayed after the server finished", s.id)
				break
			}
		}
	}
	for _, s := range sbs {
		if err := s.Destroy(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, pid := range servers {
		if pid != 0 && unix.Kill(pid, 0) == nil {
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil && strings.Contains(string(b), "lazy-pages") {
				t.Errorf("lazy-pages server %d still running after delete", pid)
			}
		}
	}
	_ = os.RemoveAll(filepath.Join(opts.StateDir, "base-lsrc"))
	waitNoLeaks(t, opts, baseline)
}

// TestLazyServerDeathKillsSandbox: a lazily restored sandbox whose
// lazy-pages server dies before it filled the memory is killed whole
// (the pages it lacks can never come back), not left running with
// processes that hang or die one by one; deleting it leaves nothing.
func TestLazyServerDeathKillsSandbox(t *testing.T) {
	requireCRIU(t)
	requireUffd(t)
	opts := testOptions(t, "lazyk-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	baseline := resources(t, opts)
	dir, layers, _ := checkpointLazyHolder(t, b, opts, "lksrc")
	rs, err := b.Create(t.Context(), backend.Spec{ID: "lk", Layers: layers, MemoryBytes: 1 << 30, Restore: dir, LazyPages: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Destroy(context.Background())
	s := rs.(*sandbox)
	pid := s.lazyPid()
	if pid == 0 {
		t.Skip("the lazy-pages server finished before the test could kill it")
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Exited().Done():
	case <-time.After(15 * time.Second):
		t.Fatal("sandbox still running 15 s after its lazy-pages server was killed")
	}
	if err := s.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(dir)
	_ = os.RemoveAll(filepath.Join(opts.StateDir, "base-lksrc"))
	waitNoLeaks(t, opts, baseline)
}

// TestLazyServerAdoptedAfterRestart: a daemon that restarts while a
// sandbox's lazy-pages server still fills its memory takes the server on
// as its own: once it ends well its images go and the sandbox runs on;
// should it die first (killed, or a failure) the sandbox is killed whole,
// as with a server the daemon started itself; one that ended while no
// daemon ran is judged by the status its shell left. The servers here
// are stand-ins run by the same shell wrapper with the same arguments,
// so that each outcome can be chosen (the real server's death is
// TestLazyServerDeathKillsSandbox).
func TestLazyServerAdoptedAfterRestart(t *testing.T) {
	opts := testOptions(t, "lazya-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	type server struct {
		stdin *os.File
		cmd   *exec.Cmd
	}
	// serve starts a stand-in server for sandbox id that exits with
	// the status written to its stdin; ended: the status its shell left
	// instead, with no server running.
	serve := func(id, ended string) *server {
		linked := filepath.Join(b.stateDir(id), lazyImagesDir)
		if err := os.Mkdir(linked, 0o700); err != nil {
			t.Fatal(err)
		}
		status := filepath.Join(b.runDir(id), lazyStatusFile)
		if ended != "" {
			if err := os.WriteFile(status, []byte(ended+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return nil
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("/bin/sh", "-c", lazyWrapper, status,
			"/bin/sh", "-c", `read x; exit $x`, "lazy-pages", "--images-dir", linked, "--work-dir", b.runDir(id))
		cmd.Stdin = r
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		go cmd.Wait()
		t.Cleanup(func() { _ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL); w.Close() })
		return &server{stdin: w, cmd: cmd}
	}
	ids := []string{"ok", "killed", "failed", "endedok", "endedbad"}
	olds := map[string]backend.Sandbox{}
	servers := map[string]*server{}
	for _, id := range ids {
		olds[id], _ = runningSandbox(t, b, "la"+id)
		servers[id] = serve("la"+id, map[string]string{"endedok": "0", "endedbad": "137"}[id])
	}
	// The next daemon.
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	sbs := map[string]*sandbox{}
	for _, id := range ids {
		sb, err := b2.Adopt(t.Context(), "la"+id, olds[id].State())
		if err != nil {
			t.Fatal(err)
		}
		sbs[id] = sb.(*sandbox)
	}
	for _, id := range []string{"ok", "killed", "failed"} {
		if sbs[id].lazyPid() == 0 {
			t.Fatalf("sandbox la%s: the adopting daemon did not find its running lazy-pages server", id)
		}
	}
	if _, err := servers["ok"].stdin.WriteString("0\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := servers["failed"].stdin.WriteString("1\n"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(sbs["killed"].lazyPid(), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"killed", "failed", "endedbad"} {
		select {
		case <-sbs[id].Exited().Done():
		case <-time.After(15 * time.Second):
			t.Errorf("sandbox la%s still running 15 s after its lazy-pages server ended badly", id)
		}
	}
	for _, id := range []string{"ok", "endedok"} {
		linked := filepath.Join(b.stateDir("la"+id), lazyImagesDir)
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(linked); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox la%s: its lazy-pages images are still there 15 s after its server ended well", id)
			}
		}
		if r := conformance.Exec(t, sbs[id], backend.ProcSpec{Argv: []string{"echo", "alive"}}, ""); r.Stdout != "alive\n" {
			t.Errorf("sandbox la%s after its server ended well: %+v", id, r)
		}
	}
}

package container

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/testutil"
)

func TestReaper(t *testing.T) {
	root := t.TempDir()
	trash := filepath.Join(root, "trash")
	// A daemon before left more behind than the queue holds.
	for i := range reaperQueue + 10 {
		if err := os.MkdirAll(filepath.Join(trash, fmt.Sprintf("old.%d", i), "upper", "x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r, err := newReaper(trash)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	sb := filepath.Join(root, "sandboxes", "sb1")
	for _, d := range []string{"upper/usr/lib", "work/work"} {
		if err := os.MkdirAll(filepath.Join(sb, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sb, "upper/usr/lib/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.discard(sb, -1); err != nil {
		t.Fatal(err)
	}
	// The id is free at once.
	if _, err := os.Lstat(sb); !os.IsNotExist(err) {
		t.Errorf("state directory still in place: %v", err)
	}
	if err := os.MkdirAll(sb, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.discard(sb, -1); err != nil {
		t.Fatal(err)
	}
	if err := r.discard(filepath.Join(root, "missing"), -1); err != nil {
		t.Errorf("missing directory: %v", err)
	}
	r.wait()
	if ents, _ := os.ReadDir(trash); len(ents) != 0 {
		t.Errorf("trash not emptied: %v", ents)
	}
}

// TestRootPinnedPastInitExit: a live sandbox holds no descriptor of its
// root; the delete pins it before the kill, so that the root overlay
// outlives the init and the unmount's sync of the upper filesystem
// happens in the reaper rather than in the exit a delete waits for; the
// reaper lets it go.
func TestRootPinnedPastInitExit(t *testing.T) {
	opts := testOptions(t, "pin")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sb, pid := runningSandbox(t, b, "pin1")
	s := sb.(*sandbox)
	if s.root >= 0 {
		t.Fatal("a live sandbox holds a descriptor of its root")
	}
	// What Destroy does before its kill.
	s.destroyMu.Lock()
	s.pinForDelete()
	s.destroyMu.Unlock()
	if s.root < 0 {
		t.Fatal("root not pinned")
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-sb.Exited().Done()
	var fs unix.Statfs_t
	if err := unix.Fstatfs(s.root, &fs); err != nil || fs.Type != unix.OVERLAYFS_SUPER_MAGIC {
		t.Fatalf("pinned root after the init exited: type %#x, %v; want overlayfs", fs.Type, err)
	}
	root := s.root
	var pinned unix.Stat_t
	if err := unix.Fstat(root, &pinned); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s.root != -1 {
		t.Error("Destroy kept the root")
	}
	b.trash.wait()
	// The number may have been reused meanwhile by another goroutine of
	// the test process: what matters is that it no longer holds the root.
	var now unix.Stat_t
	if err := unix.Fstat(root, &now); err != unix.EBADF && (err != nil || now.Dev == pinned.Dev && now.Ino == pinned.Ino) {
		t.Errorf("pinned root fd %d still open after the reaper ran: %v", root, err)
	}
}

// TestJournalless: ext4 made without a journal is found, ext4 with one
// and tmpfs are not.
func TestJournalless(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed")
	}
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{"no journal", []string{"-O", "^has_journal"}, true},
		{"journal", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
			if err := os.Mkdir(mnt, 0o755); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"-q", "-F"}, tc.args...)
			if out, err := exec.Command("mkfs.ext4", append(args, img, "32M")...).CombinedOutput(); err != nil {
				t.Fatalf("mkfs.ext4: %v: %s", err, out)
			}
			if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
				t.Skipf("loop mount: %v: %s", err, out)
			}
			defer unix.Unmount(mnt, unix.MNT_DETACH)
			if dev, got := journalless(mnt); got != tc.want || dev == "" && tc.want {
				t.Errorf("journalless = %q, %v; want %v", dev, got, tc.want)
			}
		})
	}
	if _, got := journalless("/dev/shm"); got {
		t.Error("tmpfs reported as journal-less ext4")
	}
}

// The reaper removes a 21,000-level tree an earlier daemon left in the
// trash (os.RemoveAll gave up on it and nothing was logged), and logs
// with its path what it cannot remove (here a mount point), leaving it
// for the next start.
func TestReaperRemovesDeepTreesAndLogsWhatItCannot(t *testing.T) {
	root := t.TempDir()
	// On a tmpfs: this machine's discard-mounted root filesystem takes
	// 10 s to make and remove 21,000 directories; the walk is the same.
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	trash := filepath.Join(root, "trash")
	deep := filepath.Join(trash, "deep.1", "upper")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	chain(t, deep, 21000)
	stuck := filepath.Join(trash, "stuck.2", "upper", "mnt")
	if err := os.MkdirAll(stuck, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", stuck, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(stuck, unix.MNT_DETACH)
	var logs bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil)))
	defer slog.SetDefault(old)

	start := time.Now()
	r, err := newReaper(trash)
	if err != nil {
		t.Fatal(err)
	}
	r.wait()
	r.close()
	t.Logf("reaped in %v", time.Since(start))
	if _, err := os.Lstat(filepath.Join(trash, "deep.1")); !os.IsNotExist(err) {
		t.Errorf("the 21,000-level tree is still in the trash: %v", err)
	}
	if _, err := os.Lstat(stuck); err != nil {
		t.Errorf("the mount point went: %v", err)
	}
	if r.failures.Load() != 1 {
		t.Errorf("%d failures counted, want 1", r.failures.Load())
	}
	out := logs.String()
	if !strings.Contains(out, "stuck.2") || !strings.Contains(out, "upper/mnt") || !strings.Contains(out, "busy") {
		t.Errorf("log %q does not name the path left behind and why", out)
	}
}

// chain makes depth nested directories "d" in dir, one descriptor at a
// time (the paths are far longer than PATH_MAX).
func chain(t *testing.T, dir string, depth int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range depth {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		sub, err := unix.Openat(fd, "d", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = sub
	}
	unix.Close(fd)
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

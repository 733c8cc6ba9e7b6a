package inroot

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// makeChain makes depth directories "d" one inside the other below
// dir/name, each with a file, never holding more than two descriptors.
func makeChain(t *testing.T, dir, name string, depth int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i <= depth; i++ {
		if i > 0 {
			name = "d"
		}
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		sub, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = sub
		if i%100 == 0 {
			f, err := unix.Openat(fd, "f", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(f)
		}
	}
	unix.Close(fd)
}

// fastTempDir is a temporary directory on a tmpfs when the test may
// mount one: this machine's discard-mounted root filesystem takes seconds
// to make and remove 30,000 directories, and the walk is the same.
func fastTempDir(t *testing.T) string {
	dir := t.TempDir()
	if os.Geteuid() != 0 {
		return dir
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// RemoveAll removes a 30,000-deep tree (a recursive walk needs 30,000
// descriptors, os.RemoveAll failed at 21,000 levels) holding a bounded
// number of descriptors.
func TestRemoveAllDeepTree(t *testing.T) {
	dir := fastTempDir(t)
	start := time.Now()
	makeChain(t, dir, "top", 30000)
	t.Logf("made 30,000 levels in %v", time.Since(start))
	fd, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	base := countFDs(t)
	// Sample the descriptors while the removal runs.
	stop := make(chan struct{})
	most := make(chan int)
	go func() {
		m := 0
		for {
			select {
			case <-stop:
				most <- m
				return
			default:
			}
			if n := countFDs(t); n > m {
				m = n
			}
			time.Sleep(time.Millisecond)
		}
	}()
	start = time.Now()
	err = RemoveAll(fd, "top")
	close(stop)
	m := <-most
	t.Logf("removed in %v, %d descriptors at most (%d before, the sampler's own included)", time.Since(start), m, base)
	if err != nil {
		t.Fatalf("RemoveAll: %.300v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "top")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("top still there: %v", err)
	}
	if m > base+6 {
		t.Fatalf("%d descriptors open during the removal, %d before", m, base)
	}
}

// What cannot be removed (here a mount point) is skipped, the rest goes,
// and the error names the entry and the errno.
func TestRemoveAllReportsWhatItCannotRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	mnt := filepath.Join(dir, "top/a/b/mnt")
	for _, d := range []string{mnt, filepath.Join(dir, "top/z/y")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 20; i++ {
		os.WriteFile(filepath.Join(dir, "top/a/b/f"+strconv.Itoa(i)), nil, 0o644)
		os.WriteFile(filepath.Join(dir, "top/z/y/f"+strconv.Itoa(i)), nil, 0o644)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	fd, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	err = RemoveAll(fd, "top")
	var re *RemoveError
	if !errors.As(err, &re) || re.Path != "top/a/b/mnt" || !errors.Is(err, unix.EBUSY) {
		t.Fatalf("RemoveAll over a mount point: %v, want a RemoveError for top/a/b/mnt with EBUSY", err)
	}
	if !strings.Contains(err.Error(), "top/a/b/mnt") {
		t.Fatalf("message %q does not name the entry", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "top/*/*/*"))
	if len(left) != 1 || left[0] != mnt {
		t.Fatalf("left behind %v, want only the mount point", left)
	}
}

// A directory moved away while RemoveAll works below it stops the walk
// with ErrMoved instead of letting it carry on elsewhere.
func TestRemoveAllStopsWhenMoved(t *testing.T) {
	r := &remover{}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a/b/c"), 0o755)
	os.Mkdir(filepath.Join(dir, "elsewhere"), 0o755)
	fd, _ := OpenRoot(dir)
	defer unix.Close(fd)
	r.top = fd
	cur, ok := r.descend(fd, "a")
	if !ok {
		t.Fatal("descend a")
	}
	sub, ok := r.descend(cur, "b")
	unix.Close(cur)
	if !ok {
		t.Fatal("descend b")
	}
	if err := os.Rename(filepath.Join(dir, "a/b"), filepath.Join(dir, "elsewhere/b")); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.up(sub); ok || !errors.Is(r.err, ErrMoved) {
		t.Fatalf("up from a moved directory: %v, want ErrMoved", r.err)
	}
}

// RemoveAllUntil stops once its stop channel is closed, with ErrStopped,
// leaving the rest of the tree and no descriptor behind; a later call
// removes the rest. Stopped midway by a channel closed from another
// goroutine, it returns promptly.
func TestRemoveAllUntilStops(t *testing.T) {
	dir := fastTempDir(t)
	makeChain(t, dir, "deep", 5000)
	fds := countFDs(t)
	stop := make(chan struct{})
	close(stop)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	err = RemoveAllUntil(fd, "deep", stop)
	if !errors.Is(err, ErrStopped) {
		t.Fatalf("a removal told to stop: %v, want ErrStopped", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "deep")); err != nil {
		t.Fatalf("the tree is gone although the removal stopped: %v", err)
	}
	if n := countFDs(t); n != fds+1 {
		t.Errorf("%d descriptors after a stopped removal, want %d", n, fds+1)
	}
	// Stopped while it runs.
	stop2 := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- RemoveAllUntil(fd, "deep", stop2) }()
	time.Sleep(5 * time.Millisecond)
	close(stop2)
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, ErrStopped) {
			t.Fatalf("a removal stopped midway: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a removal told to stop still ran 10 s later")
	}
	if err := RemoveAll(fd, "deep"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "deep")); !os.IsNotExist(err) {
		t.Fatalf("the tree after the last removal: %v", err)
	}
}

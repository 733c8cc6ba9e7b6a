package tarx

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// goldenSHA256 is the SHA-256 of Create's stream of goldenTree, recorded
// with the recursive walk that held one descriptor per level (cf4f816).
// The image store hashes these streams, so the bounded walk must write
// the very same bytes.
const goldenSHA256 = "6e4395bd346d0790aa853b8420909d07bb8dfbda5d70a68679df9053928a7506"

// goldenTree makes a tree with every kind of entry Create archives, with
// fixed owners, modes, times and xattrs so that its stream is the same on
// every run: nested and empty directories, names that sort around "/",
// a hardlink pair, symlinks, a fifo, a character device, a socket (left
// out) and user xattrs on a file and a directory.
func goldenTree(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for owners and device nodes")
	}
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"a/b/c", "a/b-", "a.b", "empty", "z/y/x/w"} {
		must(os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	files := map[string]string{
		"a/b/c/deep.txt": "deep\n", "a/b-/f": "", "a.b/g": strings.Repeat("x", 70000),
		"top": "top\n", "z/y/x/w/leaf": "leaf",
	}
	for name, body := range files {
		must(os.WriteFile(filepath.Join(root, name), []byte(body), 0o644))
	}
	must(os.Link(filepath.Join(root, "top"), filepath.Join(root, "z/top-link")))
	must(os.Symlink("../top", filepath.Join(root, "a/rel")))
	must(os.Symlink("/etc/passwd", filepath.Join(root, "abs")))
	must(unix.Mkfifo(filepath.Join(root, "a/fifo"), 0o640))
	must(unix.Mknod(filepath.Join(root, "a/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	must(err)
	must(unix.Bind(sock, &unix.SockaddrUnix{Name: filepath.Join(root, "a/sock")}))
	unix.Close(sock)
	must(unix.Setxattr(filepath.Join(root, "top"), "user.note", []byte("hello"), 0))
	must(unix.Setxattr(filepath.Join(root, "a/b"), "user.dir", []byte("d"), 0))
	must(unix.Chmod(filepath.Join(root, "a.b/g"), 0o4755))
	must(os.Lchown(filepath.Join(root, "a/b/c/deep.txt"), 1000, 1001))
	must(os.Lchown(filepath.Join(root, "abs"), 7, 8))
	// Times last, deepest first, so that no later change moves them.
	var paths []string
	must(filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		paths = append(paths, p)
		return err
	}))
	for i := len(paths) - 1; i >= 0; i-- {
		ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano() + int64(i)), unix.NsecToTimespec(mtime.UnixNano() + int64(i))}
		must(unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], ts, unix.AT_SYMLINK_NOFOLLOW))
	}
	return root
}

// The bounded walk writes byte for byte the stream the recursive one did.
func TestCreateStreamUnchanged(t *testing.T) {
	root := goldenTree(t)
	h := sha256.New()
	if err := Create(context.Background(), root, h, "/"); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != goldenSHA256 {
		t.Fatalf("stream of the golden tree changed: sha256 %s, want %s", got, goldenSHA256)
	}
}

// nestedTree makes depth directories "d" one inside the other below
// root/top, with a file at the bottom, without ever holding more than
// two descriptors or using a path longer than one component.
func nestedTree(t testing.TB, root string, depth int) {
	t.Helper()
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Before t.TempDir's os.RemoveAll, which cannot remove such a tree.
	t.Cleanup(func() {
		rfd, err := inroot.OpenRoot(root)
		if err == nil {
			err = inroot.RemoveAll(rfd, "top")
			unix.Close(rfd)
		}
		if err != nil {
			t.Errorf("removing the nested tree: %.300v", err)
		}
	})
	name := "top"
	for i := 0; i <= depth; i++ {
		if i > 0 {
			name = "d"
		}
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		sub, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = sub
	}
	defer unix.Close(fd)
	f, err := unix.Openat(fd, "bottom", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(f)
}

func openFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// fdWatcher is a slow writer: every write it counts the test process's
// open descriptors and remembers the most it saw.
type fdWatcher struct {
	t       testing.TB
	writes  int
	max     int
	entries atomic.Int64
	bytes   int64
}

func (w *fdWatcher) Write(p []byte) (int, error) {
	w.writes++
	w.bytes += int64(len(p))
	if w.writes%97 == 0 {
		if n := openFDs(w.t); n > w.max {
			w.max = n
		}
		time.Sleep(10 * time.Microsecond)
	}
	return len(p), nil
}

// A 30,000-deep tree is archived whole with a bounded number of open
// descriptors (the recursive walk held one per level: 30,000), and
// removed whole by RemoveAll, again with a bounded number.
func TestCreateDeepTreeBoundedFDs(t *testing.T) {
	const depth = deepLevels
	root := t.TempDir()
	if os.Geteuid() == 0 {
		// This machine's discard-mounted root filesystem takes seconds to
		// make and remove 30,000 directories; the walk is the same.
		if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=256m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	}
	start := time.Now()
	nestedTree(t, root, depth)
	t.Logf("made %d levels in %v", depth, time.Since(start))
	base := openFDs(t)
	w := &fdWatcher{t: t}
	start = time.Now()
	if err := Create(context.Background(), root, w, "/top"); err != nil {
		t.Fatal(err)
	}
	t.Logf("archived %d levels in %v: %d MB, %d fds at most (%d before)", depth, time.Since(start), w.bytes>>20, w.max, base)
	// One name "d/" per level: the stream holds every prefix.
	if want := int64(depth) * int64(depth); w.bytes < want {
		t.Fatalf("stream of %d bytes is short of the %d the names alone take", w.bytes, want)
	}
	if w.max > base+8 {
		t.Fatalf("%d descriptors open during the walk, %d before: the walk holds descriptors per level", w.max, base)
	}
}

// A walk that finds a directory moved away (by a live sandbox) on its way
// back up stops with an error instead of carrying on in another place.
func TestCreateDetectsMovedTree(t *testing.T) {
	root := t.TempDir()
	nestedTree(t, root, 3)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(root, "elsewhere"), 0o755))
	for i := 0; i < 50; i++ {
		must(os.WriteFile(filepath.Join(root, "top/d/d/f"+strconv.Itoa(i)), nil, 0o644))
	}
	// Move top/d/d to elsewhere/ once the walk is inside it.
	w := &moveWriter{after: 30, move: func() {
		must(os.Rename(filepath.Join(root, "top/d/d"), filepath.Join(root, "elsewhere/d")))
	}}
	err := Create(context.Background(), root, w, "/top")
	if err == nil || !strings.Contains(err.Error(), "moved") {
		t.Fatalf("walk over a moved tree: %v, want an error saying it moved", err)
	}
}

type moveWriter struct {
	n, after int
	move     func()
}

func (w *moveWriter) Write(p []byte) (int, error) {
	w.n++
	if w.n == w.after {
		w.move()
	}
	return len(p), nil
}

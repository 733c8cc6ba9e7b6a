package sandboxfs

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

var ctx = context.Background()

// setup builds a sandbox root next to an "outside" directory holding a
// victim file that no operation may touch.
func setup(t *testing.T) (fs *FS, root, victim string) {
	t.Helper()
	parent := t.TempDir()
	root = filepath.Join(parent, "root")
	outside := filepath.Join(parent, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "etc"), filepath.Join(root, "home/user")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	victim = filepath.Join(outside, "victim")
	write(t, victim, "host secret")
	write(t, filepath.Join(root, "etc/shadow"), "sandbox shadow")
	write(t, filepath.Join(root, "etc/hostname"), "box")
	links := map[string]string{
		"x":            "/etc/shadow",
		"rel":          "../../../../../../etc/shadow",
		"home/user/up": "../../../../../..",
		"loop1":        "/loop2",
		"loop2":        "loop1",
		"etclink":      "/etc",
		"hostdir":      outside, // absolute host path: means nothing inside
		"hostvictim":   victim,
		"dangling":     "/newfile",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if got := read(t, victim); got != "host secret" {
			t.Errorf("host file outside the root changed: %q", got)
		}
	})
	return New(root), root, victim
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantCat(t *testing.T, err error, cat errdefs.Category, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want a %v error, got nil", cat)
	}
	if got := errdefs.CategoryOf(err); got != cat {
		t.Fatalf("want %v, got %v: %v", cat, got, err)
	}
	if substr != "" && !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not mention %q", err, substr)
	}
}

func readAll(t *testing.T, fs *FS, p string) string {
	t.Helper()
	data, _, eof, err := fs.ReadFile(ctx, p, 0, 0)
	if err != nil {
		t.Fatalf("ReadFile %s: %v", p, err)
	}
	if !eof {
		t.Fatalf("ReadFile %s: not eof", p)
	}
	return string(data)
}

func TestEscapingSymlinksResolveInside(t *testing.T) {
	fs, root, _ := setup(t)
	for _, p := range []string{"/x", "x", "/rel", "../../../../etc/shadow", "/home/user/up/etc/shadow", "/etclink/shadow", "/etc/../../../etc/./shadow"} {
		if got := readAll(t, fs, p); got != "sandbox shadow" {
			t.Errorf("%s reads %q", p, got)
		}
	}
	// Writing through a symlink writes the sandbox's file.
	if err := fs.WriteFile(ctx, "/x", strings.NewReader("changed"), 0, false, false); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(root, "etc/shadow")); got != "changed" {
		t.Fatalf("etc/shadow = %q", got)
	}
	// Host paths mean nothing inside: reads miss, writes cannot land.
	_, _, _, err := fs.ReadFile(ctx, "/hostvictim", 0, 0)
	wantCat(t, err, errdefs.NotFound, "")
	err = fs.WriteFile(ctx, "/hostvictim", strings.NewReader("pwned"), 0, false, false)
	wantCat(t, err, errdefs.NotFound, "")
	err = fs.WriteFile(ctx, "/hostdir/victim", strings.NewReader("pwned"), 0, false, true)
	if err == nil {
		// Parents were created inside the root, under the link target.
		if _, serr := os.Stat(filepath.Join(root, "hostdir")); serr != nil {
			t.Fatal(serr)
		}
	}
	wantCat(t, fs.Remove(ctx, "/hostdir/victim", false), errdefs.NotFound, "")
	wantCat(t, fs.Remove(ctx, "/home/user/up/../outside/victim", false), errdefs.NotFound, "/outside/victim")
	_, _, err = fs.List(ctx, "/hostdir", 0, "")
	wantCat(t, err, errdefs.NotFound, "")
	var buf bytes.Buffer
	wantCat(t, fs.TarOut(ctx, "/hostdir", &buf, TarOptions{}), errdefs.NotFound, "")
	// A dangling symlink is created through, inside the root.
	if err := fs.WriteFile(ctx, "/dangling", strings.NewReader("new"), 0o600, false, false); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(root, "newfile")); got != "new" {
		t.Fatalf("newfile = %q", got)
	}
}

func TestSymlinkLoop(t *testing.T) {
	fs, _, _ := setup(t)
	_, _, _, err := fs.ReadFile(ctx, "/loop1", 0, 0)
	wantCat(t, err, errdefs.Invalid, "symbolic links")
	err = fs.WriteFile(ctx, "/loop1", strings.NewReader("x"), 0, false, false)
	wantCat(t, err, errdefs.Invalid, "")
	_, _, err = fs.List(ctx, "/loop2/x", 0, "")
	wantCat(t, err, errdefs.Invalid, "")
	// Stat and Remove act on the link itself.
	fi, err := fs.Stat(ctx, "/loop1")
	if err != nil || !fi.IsSymlink || fi.LinkTarget != "/loop2" || fi.Type != "symlink" {
		t.Fatalf("Stat loop1: %+v %v", fi, err)
	}
	if err := fs.Remove(ctx, "/loop1", false); err != nil {
		t.Fatal(err)
	}
}

func TestReadOffsets(t *testing.T) {
	fs, root, _ := setup(t)
	write(t, filepath.Join(root, "digits"), "0123456789")
	cases := []struct {
		off, length int64
		want        string
		eof         bool
	}{
		{0, 0, "0123456789", true},
		{2, 3, "234", false},
		{7, 0, "789", true},
		{7, 3, "789", true},
		{7, 100, "789", true},
		{10, 0, "", true},
		{20, 5, "", true},
	}
	for _, c := range cases {
		data, size, eof, err := fs.ReadFile(ctx, "/digits", c.off, c.length)
		if err != nil || string(data) != c.want || size != 10 || eof != c.eof {
			t.Errorf("ReadFile(%d, %d) = %q, %d, %v, %v; want %q eof %v", c.off, c.length, data, size, eof, err, c.want, c.eof)
		}
	}
	_, _, _, err := fs.ReadFile(ctx, "/digits", 0, MaxRead+1)
	wantCat(t, err, errdefs.Exhausted, "")
	_, _, _, err = fs.ReadFile(ctx, "/digits", -1, 0)
	wantCat(t, err, errdefs.Invalid, "")
	_, _, _, err = fs.ReadFile(ctx, "/etc", 0, 0)
	wantCat(t, err, errdefs.Invalid, "is a directory: /etc")
	_, _, _, err = fs.ReadFile(ctx, "/nope/file", 0, 0)
	wantCat(t, err, errdefs.NotFound, "no such file: /nope")
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatal("errors.Is(ErrNotFound) false")
	}

	// Length 0 on a big file is capped; the cap itself is allowed.
	big := filepath.Join(root, "big")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, MaxRead+10); err != nil {
		t.Fatal(err)
	}
	data, size, eof, err := fs.ReadFile(ctx, "/big", 0, 0)
	if err != nil || len(data) != MaxRead || size != MaxRead+10 || eof {
		t.Fatalf("capped read: %d bytes, size %d, eof %v, %v", len(data), size, eof, err)
	}
	data, _, eof, err = fs.ReadFile(ctx, "/big", MaxRead, MaxRead)
	if err != nil || len(data) != 10 || !eof {
		t.Fatalf("tail read: %d bytes, eof %v, %v", len(data), eof, err)
	}
}

func TestWriteAppendModes(t *testing.T) {
	fs, root, _ := setup(t)
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	if err := fs.WriteFile(ctx, "/work/out.txt", strings.NewReader("a"), 0, false, false); err == nil {
		t.Fatal("write without parents succeeded")
	} else {
		wantCat(t, err, errdefs.NotFound, "/work")
	}
	if err := fs.WriteFile(ctx, "work/deep/out.txt", strings.NewReader("a"), 0o640, false, true); err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile(ctx, "/work/deep/out.txt", strings.NewReader("b"), 0o777, true, false); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, fs, "/work/deep/out.txt"); got != "ab" {
		t.Fatalf("append: %q", got)
	}
	fi, err := fs.Stat(ctx, "/work/deep/out.txt")
	if err != nil || fi.Mode.Perm() != 0o640 || fi.Type != "file" || fi.Size != 2 || fi.Name != "out.txt" || fi.Path != "/work/deep/out.txt" {
		t.Fatalf("stat: %+v %v (mode set despite umask, kept on rewrite)", fi, err)
	}
	if time.Since(fi.MTime) > time.Minute {
		t.Fatalf("mtime %v", fi.MTime)
	}
	dfi, _ := fs.Stat(ctx, "/work/deep")
	if !dfi.IsDir || dfi.Mode.Perm() != 0o755 {
		t.Fatalf("parent: %+v", dfi)
	}
	if err := fs.WriteFile(ctx, "/work/deep/out.txt", strings.NewReader("c"), 0, false, false); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, fs, "/work/deep/out.txt"); got != "c" {
		t.Fatalf("truncate: %q", got)
	}
	// Setuid via raw Unix bits.
	if err := fs.WriteFile(ctx, "/suid", strings.NewReader("#!"), os.FileMode(0o4755), false, false); err != nil {
		t.Fatal(err)
	}
	if fi, _ := fs.Stat(ctx, "/suid"); fi.UnixPerm() != 0o4755 || fi.Mode&os.ModeSetuid == 0 {
		t.Fatalf("suid mode %v %o", fi.Mode, fi.UnixPerm())
	}
	wantCat(t, fs.WriteFile(ctx, "/", strings.NewReader("x"), 0, false, false), errdefs.Invalid, "")
	wantCat(t, fs.WriteFile(ctx, "/../..", strings.NewReader("x"), 0, false, false), errdefs.Invalid, "")
	wantCat(t, fs.WriteFile(ctx, "/etc", strings.NewReader("x"), 0, false, false), errdefs.Invalid, "is a directory")
	wantCat(t, fs.WriteFile(ctx, "/etc/hostname/x", strings.NewReader("x"), 0, false, true), errdefs.Invalid, "not a directory")
	// A fifo is refused, not waited on.
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantCat(t, fs.WriteFile(ctx, "/fifo", strings.NewReader("x"), 0, false, false), errdefs.Invalid, "")
	_, _, _, err = fs.ReadFile(ctx, "/fifo", 0, 0)
	wantCat(t, err, errdefs.Invalid, "not a regular file")
	fi, _ = fs.Stat(ctx, "/fifo")
	if fi.Type != "other" {
		t.Fatalf("fifo type %q", fi.Type)
	}
}

func TestListStat(t *testing.T) {
	fs, _, _ := setup(t)
	ents, err := listAll(fs, "/etclink", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 || ents[0].Name != "hostname" || ents[0].Path != "/etclink/hostname" || ents[1].Name != "shadow" || ents[0].Type != "file" {
		t.Fatalf("List /etclink: %+v", ents)
	}
	ents, err = listAll(fs, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]FileInfo{}
	for _, e := range ents {
		byName[e.Name] = e
	}
	if e := byName["x"]; !e.IsSymlink || e.LinkTarget != "/etc/shadow" || e.Path != "/x" {
		t.Fatalf("x: %+v", e)
	}
	if e := byName["etc"]; !e.IsDir || e.Type != "dir" || e.Mode&os.ModeDir == 0 {
		t.Fatalf("etc: %+v", e)
	}
	fi, err := fs.Stat(ctx, "/")
	if err != nil || !fi.IsDir || fi.Name != "/" || fi.Path != "/" {
		t.Fatalf("Stat /: %+v %v", fi, err)
	}
	_, _, err = fs.List(ctx, "/etc/hostname", 0, "")
	wantCat(t, err, errdefs.Invalid, "not a directory")
	_, err = fs.Stat(ctx, "/etc/missing")
	wantCat(t, err, errdefs.NotFound, "no such file: /etc/missing")
}

func TestMkdirRemove(t *testing.T) {
	fs, root, _ := setup(t)
	wantCat(t, fs.Mkdir(ctx, "/a/b", 0, false), errdefs.NotFound, "/a")
	if err := fs.Mkdir(ctx, "/a/b/c", 0o700, true); err != nil {
		t.Fatal(err)
	}
	if err := fs.Mkdir(ctx, "/a/b/c", 0o700, true); err != nil {
		t.Fatalf("mkdir -p twice: %v", err)
	}
	if err := fs.Mkdir(ctx, "/", 0, true); err != nil {
		t.Fatal(err)
	}
	wantCat(t, fs.Mkdir(ctx, "/a/b/c", 0, false), errdefs.Conflict, "already exists")
	if !errdefs.IsAlreadyExists(fs.Mkdir(ctx, "/a/b/c", 0, false)) {
		t.Error("mkdir of an existing directory is not an already-exists conflict")
	}
	wantCat(t, fs.Mkdir(ctx, "/etc/hostname", 0, true), errdefs.Conflict, "")
	if err := fs.Mkdir(ctx, "/etclink", 0, true); err != nil {
		t.Fatalf("mkdir -p on a symlink to a dir: %v", err)
	}
	fi, _ := fs.Stat(ctx, "/a/b/c")
	if !fi.IsDir || fi.Mode.Perm() != 0o700 {
		t.Fatalf("c: %v", fi.Mode)
	}
	if fi, _ := fs.Stat(ctx, "/a/b"); fi.Mode.Perm() != 0o755 {
		t.Fatalf("parent b: %v", fi.Mode)
	}
	if err := fs.Mkdir(ctx, "/sticky", os.ModeSticky|0o777, false); err != nil {
		t.Fatal(err)
	}
	if fi, _ := fs.Stat(ctx, "/sticky"); fi.UnixPerm() != 0o1777 {
		t.Fatalf("sticky: %o", fi.UnixPerm())
	}
	write(t, filepath.Join(root, "a/b/c/f"), "x")
	wantCat(t, fs.Remove(ctx, "/a", false), errdefs.Conflict, "not empty")
	if err := fs.Remove(ctx, "/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "a")); !os.IsNotExist(err) {
		t.Fatal("a not removed")
	}
	wantCat(t, fs.Remove(ctx, "/a", true), errdefs.NotFound, "no such file: /a")
	wantCat(t, fs.Remove(ctx, "/", true), errdefs.Invalid, "")
	wantCat(t, fs.Remove(ctx, "../..", true), errdefs.Invalid, "")
	// Removing a symlink removes the link, not its target, even recursive.
	if err := fs.Remove(ctx, "/etclink", true); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(root, "etc/shadow")); got != "sandbox shadow" {
		t.Fatal("target of a removed symlink damaged")
	}
	if err := fs.Mkdir(ctx, "/e", 0, false); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove(ctx, "/e", false); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove(ctx, "/x", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/shadow")); err != nil {
		t.Fatal("removing /x removed its target")
	}
}

func TestTarRoundTrip(t *testing.T) {
	fs, root, _ := setup(t)
	if err := fs.Mkdir(ctx, "/proj/src", 0, true); err != nil {
		t.Fatal(err)
	}
	fs.WriteFile(ctx, "/proj/src/main.py", strings.NewReader("print('hi')\n"), 0o755, false, false)
	fs.WriteFile(ctx, "/proj/README", strings.NewReader("readme"), 0, false, false)
	os.Symlink("src/main.py", filepath.Join(root, "proj/run"))
	var buf bytes.Buffer
	if err := fs.TarOut(ctx, "/proj", &buf, TarOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := fs.TarIn(ctx, "/copy/of/proj", bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, fs, "/copy/of/proj/src/main.py"); got != "print('hi')\n" {
		t.Fatalf("main.py = %q", got)
	}
	if fi, _ := fs.Stat(ctx, "/copy/of/proj/run"); fi.LinkTarget != "src/main.py" {
		t.Fatalf("run: %+v", fi)
	}
	if fi, _ := fs.Stat(ctx, "/copy/of/proj/src/main.py"); fi.Mode.Perm() != 0o755 {
		t.Fatalf("mode %v", fi.Mode)
	}
	var again bytes.Buffer
	if err := fs.TarOut(ctx, "/copy/of/proj", &again, TarOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatal("tar round trip changed the tree")
	}
	// A single file.
	buf.Reset()
	if err := fs.TarOut(ctx, "/proj/README", &buf, TarOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := fs.TarIn(ctx, "/single", &buf); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, fs, "/single/README"); got != "readme" {
		t.Fatalf("single: %q", got)
	}
	wantCat(t, fs.TarOut(ctx, "/nope", io.Discard, TarOptions{}), errdefs.NotFound, "no such file: /nope")
}

func TestTarInSafety(t *testing.T) {
	fs, root, victim := setup(t)
	mk := func(hdrs ...*tar.Header) *bytes.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
			}
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		return bytes.NewReader(buf.Bytes())
	}
	err := fs.TarIn(ctx, "/up", mk(
		&tar.Header{Name: "suid", Typeflag: tar.TypeReg, Mode: 0o4755},
		&tar.Header{Name: "../../../escape", Typeflag: tar.TypeReg, Mode: 0o644},
		&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: filepath.Dir(victim)},
	))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := fs.Stat(ctx, "/up/suid"); fi.Mode&os.ModeSetuid != 0 {
		t.Fatal("setuid kept")
	}
	if _, err := os.Stat(filepath.Join(root, "up/escape")); err != nil {
		t.Fatalf("../ not clamped to the target: %v", err)
	}
	err = fs.TarIn(ctx, "/up", mk(&tar.Header{Name: "l/victim", Typeflag: tar.TypeReg, Mode: 0o644}))
	wantCat(t, err, errdefs.Invalid, "l/victim")
	err = fs.TarIn(ctx, "/up", mk(&tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8}))
	wantCat(t, err, errdefs.Invalid, "sda")
	err = fs.TarIn(ctx, "/etc/hostname", mk(&tar.Header{Name: "f", Typeflag: tar.TypeReg}))
	wantCat(t, err, errdefs.Invalid, "")
	err = fs.TarIn(ctx, "/up", bytes.NewReader([]byte("garbage garbage")))
	wantCat(t, err, errdefs.Invalid, "")
}

func TestNoSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=256k"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	fs := New(root)
	err := fs.WriteFile(ctx, "/big", bytes.NewReader(make([]byte, 1<<20)), 0, false, false)
	wantCat(t, err, errdefs.Exhausted, "no space left on device")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: 1 << 20, Mode: 0o644})
	tw.Write(bytes.Repeat([]byte("data"), 1<<18)) // zeros would be holes
	tw.Close()
	fs.Remove(ctx, "/big", false)
	err = fs.TarIn(ctx, "/", &buf)
	wantCat(t, err, errdefs.Exhausted, "no space left on device")
}

func TestRootGone(t *testing.T) {
	fs := New(filepath.Join(t.TempDir(), "gone"))
	_, err := fs.Stat(ctx, "/")
	wantCat(t, err, errdefs.Unavailable, "")
}

// TestConcurrentSwapCannotEscape swaps a directory of the sandbox for
// symlinks to the host (as a hostile sandbox process would) while file
// operations run on paths through it.
func TestConcurrentSwapCannotEscape(t *testing.T) {
	fs, root, victim := setup(t)
	outside := filepath.Dir(victim)
	swap := filepath.Join(root, "swap")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		targets := []string{outside, "../../../../../../" + outside, "/.."}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			os.RemoveAll(swap)
			if i%2 == 0 {
				os.Mkdir(swap, 0o755)
			} else {
				os.Symlink(targets[i/2%len(targets)], swap)
			}
		}
	}()
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	tw.WriteHeader(&tar.Header{Name: "victim", Typeflag: tar.TypeReg, Size: 5, Mode: 0o644})
	tw.Write([]byte("pwned"))
	tw.Close()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		fs.WriteFile(ctx, "/swap/victim", strings.NewReader("pwned"), 0o777, false, false)
		fs.WriteFile(ctx, "/swap/new", strings.NewReader("pwned"), 0o777, false, true)
		fs.Mkdir(ctx, "/swap/dir", 0, true)
		fs.Remove(ctx, "/swap/victim", true)
		fs.TarIn(ctx, "/swap", bytes.NewReader(tarBuf.Bytes()))
		fs.ReadFile(ctx, "/swap/victim", 0, 0)
		fs.TarOut(ctx, "/swap", io.Discard, TarOptions{})
	}
	close(stop)
	<-done
	ents, _ := os.ReadDir(outside)
	if len(ents) != 1 {
		t.Fatalf("outside holds %v", ents)
	}
	var st unix.Stat_t
	if err := unix.Stat(victim, &st); err != nil || st.Mode&0o777 != 0o644 {
		t.Fatalf("victim mode %o %v", st.Mode, err)
	}
}

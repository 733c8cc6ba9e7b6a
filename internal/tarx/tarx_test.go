package tarx

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/testutil"
)

type ent struct {
	name, link, body string
	typ              byte
	mode             int64
	uid, gid         int
	major, minor     int64
	xattrs           map[string]string
}

var mtime = time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)

func mkTar(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode,
			Uid: e.uid, Gid: e.gid, ModTime: mtime, Devmajor: e.major, Devminor: e.minor, Format: tar.FormatPAX}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sandbox returns a root directory inside a parent directory, so that
// tests can check nothing was written next to the root.
func sandbox(t *testing.T) (parent, root string) {
	t.Helper()
	parent = t.TempDir()
	root = filepath.Join(parent, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return parent, root
}

func extract(t *testing.T, root string, data []byte, opts Options) (Stats, error) {
	t.Helper()
	return Extract(context.Background(), root, bytes.NewReader(data), opts)
}

func mustExtract(t *testing.T, root string, data []byte, opts Options) Stats {
	t.Helper()
	st, err := extract(t, root, data, opts)
	if err != nil {
		t.Fatalf("extract: %v", err)
	}
	return st
}

func wantCat(t *testing.T, err error, cat errdefs.Category, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want a %v error, got nil", cat)
	}
	if got := errdefs.CategoryOf(err); got != cat {
		t.Fatalf("want category %v, got %v: %v", cat, got, err)
	}
	if substr != "" && !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not mention %q", err, substr)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// onlyRoot checks that parent holds nothing but root.
func onlyRoot(t *testing.T, parent string) {
	t.Helper()
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "root" {
			t.Fatalf("extraction escaped the root: %s/%s exists", parent, e.Name())
		}
	}
}

func TestDotDotAndAbsolutePathsStayInside(t *testing.T) {
	parent, root := sandbox(t)
	data := mkTar(t,
		ent{name: "../../etc/x", body: "dotdot"},
		ent{name: "/abs/y", body: "abs"},
		ent{name: "a/../../../z", body: "z"},
		ent{name: "./ok/../w", body: "w"},
	)
	mustExtract(t, root, data, Options{})
	onlyRoot(t, parent)
	for p, want := range map[string]string{"etc/x": "dotdot", "abs/y": "abs", "z": "z", "w": "w"} {
		if got := readFile(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
}

func TestSymlinkThenWriteThroughIt(t *testing.T) {
	parent, root := sandbox(t)
	outside := filepath.Join(parent, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Relative escape: resolved inside the root, so "rel/" is the root.
	data := mkTar(t,
		ent{name: "rel", typ: tar.TypeSymlink, link: "../../../../../.."},
		ent{name: "rel/pwned-rel", body: "x"},
		ent{name: "up", typ: tar.TypeSymlink, link: ".."},
		ent{name: "up/outside/victim", body: "pwned"},
	)
	mustExtract(t, root, data, Options{})
	if got := readFile(t, victim); got != "original" {
		t.Fatalf("victim outside the root was overwritten: %q", got)
	}
	if got := readFile(t, filepath.Join(root, "pwned-rel")); got != "x" {
		t.Fatalf("pwned-rel = %q", got)
	}
	if got := readFile(t, filepath.Join(root, "outside/victim")); got != "pwned" {
		t.Fatalf("outside/victim inside root = %q", got)
	}
	// The symlinks themselves are kept verbatim.
	if l, _ := os.Readlink(filepath.Join(root, "rel")); l != "../../../../../.." {
		t.Fatalf("rel -> %q", l)
	}

	// Absolute escape to the host directory: inside the root that path
	// does not exist, so the write fails, and never lands outside.
	data = mkTar(t,
		ent{name: "abs", typ: tar.TypeSymlink, link: outside},
		ent{name: "abs/victim", body: "pwned"},
	)
	_, err := extract(t, root, data, Options{})
	wantCat(t, err, errdefs.Invalid, "abs/victim")
	if got := readFile(t, victim); got != "original" {
		t.Fatalf("victim outside the root was overwritten: %q", got)
	}

	// A symlink replaced by a file entry of the same name: the file
	// replaces the link, it is not written through it.
	data = mkTar(t,
		ent{name: "link", typ: tar.TypeSymlink, link: victim},
		ent{name: "link", body: "replaced"},
	)
	mustExtract(t, root, data, Options{})
	if got := readFile(t, victim); got != "original" {
		t.Fatalf("victim written through a symlink: %q", got)
	}
	fi, err := os.Lstat(filepath.Join(root, "link"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("link should be a regular file now: %v %v", fi, err)
	}

	// Symlink to an absolute in-root directory is followed inside root.
	data = mkTar(t,
		ent{name: "etc/", typ: tar.TypeDir},
		ent{name: "etclink", typ: tar.TypeSymlink, link: "/etc"},
		ent{name: "etclink/passwd", body: "inroot"},
	)
	mustExtract(t, root, data, Options{})
	if got := readFile(t, filepath.Join(root, "etc/passwd")); got != "inroot" {
		t.Fatalf("etc/passwd = %q", got)
	}
	onlyRootOr(t, parent, "outside")
}

func onlyRootOr(t *testing.T, parent string, allowed ...string) {
	t.Helper()
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		ok := e.Name() == "root"
		for _, a := range allowed {
			ok = ok || e.Name() == a
		}
		if !ok {
			t.Fatalf("unexpected %s/%s", parent, e.Name())
		}
	}
	if allowed != nil {
		ents, _ = os.ReadDir(filepath.Join(parent, allowed[0]))
		if len(ents) != 1 {
			t.Fatalf("outside dir changed: %v", ents)
		}
	}
}

func TestHardlinkOutsideRootFails(t *testing.T) {
	parent, root := sandbox(t)
	var before unix.Stat_t
	if err := unix.Stat("/etc/passwd", &before); err != nil {
		t.Fatal(err)
	}
	for _, link := range []string{"/etc/passwd", "../../../../etc/passwd"} {
		_, err := extract(t, root, mkTar(t, ent{name: "pw", typ: tar.TypeLink, link: link}), Options{})
		wantCat(t, err, errdefs.Invalid, `"pw"`)
	}
	// Through a symlink to the host /etc.
	data := mkTar(t,
		ent{name: "e", typ: tar.TypeSymlink, link: "/etc"},
		ent{name: "pw2", typ: tar.TypeLink, link: "e/passwd"},
	)
	_, err := extract(t, root, data, Options{})
	wantCat(t, err, errdefs.Invalid, "pw2")
	var after unix.Stat_t
	if err := unix.Stat("/etc/passwd", &after); err != nil {
		t.Fatal(err)
	}
	if after.Nlink != before.Nlink {
		t.Fatalf("/etc/passwd gained a link")
	}
	onlyRoot(t, parent)

	// A hardlink to a file of the archive works, also through symlinks
	// resolved inside the root.
	data = mkTar(t,
		ent{name: "etc/passwd", body: "root:x:0:0"},
		ent{name: "e2", typ: tar.TypeSymlink, link: "/etc"},
		ent{name: "pw3", typ: tar.TypeLink, link: "/e2/passwd"},
	)
	st := mustExtract(t, root, data, Options{})
	if st.Hardlinks != 1 {
		t.Fatalf("hardlinks = %d", st.Hardlinks)
	}
	var a, b unix.Stat_t
	unix.Stat(filepath.Join(root, "etc/passwd"), &a)
	unix.Stat(filepath.Join(root, "pw3"), &b)
	if a.Ino != b.Ino {
		t.Fatalf("pw3 is not a hardlink of etc/passwd")
	}
}

func TestDevices(t *testing.T) {
	_, root := sandbox(t)
	data := mkTar(t,
		ent{name: "dev/", typ: tar.TypeDir},
		ent{name: "dev/sda", typ: tar.TypeBlock, major: 8, minor: 0, mode: 0o660},
	)
	_, err := extract(t, root, data, Options{})
	wantCat(t, err, errdefs.Invalid, "dev/sda")
	if _, err := os.Lstat(filepath.Join(root, "dev/sda")); !os.IsNotExist(err) {
		t.Fatalf("device created: %v", err)
	}
	_, err = extract(t, root, mkTar(t, ent{name: "fifo", typ: tar.TypeFifo}), Options{})
	wantCat(t, err, errdefs.Invalid, "fifo")

	st := mustExtract(t, root, data, Options{SkipDevices: true})
	if st.DevicesSkipped != 1 {
		t.Fatalf("DevicesSkipped = %d", st.DevicesSkipped)
	}
	if os.Getuid() != 0 {
		t.Skip("creating devices needs root")
	}
	data = mkTar(t,
		ent{name: "null", typ: tar.TypeChar, major: 1, minor: 3, mode: 0o666},
		ent{name: "fifo", typ: tar.TypeFifo, mode: 0o600},
	)
	st = mustExtract(t, root, data, Options{AllowDevices: true})
	if st.Devices != 2 {
		t.Fatalf("Devices = %d", st.Devices)
	}
	var s unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "null"), &s); err != nil {
		t.Fatal(err)
	}
	if s.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(s.Rdev) != 1 || unix.Minor(s.Rdev) != 3 || s.Mode&0o7777 != 0o666 {
		t.Fatalf("null: mode %o rdev %d:%d", s.Mode, unix.Major(s.Rdev), unix.Minor(s.Rdev))
	}
}

func TestSetuidStripped(t *testing.T) {
	_, root := sandbox(t)
	data := mkTar(t,
		ent{name: "su", body: "#!", mode: 0o4755},
		ent{name: "wall", body: "#!", mode: 0o2755},
		ent{name: "ping", body: "#!", mode: 0o755, xattrs: map[string]string{"security.capability": "\x01\x00\x00\x02"}},
		ent{name: "plain", body: "#!", mode: 0o1755},
	)
	st := mustExtract(t, root, data, Options{})
	if st.SetuidStripped != 3 {
		t.Fatalf("SetuidStripped = %d, want 3", st.SetuidStripped)
	}
	for name, want := range map[string]os.FileMode{"su": 0o755, "wall": 0o755, "plain": 0o755 | os.ModeSticky} {
		fi, _ := os.Stat(filepath.Join(root, name))
		if fi.Mode() != want {
			t.Errorf("%s mode = %v, want %v", name, fi.Mode(), want)
		}
	}
	if n, _ := unix.Getxattr(filepath.Join(root, "ping"), "security.capability", nil); n > 0 {
		t.Errorf("security.capability kept")
	}

	_, root2 := sandbox(t)
	st = mustExtract(t, root2, data, Options{KeepSetuid: true})
	if st.SetuidStripped != 0 {
		t.Fatalf("SetuidStripped = %d with KeepSetuid", st.SetuidStripped)
	}
	fi, _ := os.Stat(filepath.Join(root2, "su"))
	if fi.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("setuid lost with KeepSetuid: %v", fi.Mode())
	}
}

func TestOwnersAndTimes(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chown needs root")
	}
	_, root := sandbox(t)
	data := mkTar(t,
		ent{name: "d/", typ: tar.TypeDir, uid: 1000, gid: 1001, mode: 0o750},
		ent{name: "d/f", body: "x", uid: 1234, gid: 5678, mode: 0o4750},
		ent{name: "d/l", typ: tar.TypeSymlink, link: "f", uid: 42, gid: 43},
	)
	mustExtract(t, root, data, Options{KeepOwners: true, KeepSetuid: true})
	check := func(p string, uid, gid uint32, mode uint32) {
		t.Helper()
		var s unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, p), &s); err != nil {
			t.Fatal(err)
		}
		if s.Uid != uid || s.Gid != gid {
			t.Errorf("%s owner %d:%d, want %d:%d", p, s.Uid, s.Gid, uid, gid)
		}
		if mode != 0 && s.Mode&0o7777 != mode {
			t.Errorf("%s mode %o, want %o", p, s.Mode&0o7777, mode)
		}
		if s.Mtim.Sec != mtime.Unix() || s.Mtim.Nsec != int64(mtime.Nanosecond()) {
			t.Errorf("%s mtime %v, want %v", p, time.Unix(s.Mtim.Sec, s.Mtim.Nsec), mtime)
		}
	}
	check("d", 1000, 1001, 0o750)
	check("d/f", 1234, 5678, 0o4750)
	check("d/l", 42, 43, 0)

	_, root2 := sandbox(t)
	mustExtract(t, root2, data, Options{})
	var s unix.Stat_t
	unix.Lstat(filepath.Join(root2, "d/f"), &s)
	if s.Uid != 0 {
		t.Errorf("owner kept without KeepOwners")
	}
}

func TestLimits(t *testing.T) {
	_, root := sandbox(t)
	var ents []ent
	for i := 0; i < 20; i++ {
		ents = append(ents, ent{name: fmt.Sprintf("f%02d", i), body: "0123456789"})
	}
	data := mkTar(t, ents...)
	_, err := extract(t, root, data, Options{MaxFiles: 10})
	wantCat(t, err, errdefs.Exhausted, "10 entries")
	_, err = extract(t, root, data, Options{MaxBytes: 55})
	wantCat(t, err, errdefs.Exhausted, "55 bytes")
	st := mustExtract(t, root, data, Options{MaxFiles: 20, MaxBytes: 200})
	if st.Files != 20 || st.Bytes != 200 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCorruptArchives(t *testing.T) {
	data := mkTar(t, ent{name: "a", body: strings.Repeat("x", 5000)}, ent{name: "b", body: "y"})
	cases := map[string][]byte{
		"mid-content":      data[:1500],
		"mid-header":       data[:512+5120+100],
		"no end marker":    data[:512+5120+512+512],
		"empty":            nil,
		"garbage":          bytes.Repeat([]byte("not a tar archive "), 100),
		"corrupt checksum": append(append([]byte{}, data[:148]...), append([]byte("99999999"), data[156:]...)...),
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			_, root := sandbox(t)
			_, err := extract(t, root, bad, Options{})
			wantCat(t, err, errdefs.Invalid, "")
		})
	}
	// Truncated gzip.
	gz := gzipped(t, data)
	_, root := sandbox(t)
	_, err := extract(t, root, gz[:len(gz)-10], Options{})
	wantCat(t, err, errdefs.Invalid, "")
	// Corrupt gzip checksum.
	bad := append([]byte{}, gz...)
	bad[len(bad)-6] ^= 0xff
	_, err = extract(t, root, bad, Options{})
	wantCat(t, err, errdefs.Invalid, "")
	// Other compressions are named.
	_, err = extract(t, root, []byte("BZh91AY&SY"), Options{})
	wantCat(t, err, errdefs.Invalid, "bzip2")
}

type failingReader struct {
	r   io.Reader
	n   int
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

func TestReaderErrorPassesThrough(t *testing.T) {
	_, root := sandbox(t)
	boom := errors.New("connection reset")
	data := mkTar(t, ent{name: "a", body: strings.Repeat("x", 5000)})
	_, err := Extract(context.Background(), root, &failingReader{r: bytes.NewReader(data), n: 2000, err: boom}, Options{})
	if !errors.Is(err, boom) {
		t.Fatalf("want the reader's error, got %v", err)
	}
	if errdefs.CategoryOf(err) == errdefs.Invalid {
		t.Fatalf("a reader failure is not a corrupt archive: %v", err)
	}
}

func gzipped(t *testing.T, data []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

func TestGzipDetected(t *testing.T) {
	_, root := sandbox(t)
	data := gzipped(t, mkTar(t, ent{name: "hello/world.txt", body: "hi"}))
	st := mustExtract(t, root, data, Options{})
	if st.Files != 1 || readFile(t, filepath.Join(root, "hello/world.txt")) != "hi" {
		t.Fatalf("gzip archive not extracted: %+v", st)
	}
}

func TestReplaceEntries(t *testing.T) {
	_, root := sandbox(t)
	mustExtract(t, root, mkTar(t,
		ent{name: "a/b/c", body: "deep"},
		ent{name: "f", body: "file"},
		ent{name: "keep/x", body: "x"},
	), Options{})
	mustExtract(t, root, mkTar(t,
		ent{name: "a", body: "now a file"},
		ent{name: "f/", typ: tar.TypeDir},
		ent{name: "keep/", typ: tar.TypeDir, mode: 0o700},
	), Options{})
	if readFile(t, filepath.Join(root, "a")) != "now a file" {
		t.Fatal("a not replaced")
	}
	if fi, err := os.Stat(filepath.Join(root, "f")); err != nil || !fi.IsDir() {
		t.Fatal("f not replaced by a dir")
	}
	fi, err := os.Stat(filepath.Join(root, "keep"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("keep: %v %v", fi, err)
	}
	if readFile(t, filepath.Join(root, "keep/x")) != "x" {
		t.Fatal("existing directory contents lost")
	}
	// A file under a file is an inconsistent archive.
	_, err = extract(t, root, mkTar(t, ent{name: "a/sub", body: "x"}), Options{})
	wantCat(t, err, errdefs.Invalid, "a/sub")
}

func TestContextCancelled(t *testing.T) {
	_, root := sandbox(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Extract(ctx, root, bytes.NewReader(mkTar(t, ent{name: "a", body: "x"})), Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	err = Create(ctx, root, io.Discard, "/")
	if errdefs.CategoryOf(err) != errdefs.DeadlineExceeded {
		t.Fatalf("want DeadlineExceeded, got %v", err)
	}
}

func TestExtractIntoDir(t *testing.T) {
	parent, root := sandbox(t)
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.Symlink("/etc", filepath.Join(root, "work-etc"))
	data := mkTar(t,
		ent{name: "./", typ: tar.TypeDir, mode: 0o711},
		ent{name: "../../../x", body: "clamped"},
		ent{name: "ln", typ: tar.TypeLink, link: "/x"},
		ent{name: "sub/y", body: "y"},
	)
	mustExtract(t, root, data, Options{Dir: "/work/dir"})
	onlyRoot(t, parent)
	if readFile(t, filepath.Join(root, "work/dir/x")) != "clamped" {
		t.Fatal("x not clamped to Dir")
	}
	if readFile(t, filepath.Join(root, "work/dir/ln")) != "clamped" {
		t.Fatal("hardlink target not relative to Dir")
	}
	fi, _ := os.Stat(filepath.Join(root, "work/dir"))
	if fi.Mode().Perm() != 0o711 {
		t.Fatalf("root entry mode not applied: %v", fi.Mode())
	}
	// Dir itself is resolved inside root.
	mustExtract(t, root, mkTar(t, ent{name: "z", body: "z"}), Options{Dir: "work-etc"})
	if readFile(t, filepath.Join(root, "etc/z")) != "z" {
		t.Fatal("Dir symlink not resolved inside root")
	}
}

func TestRoundTrip(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a/b/c"), 0o755))
	must(os.WriteFile(filepath.Join(src, "a/file"), []byte("hello"), 0o640))
	must(os.WriteFile(filepath.Join(src, "a/b/big"), bytes.Repeat([]byte("0123456789abcdef"), 100000), 0o600))
	must(os.WriteFile(filepath.Join(src, "suid"), []byte("#!/bin/sh"), 0o755))
	must(os.Chmod(filepath.Join(src, "suid"), 0o4755))
	must(os.WriteFile(filepath.Join(src, "empty"), nil, 0o644))
	must(os.Link(filepath.Join(src, "a/file"), filepath.Join(src, "a/b/c/hard")))
	must(os.Symlink("../file", filepath.Join(src, "a/b/rel")))
	must(os.Symlink("/etc/shadow", filepath.Join(src, "abs")))
	must(os.Symlink("dangling", filepath.Join(src, "dangle")))
	must(os.Mkdir(filepath.Join(src, "sticky"), 0o755))
	must(os.Chmod(filepath.Join(src, "sticky"), 0o1777))
	long := filepath.Join(src, strings.Repeat("d", 120), strings.Repeat("e", 120))
	must(os.MkdirAll(long, 0o755))
	must(os.WriteFile(filepath.Join(long, "f"), []byte("long"), 0o644))
	xattrOK := unix.Setxattr(filepath.Join(src, "a/file"), "user.warren", []byte("v1"), 0) == nil
	if os.Getuid() == 0 {
		must(os.Lchown(filepath.Join(src, "a/file"), 1234, 5678))
		must(os.Lchown(filepath.Join(src, "abs"), 7, 8))
		must(unix.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	}
	// Distinct, sub-second mtimes everywhere, directories last.
	i := 0
	must(filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		i++
		ts := []unix.Timespec{{Sec: 1_600_000_000 + int64(i), Nsec: int64(i) * 1000}, {Sec: 1_700_000_000 + int64(i), Nsec: int64(i) * 7}}
		return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	}))
	// Re-set directories after the children (walking bottom-up is enough
	// here since only utimes ran).

	var first bytes.Buffer
	must(Create(context.Background(), src, &first, "/"))
	dst := t.TempDir()
	st, err := Extract(context.Background(), dst, bytes.NewReader(first.Bytes()), Options{KeepOwners: true, KeepSetuid: true, AllowDevices: true})
	must(err)
	if st.Hardlinks != 1 || st.Symlinks != 3 {
		t.Fatalf("stats %+v", st)
	}
	var second bytes.Buffer
	must(Create(context.Background(), dst, &second, "/"))
	if !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Fatalf("round trip changed the canonical stream:\n%s\n---\n%s", listing(t, first.Bytes()), listing(t, second.Bytes()))
	}
	// Deterministic: creating again gives the same bytes.
	var third bytes.Buffer
	must(Create(context.Background(), src, &third, "/"))
	if !bytes.Equal(first.Bytes(), third.Bytes()) {
		t.Fatal("Create is not deterministic")
	}
	if xattrOK {
		v := make([]byte, 16)
		n, err := unix.Getxattr(filepath.Join(dst, "a/file"), "user.warren", v)
		if err != nil || string(v[:n]) != "v1" {
			t.Fatalf("xattr lost: %v %q", err, v[:n])
		}
	}
	// Names are relative; the hardlink refers to the first name.
	l := listing(t, first.Bytes())
	for _, want := range []string{"./ d", "a/file h -> a/b/c/hard", "abs l -> /etc/shadow", "a/b/c/ d"} {
		if !strings.Contains(l, want+"\n") {
			t.Errorf("listing lacks %q:\n%s", want, l)
		}
	}
}

func listing(t *testing.T, data []byte) string {
	var sb strings.Builder
	for hdr := range testutil.TarEntries(t, bytes.NewReader(data)) {
		kind := map[byte]string{tar.TypeReg: "f", tar.TypeDir: "d", tar.TypeSymlink: "l", tar.TypeLink: "h", tar.TypeFifo: "p"}[hdr.Typeflag]
		fmt.Fprintf(&sb, "%s %s", hdr.Name, kind)
		if hdr.Linkname != "" {
			fmt.Fprintf(&sb, " -> %s", hdr.Linkname)
		}
		fmt.Fprintf(&sb, "\n")
		if !hdr.AccessTime.IsZero() || hdr.Uname != "" {
			t.Errorf("%s: atime or uname set", hdr.Name)
		}
	}
	return sb.String()
}

func TestCreateSubdirAndSingleFile(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc/app"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/app/conf"), []byte("c"), 0o644)
	os.Symlink("/etc/app", filepath.Join(root, "link"))
	os.Symlink("/etc/app/conf", filepath.Join(root, "conflink"))
	var buf bytes.Buffer
	if err := Create(context.Background(), root, &buf, "/link"); err != nil {
		t.Fatal(err)
	}
	if l := listing(t, buf.Bytes()); l != "./ d\nconf f\n" {
		t.Fatalf("listing %q", l)
	}
	buf.Reset()
	if err := Create(context.Background(), root, &buf, "conflink"); err != nil {
		t.Fatal(err)
	}
	if l := listing(t, buf.Bytes()); l != "conflink f\n" {
		t.Fatalf("listing %q", l)
	}
	err := Create(context.Background(), root, io.Discard, "/nope")
	wantCat(t, err, errdefs.NotFound, "/nope")
	// A symlink escaping the root is resolved inside it.
	os.Symlink("../../../../../../etc", filepath.Join(root, "esc"))
	buf.Reset()
	if err := Create(context.Background(), root, &buf, "/esc"); err != nil {
		t.Fatal(err)
	}
	if l := listing(t, buf.Bytes()); l != "./ d\napp/ d\napp/conf f\n" {
		t.Fatalf("escaping symlink left the root: %q", l)
	}
}

// Mount points below the archived tree (a sandbox's /proc, /sys, /dev)
// become empty directories, as with tar --one-file-system.
func TestCreateStaysOnOneFilesystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	root := t.TempDir()
	mnt := filepath.Join(root, "proc")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "kept"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(mnt, "hidden"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Create(context.Background(), root, &buf, "/"); err != nil {
		t.Fatal(err)
	}
	var names []string
	for h := range testutil.TarEntries(t, &buf) {
		names = append(names, h.Name)
	}
	got := strings.Join(names, " ")
	if !strings.Contains(got, "kept") || !strings.Contains(got, "proc/") || strings.Contains(got, "hidden") {
		t.Fatalf("archive entries %q: want kept and an empty proc/, not proc/hidden", got)
	}
}

package untrusted

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// ent is one crafted archive entry.
type ent struct {
	name string
	typ  byte
	mode int64
	body string
	link string
	pax  map[string]string
}

func file(name, body string) ent { return ent{name: name, typ: tar.TypeReg, mode: 0o644, body: body} }
func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, to string) ent {
	return ent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: to}
}
func hardlink(name, to string) ent { return ent{name: name, typ: tar.TypeLink, link: to} }

func writeEnts(tw *tar.Writer, ents ...ent) error {
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link,
			Size: int64(len(e.body)), PAXRecords: e.pax, Format: tar.FormatPAX, ModTime: time.Unix(1e9, 0)}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			return err
		}
	}
	return nil
}

func mktar(t *testing.T, ents ...ent) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := writeEnts(tw, ents...); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

// pipeTar streams the archive gen writes, for archives too big to hold.
func pipeTar(gen func(tw *tar.Writer) error) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := gen(tw)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

func extract(t *testing.T, dest string, r io.Reader, o Options) (Stats, error) {
	t.Helper()
	st, err := Extract(context.Background(), dest, r, o)
	t.Logf("extract into %s: %+v err=%v", dest, st, err)
	return st, err
}

func wantCat(t *testing.T, err error, c errdefs.Category) {
	t.Helper()
	if err == nil || errdefs.CategoryOf(err) != c {
		t.Fatalf("err = %v (%v), want category %v", err, errdefs.CategoryOf(err), c)
	}
}

func readOr(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Fatalf("%s exists (err %v), want it gone", p, err)
	}
}

// hostFile is a would-be attack target the test owns.
func hostFile(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "host-file")
	if err := os.WriteFile(p, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue case 3: an absolute symlink a tree planted is kept as a link and a
// later copy whose destination passes through it is refused, so the host
// file it names is never written.
func TestPlantedAbsoluteSymlinkIsNeverFollowedByALaterCopy(t *testing.T) {
	tmp := t.TempDir()
	target := hostFile(t, tmp)
	dl := filepath.Join(tmp, "dl", "out")
	planted := func() *bytes.Buffer { return mktar(t, dir("./"), symlink("report.txt", target), symlink("sub", tmp)) }
	// By default such links are refused outright.
	_, err := extract(t, dl, planted(), Options{})
	wantCat(t, err, errdefs.Invalid)
	mustNotExist(t, filepath.Join(tmp, "dl"))
	// Kept as-is on request, and still never followed.
	if _, err := extract(t, dl, planted(), Options{SymlinksAsIs: true}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(filepath.Join(dl, "report.txt")); got != target {
		t.Fatalf("report.txt -> %q, want the target text kept", got)
	}
	// The second copy: a single file onto the planted link.
	_, err = ExtractFile(context.Background(), filepath.Join(dl, "report.txt"), mktar(t, file("report.txt", "pwned")), Options{})
	wantCat(t, err, errdefs.Invalid)
	if !strings.Contains(err.Error(), "realpath") {
		t.Fatalf("error %q does not tell the user to pass a resolved path", err)
	}
	// Through a planted directory symlink, as a file and as a tree.
	_, err = ExtractFile(context.Background(), filepath.Join(dl, "sub", "host-file"), mktar(t, file("x", "pwned")), Options{})
	wantCat(t, err, errdefs.Invalid)
	_, err = extract(t, filepath.Join(dl, "sub"), mktar(t, file("host-file", "pwned")), Options{})
	wantCat(t, err, errdefs.Invalid)
	// An archive entry replacing the planted link replaces the link only.
	if _, err := extract(t, dl, mktar(t, file("report.txt", "fresh")), Options{}); err != nil {
		t.Fatal(err)
	}
	if got := readOr(t, target); got != "host" {
		t.Fatalf("host file now %q", got)
	}
	if fi, _ := os.Lstat(filepath.Join(dl, "report.txt")); !fi.Mode().IsRegular() {
		t.Fatalf("report.txt is %v, want a regular file", fi.Mode())
	}
}

// Issue case 2: ACLs, xattrs and dangerous modes from the sandbox are not
// carried onto the host unless asked for.
func TestACLsXattrsAndModesAreNotRestored(t *testing.T) {
	acl := map[string]string{
		"SCHILY.xattr.system.posix_acl_default": "\x02\x00\x00\x00\x01\x00\x07\x00\xff\xff\xff\xff\x04\x00\x07\x00\xff\xff\xff\xff\x20\x00\x07\x00\xff\xff\xff\xff",
		"SCHILY.xattr.user.note":                "hello",
		"SCHILY.acl.default":                    "user::rwx",
	}
	mk := func() *bytes.Buffer {
		d := dir("shared/")
		d.mode, d.pax = 0o1777|0o2000, acl
		f := file("shared/tool", "x")
		f.mode = 0o4777
		f.pax = map[string]string{"SCHILY.xattr.user.note": "hi", "SCHILY.xattr.security.capability": "\x01"}
		return mktar(t, dir("./"), d, f)
	}
	dest := filepath.Join(t.TempDir(), "d")
	st, err := extract(t, dest, mk(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"shared": os.ModeDir | 0o755, "shared/tool": 0o755} {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s mode %v, want %v", p, fi.Mode(), want)
		}
	}
	for _, p := range []string{"shared", "shared/tool"} {
		buf := make([]byte, 4096)
		if n, _ := unix.Llistxattr(filepath.Join(dest, p), buf); n > 0 {
			t.Errorf("%s has xattrs %q", p, buf[:n])
		}
	}
	if st.ModesMasked != 2 || st.SpecialBits != 2 || st.XattrsDropped != 5 {
		t.Errorf("stats %+v: want 2 masked, 2 with special bits, 5 xattrs dropped", st)
	}
	// A file created later in the directory gets no ACL-granted access.
	p := filepath.Join(dest, "shared", "later")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Getxattr(p, "system.posix_acl_access", nil); err == nil && n > 0 {
		t.Errorf("a later file inherited an ACL")
	}

	// Opting in keeps the bits and the allowed xattrs, and only those.
	dest2 := filepath.Join(t.TempDir(), "d")
	if _, err := extract(t, dest2, mk(), Options{Preserve: true, XattrAllow: []string{"user."}}); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Lstat(filepath.Join(dest2, "shared", "tool"))
	if fi.Mode() != os.ModeSetuid|0o777 {
		t.Errorf("preserved mode %v", fi.Mode())
	}
	buf := make([]byte, 64)
	if n, err := unix.Getxattr(filepath.Join(dest2, "shared"), "user.note", buf); err != nil || string(buf[:n]) != "hello" {
		t.Errorf("allowed xattr user.note: %q %v", buf[:max(n, 0)], err)
	}
	if _, err := unix.Getxattr(filepath.Join(dest2, "shared"), "system.posix_acl_default", nil); err == nil {
		t.Errorf("ACL applied though only user. was allowed")
	}
}

// Issue case 1 and variants: symlink chains through "..", through a
// symlink to "." and through directories that appear later are stored as
// links, and no entry is ever written through one.
func TestSymlinkChainsAreNeverFollowed(t *testing.T) {
	tmp := t.TempDir()
	secret := filepath.Join(tmp, "SECRET")
	os.WriteFile(secret, []byte("secret"), 0o600)
	dest := filepath.Join(tmp, "dest")
	chain := func() *bytes.Buffer {
		return mktar(t, dir("./"),
			symlink("answer.txt", "b/c/../../SECRET"), symlink("b", "."), dir("c/"),
			symlink("l", "d/../.."), dir("d/"))
	}
	// By default the link that could lead out is refused.
	_, err := extract(t, dest, chain(), Options{})
	wantCat(t, err, errdefs.Invalid)
	mustNotExist(t, dest)
	if _, err := extract(t, dest, chain(), Options{SymlinksAsIs: true}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(filepath.Join(dest, "answer.txt")); got != "b/c/../../SECRET" {
		t.Fatalf("answer.txt -> %q", got)
	}
	for _, name := range []string{"b/c/../../SECRET", "b/SECRET", "l/SECRET", "l/x/y"} {
		_, err := extract(t, dest, mktar(t, file(name, "pwned")), Options{SymlinksAsIs: true})
		if errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("entry %q: err %v, want Invalid", name, err)
		}
	}
	if got := readOr(t, secret); got != "secret" {
		t.Fatalf("SECRET now %q", got)
	}
	mustNotExist(t, filepath.Join(tmp, "x"))
	mustNotExist(t, filepath.Join(dest, "SECRET"))
}

// A symlink loop is refused as a parent at once, not looped on.
func TestSymlinkLoop(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "dest")
	_, err := extract(t, dest, mktar(t, dir("./"), symlink("a", "b"), symlink("b", "a"), file("a/x", "1")), Options{})
	wantCat(t, err, errdefs.Invalid)
	mustNotExist(t, dest)
}

// A name that is a prefix of the destination's sibling ("dest" and
// "dest2") stays out of the sibling, and rollback does not touch it.
func TestSiblingWithPrefixName(t *testing.T) {
	tmp := t.TempDir()
	dest, dest2 := filepath.Join(tmp, "dest"), filepath.Join(tmp, "dest2")
	os.Mkdir(dest2, 0o755)
	os.WriteFile(filepath.Join(dest2, "keep"), []byte("k"), 0o644)
	for _, tr := range []*bytes.Buffer{
		mktar(t, dir("./"), file("../dest2/x", "pwned")),
		mktar(t, dir("./"), symlink("s", "../dest2"), file("s/x", "pwned")),
		mktar(t, dir("./"), symlink("s", dest2), hardlink("h", "s/keep")),
		mktar(t, dir("./"), hardlink("h", "../dest2/keep")),
	} {
		_, err := extract(t, dest, tr, Options{SymlinksAsIs: true})
		wantCat(t, err, errdefs.Invalid)
		mustNotExist(t, dest)
	}
	mustNotExist(t, filepath.Join(dest2, "x"))
	if readOr(t, filepath.Join(dest2, "keep")) != "k" {
		t.Fatal("dest2/keep changed")
	}
	if fi, _ := os.Stat(filepath.Join(dest2, "keep")); fi.Sys().(*syscall.Stat_t).Nlink != 1 {
		t.Fatal("dest2/keep gained a link")
	}
}

// Repeated names: a later entry replaces an earlier one of the same name,
// and never writes through a symlink the earlier one made.
func TestRepeatedNames(t *testing.T) {
	tmp := t.TempDir()
	target := hostFile(t, tmp)
	dest := filepath.Join(tmp, "dest")
	_, err := extract(t, dest, mktar(t, dir("./"),
		file("x", "data"), symlink("x", target),
		symlink("y", target), file("y", "data"),
		dir("z/"), file("z/in", "1"), file("z", "now a file"),
		symlink("w", tmp), dir("w/")), Options{SymlinksAsIs: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(filepath.Join(dest, "x")); got != target {
		t.Errorf("x -> %q, want the later symlink", got)
	}
	if got := readOr(t, filepath.Join(dest, "y")); got != "data" {
		t.Errorf("y = %q", got)
	}
	if got := readOr(t, filepath.Join(dest, "z")); got != "now a file" {
		t.Errorf("z = %q", got)
	}
	if fi, _ := os.Lstat(filepath.Join(dest, "w")); !fi.IsDir() {
		t.Errorf("w is %v", fi.Mode())
	}
	if got := readOr(t, target); got != "host" {
		t.Fatalf("host file now %q", got)
	}
}

// Devices and FIFOs are counted, never created.
func TestDevicesAndFIFOsSkipped(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "dest")
	st, err := extract(t, dest, mktar(t, dir("./"),
		ent{name: "fifo", typ: tar.TypeFifo, mode: 0o666},
		ent{name: "mem", typ: tar.TypeChar, mode: 0o666},
		ent{name: "sda", typ: tar.TypeBlock, mode: 0o666}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Skipped != 3 {
		t.Errorf("skipped %d, want 3", st.Skipped)
	}
	for _, n := range []string{"fifo", "mem", "sda"} {
		mustNotExist(t, filepath.Join(dest, n))
	}
}

// Hard links only to regular files this extraction created.
func TestHardlinks(t *testing.T) {
	tmp := t.TempDir()
	target := hostFile(t, tmp)
	dest := filepath.Join(tmp, "dest")
	os.Mkdir(dest, 0o755)
	os.WriteFile(filepath.Join(dest, "old"), []byte("old"), 0o644)
	for _, tr := range []*bytes.Buffer{
		mktar(t, hardlink("h", "old")),
		mktar(t, symlink("s", target), hardlink("h", "s")),
		mktar(t, dir("d/"), hardlink("h", "d")),
		mktar(t, hardlink("h", "missing")),
		mktar(t, hardlink("h", target)), // absolute: relative to dest, missing
	} {
		_, err := extract(t, dest, tr, Options{SymlinksAsIs: true})
		wantCat(t, err, errdefs.Invalid)
		mustNotExist(t, filepath.Join(dest, "h"))
		mustNotExist(t, filepath.Join(dest, "s"))
	}
	if _, err := extract(t, dest, mktar(t, file("new", "n"), hardlink("h", "new"), hardlink("h", "new")), Options{}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(dest, "new"))
	b, _ := os.Stat(filepath.Join(dest, "h"))
	if !os.SameFile(a, b) {
		t.Fatal("h is not a link to new")
	}
	for _, p := range []string{target, filepath.Join(dest, "old")} {
		var st unix.Stat_t
		unix.Stat(p, &st)
		if st.Nlink != 1 {
			t.Errorf("%s has %d links", p, st.Nlink)
		}
	}
}

// Budgets: going over is Exhausted, the partial tree goes, and what was
// at the destination before stays.
func TestBudgetsRemoveThePartialTree(t *testing.T) {
	tmp := t.TempDir()
	dest := filepath.Join(tmp, "dest")
	os.MkdirAll(filepath.Join(dest, "pre"), 0o755)
	os.WriteFile(filepath.Join(dest, "pre", "keep"), []byte("k"), 0o644)
	os.WriteFile(filepath.Join(dest, "keep"), []byte("k"), 0o644)
	big := mktar(t, dir("./"), dir("new/"), file("new/a", "aaaa"), file("pre/b", "bbbb"),
		file("c", "cccc"), dir("pre/sub/"), file("pre/sub/d", "dddd"))
	raw := big.Bytes()
	for _, o := range []Options{{MaxBytes: 15}, {MaxEntries: 6}} {
		_, err := extract(t, dest, bytes.NewReader(raw), o)
		wantCat(t, err, errdefs.Exhausted)
		if !strings.Contains(err.Error(), "raise it with") {
			t.Errorf("error %q does not name the option", err)
		}
		for _, p := range []string{"new", "pre/b", "c", "pre/sub"} {
			mustNotExist(t, filepath.Join(dest, p))
		}
		if readOr(t, filepath.Join(dest, "keep"))+readOr(t, filepath.Join(dest, "pre", "keep")) != "kk" {
			t.Fatal("pre-existing files changed")
		}
	}
	// A fresh destination goes entirely, with the parents it made.
	fresh := filepath.Join(tmp, "a", "b", "dest")
	_, err := extract(t, fresh, bytes.NewReader(raw), Options{MaxEntries: 3})
	wantCat(t, err, errdefs.Exhausted)
	mustNotExist(t, filepath.Join(tmp, "a"))
	// A truncated archive is Invalid and rolled back too.
	_, err = extract(t, fresh, bytes.NewReader(raw[:len(raw)-1024]), Options{})
	wantCat(t, err, errdefs.Invalid)
	mustNotExist(t, filepath.Join(tmp, "a"))
	// Within budget everything lands.
	if _, err := extract(t, dest, bytes.NewReader(raw), Options{MaxBytes: 16, MaxEntries: 7}); err != nil {
		t.Fatal(err)
	}
}

// Issue case 4: a 3 GB sparse file stays holes on the host, and the
// default budget refuses it before writing a byte.
func TestSparseFileKeptAsHoles(t *testing.T) {
	const size = 3 << 30
	gen := func(tw *tar.Writer) error {
		if err := tw.WriteHeader(&tar.Header{Name: "sparse", Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, "head"); err != nil {
			return err
		}
		if _, err := io.CopyN(tw, zeroReader{}, size-8); err != nil {
			return err
		}
		_, err := io.WriteString(tw, "tail")
		return err
	}
	tmp := t.TempDir()
	dest := filepath.Join(tmp, "dest")
	_, err := extract(t, dest, pipeTar(gen), Options{})
	wantCat(t, err, errdefs.Exhausted)
	mustNotExist(t, dest)

	if _, err := extract(t, dest, pipeTar(gen), Options{MaxBytes: -1}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dest, "sparse"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks*512 > 1<<20 {
		t.Fatalf("size %d, %d bytes allocated: want %d and holes", st.Size, st.Blocks*512, size)
	}
	f, _ := os.Open(filepath.Join(dest, "sparse"))
	defer f.Close()
	b := make([]byte, 4)
	f.ReadAt(b, size-4)
	if string(b) != "tail" {
		t.Fatalf("tail %q", b)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// 100,000 tiny files land, with a handful of descriptors.
func TestManyTinyFiles(t *testing.T) {
	const n = 100_000
	gen := func(tw *tar.Writer) error {
		for i := range n {
			name := "d" + strconv.Itoa(i/1000) + "/f" + strconv.Itoa(i)
			if i%1000 == 0 {
				if err := writeEnts(tw, dir("d"+strconv.Itoa(i/1000)+"/")); err != nil {
					return err
				}
			}
			if err := writeEnts(tw, file(name, "x")); err != nil {
				return err
			}
		}
		return nil
	}
	dest := filepath.Join(tmpfsDir(t), "dest")
	start := time.Now()
	st, err := Extract(context.Background(), dest, pipeTar(gen), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d files in %v", st.Files, time.Since(start))
	if st.Files != n {
		t.Fatalf("files %d", st.Files)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// tmpfsDir mounts a private tmpfs: the root ext4 of these machines has no
// journal and a slow inode allocator (100,000 files took 33 s there), and
// these tests are about the extractor, not the disk.
func tmpfsDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=512m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(d, unix.MNT_DETACH) })
	return d
}

// rawEntry writes a header for name with a PAX path record, by hand:
// archive/tar's Writer formats error text for every long name, which for a
// 30,000-deep tree (1.8 GB of names) takes minutes.
func rawEntry(w io.Writer, name string, typ byte, body string) error {
	rec := " path=" + name + "\n"
	n := len(rec) + 1
	for len(strconv.Itoa(n))+len(rec) != n {
		n++
	}
	rec = strconv.Itoa(n) + rec
	if err := rawHeader(w, "pax", tar.TypeXHeader, int64(len(rec))); err != nil {
		return err
	}
	if err := rawBody(w, rec); err != nil {
		return err
	}
	if err := rawHeader(w, "x", typ, int64(len(body))); err != nil {
		return err
	}
	return rawBody(w, body)
}

func rawHeader(w io.Writer, name string, typ byte, size int64) error {
	var b [512]byte
	copy(b[0:], name)
	copy(b[100:], "0000755\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], []byte(strconv.FormatInt(size+(1<<33), 8)[1:]+"\x00"))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	copy(b[148:], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], []byte(strconv.FormatInt(int64(sum)+(1<<18), 8)[1:]+"\x00 "))
	_, err := w.Write(b[:])
	return err
}

func rawBody(w io.Writer, body string) error {
	if body == "" {
		return nil
	}
	pad := (512 - len(body)%512) % 512
	_, err := io.WriteString(w, body+strings.Repeat("\x00", pad))
	return err
}

func rawTar(gen func(w io.Writer) error) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		bw := bufio.NewWriterSize(pw, 1<<20)
		err := gen(bw)
		if err == nil {
			_, err = bw.Write(make([]byte, 1024))
		}
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

// A 30,000-deep tree (paths of 60,000 bytes, far over PATH_MAX) extracts
// with a bounded number of descriptors and is removed whole when a budget
// stops it at the bottom.
func TestDeepTree(t *testing.T) {
	const depth = 30_000
	gen := func(extra bool) io.Reader {
		return rawTar(func(w io.Writer) error {
			var name strings.Builder
			for range depth {
				name.WriteString("a/")
				if err := rawEntry(w, name.String(), tar.TypeDir, ""); err != nil {
					return err
				}
			}
			leaf := name.String()
			if err := rawEntry(w, leaf+"leaf", tar.TypeReg, "deep"); err != nil || !extra {
				return err
			}
			for _, n := range []string{"top", leaf + "leaf2", "b/c"} {
				if err := rawEntry(w, n, tar.TypeReg, "x"); err != nil {
					return err
				}
			}
			return nil
		})
	}
	tmp := tmpfsDir(t)
	dest := filepath.Join(tmp, "dest")
	// os.RemoveAll (TempDir's cleanup) cannot remove a tree this deep.
	t.Cleanup(func() { removeAt(t, tmp, "dest") })
	before := openFDs(t)
	peak := 0
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
				peak = max(peak, openFDs(t))
			}
		}
	}()
	st, err := Extract(context.Background(), dest, gen(true), Options{})
	close(done)
	<-stopped
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v, fds before %d peak %d", st, before, peak)
	if peak > before+16 {
		t.Fatalf("descriptors grew from %d to %d", before, peak)
	}
	if st.Dirs != depth || st.Files != 4 {
		t.Fatalf("stats %+v", st)
	}
	// Stopped by the entry budget at the very bottom: all of it goes.
	dest2 := filepath.Join(tmp, "dest2")
	_, err = Extract(context.Background(), dest2, gen(false), Options{MaxEntries: depth})
	wantCat(t, err, errdefs.Exhausted)
	mustNotExist(t, dest2)
	if openFDs(t) > before+2 {
		t.Fatalf("descriptors leaked: %d, were %d", openFDs(t), before)
	}
}

func removeAt(t *testing.T, dir, name string) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Error(err)
		return
	}
	defer unix.Close(fd)
	if err := removeTree(fd, name); err != nil {
		t.Error(err)
	}
}

// The destination path itself is resolved without following symlinks.
func TestDestinationWithASymlinkIsRefused(t *testing.T) {
	tmp := t.TempDir()
	real := filepath.Join(tmp, "real")
	os.Mkdir(real, 0o755)
	os.Symlink(real, filepath.Join(tmp, "link"))
	for _, d := range []string{filepath.Join(tmp, "link"), filepath.Join(tmp, "link", "sub")} {
		_, err := extract(t, d, mktar(t, file("x", "1")), Options{})
		wantCat(t, err, errdefs.Invalid)
		if !strings.Contains(err.Error(), "realpath") {
			t.Errorf("%q lacks the realpath hint", err)
		}
		if _, err := IsDir(d); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("IsDir(%s) err %v", d, err)
		}
	}
	mustNotExist(t, filepath.Join(real, "x"))
	mustNotExist(t, filepath.Join(real, "sub"))
	if ok, err := IsDir(real); !ok || err != nil {
		t.Fatalf("IsDir(real) %v %v", ok, err)
	}
	if ok, err := IsDir(filepath.Join(tmp, "missing", "x")); ok || err != nil {
		t.Fatalf("IsDir(missing) %v %v", ok, err)
	}
	// A relative destination that climbs works from the kernel's cwd.
	wd, _ := os.Getwd()
	defer os.Chdir(wd)
	os.Chdir(real)
	if _, err := extract(t, "../rel", mktar(t, file("x", "1")), Options{}); err != nil {
		t.Fatal(err)
	}
	if readOr(t, filepath.Join(tmp, "rel", "x")) != "1" {
		t.Fatal("relative destination")
	}
}

// ExtractFile writes one file, replaces a regular file atomically, and
// refuses archives that are not a single regular file.
func TestExtractFile(t *testing.T) {
	tmp := t.TempDir()
	p := filepath.Join(tmp, "out.txt")
	os.WriteFile(p, []byte("old"), 0o600)
	if _, err := ExtractFile(context.Background(), p, mktar(t, file("x", "new")), Options{}); err != nil {
		t.Fatal(err)
	}
	if readOr(t, p) != "new" {
		t.Fatal("not replaced")
	}
	for _, tr := range []*bytes.Buffer{
		mktar(t, dir("d/")),
		mktar(t, file("a", "1"), file("b", "2")),
		mktar(t, symlink("s", "/etc/passwd")),
	} {
		_, err := ExtractFile(context.Background(), p, tr, Options{})
		wantCat(t, err, errdefs.Invalid)
		if readOr(t, p) != "new" {
			t.Fatal("a failed copy changed the file")
		}
	}
	_, err := ExtractFile(context.Background(), p, mktar(t, file("x", "12345")), Options{MaxBytes: 4})
	wantCat(t, err, errdefs.Exhausted)
	_, err = ExtractFile(context.Background(), filepath.Join(tmp, "nodir", "f"), mktar(t, file("x", "1")), Options{})
	wantCat(t, err, errdefs.NotFound)
	ents, _ := os.ReadDir(tmp)
	if len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
}

func TestGzipAccepted(t *testing.T) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(mktar(t, file("f", "zipped")).Bytes())
	zw.Close()
	dest := filepath.Join(t.TempDir(), "dest")
	if _, err := extract(t, dest, &b, Options{}); err != nil {
		t.Fatal(err)
	}
	if readOr(t, filepath.Join(dest, "f")) != "zipped" {
		t.Fatal("content")
	}
}

// Content with zero runs at odd offsets and sizes comes out byte for byte.
func TestHolesKeepContent(t *testing.T) {
	var want []byte
	for i, n := range []int{5000, 8192, 1, 4096 * 3, 300, 700_000, 4095, 12} {
		chunk := make([]byte, n)
		if i%2 == 0 {
			for j := range chunk {
				chunk[j] = byte(j%251 + 1)
			}
		}
		want = append(want, chunk...)
	}
	dest := filepath.Join(t.TempDir(), "dest")
	if _, err := extract(t, dest, mktar(t, file("f", string(want)), file("zeros", string(make([]byte, 9000)))), Options{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dest, "f")); !bytes.Equal(got, want) {
		t.Fatalf("content differs (%d vs %d bytes)", len(got), len(want))
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(dest, "zeros"), &st)
	if st.Size != 9000 || st.Blocks != 0 {
		t.Fatalf("all-zero file: size %d, %d blocks", st.Size, st.Blocks)
	}
}

func TestLinkEscapes(t *testing.T) {
	for _, c := range []struct {
		target string
		depth  int
		ok     bool
	}{
		{"a", 0, true}, {".", 0, true}, {"a/b/./c", 0, true}, {"sub/", 0, true},
		{"../x", 1, true}, {"../../x", 2, true}, {"./../x", 1, true}, {"..", 1, true},
		{"/etc/passwd", 5, false}, {"../x", 0, false}, {"..", 0, false}, {"../../../x", 2, false},
		{"b/c/../../SECRET", 3, false}, {"d/..", 1, false}, {"a/../b", 1, false}, {"..//..//x", 1, false},
	} {
		if why := linkEscapes(c.target, c.depth); (why == "") != c.ok {
			t.Errorf("linkEscapes(%q, %d) = %q, want ok=%v", c.target, c.depth, why, c.ok)
		}
	}
	// A contained link deep in a tree extracts; one climbing a level too
	// far does not.
	dest := filepath.Join(t.TempDir(), "dest")
	if _, err := extract(t, dest, mktar(t, dir("a/b/"), symlink("a/b/up", "../../top"), symlink("a/b/here", ".")), Options{}); err != nil {
		t.Fatal(err)
	}
	_, err := extract(t, dest, mktar(t, symlink("a/b/out", "../../../x")), Options{})
	wantCat(t, err, errdefs.Invalid)
	mustNotExist(t, filepath.Join(dest, "a/b/out"))
}

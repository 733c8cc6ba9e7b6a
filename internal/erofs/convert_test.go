package erofs

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goerofs "github.com/erofs/go-erofs"

	"github.com/warrenrl/warren/internal/errdefs"
)

type ent struct {
	hdr  tar.Header
	body string
}

func mkTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func f(name, body string) ent { return ent{hdr: tar.Header{Name: name}, body: body} }
func d(name string) ent       { return ent{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}} }

// convert converts data and opens the result with go-erofs's reader.
func convert(t *testing.T, data []byte, opts Options) (fs.FS, Stats, error) {
	t.Helper()
	out, err := os.Create(filepath.Join(t.TempDir(), "layer.erofs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	opts.TempDir = t.TempDir()
	st, err := Convert(context.Background(), bytes.NewReader(data), out, opts)
	if err != nil {
		return nil, st, err
	}
	img, err := goerofs.Open(out)
	if err != nil {
		t.Fatalf("reading the image back: %v", err)
	}
	return img, st, nil
}

func TestConvertBasics(t *testing.T) {
	data := mkTar(t,
		d("dir/"),
		ent{hdr: tar.Header{Name: "dir/suid", Mode: 0o4755, Uid: 7, Gid: 8, ModTime: time.Unix(1234, 5678),
			PAXRecords: map[string]string{"SCHILY.xattr.user.a": "1", "SCHILY.xattr.trusted.overlay.opaque": "y", "SCHILY.xattr.security.selinux": "x"}}, body: "hello"},
		ent{hdr: tar.Header{Name: "dir/link", Typeflag: tar.TypeSymlink, Linkname: "../../outside"}},
		ent{hdr: tar.Header{Name: "dir/hard", Typeflag: tar.TypeLink, Linkname: "dir/suid"}},
		ent{hdr: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		f("dir/.wh.gone", ""), f("opq/.wh..wh..opq", ""), f("opq/kept", "k"),
		f("/abs/path", "neutralised"), f("./dup", "one"), f("dup", "two"),
	)
	img, st, err := convert(t, data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if st.DiffID != "sha256:"+hex.EncodeToString(sum[:]) || st.TarBytes != int64(len(data)) {
		t.Fatalf("diffID %s", st.DiffID)
	}
	if st.Hardlinks != 1 || st.Whiteouts != 1 || st.Opaques != 1 || st.DevicesSkipped != 1 || st.XattrsSkipped != 2 {
		t.Fatalf("stats %+v", st)
	}
	fi, err := fs.Stat(img, "dir/suid")
	if err != nil {
		t.Fatal(err)
	}
	es := fi.Sys().(*goerofs.Stat)
	if es.Mode&fs.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 || es.UID != 7 || es.GID != 8 || es.Xattrs["user.a"] != "1" || len(es.Xattrs) != 1 {
		t.Fatalf("dir/suid: %v %+v", fi.Mode(), es)
	}
	if b, _ := fs.ReadFile(img, "dir/hard"); string(b) != "hello" {
		t.Fatalf("hardlink content %q", b)
	}
	wo, err := fs.Stat(img, "dir/gone")
	if err != nil || wo.Mode()&fs.ModeCharDevice == 0 || wo.Sys().(*goerofs.Stat).Rdev != 0 {
		t.Fatalf("whiteout %v %v", wo, err)
	}
	od, _ := fs.Stat(img, "opq")
	if od.Sys().(*goerofs.Stat).Xattrs[OpaqueXattr] != "y" {
		t.Fatalf("opaque xattr missing: %+v", od.Sys())
	}
	if _, err := fs.Stat(img, "dev/null"); err == nil {
		t.Fatal("device node kept")
	}
	if b, _ := fs.ReadFile(img, "abs/path"); string(b) != "neutralised" {
		t.Fatalf("abs path: %q", b)
	}
	if b, _ := fs.ReadFile(img, "dup"); string(b) != "two" {
		t.Fatalf("duplicate entry: last must win, got %q", b)
	}
	if _, err := fs.Stat(img, "opq/.wh..wh..opq"); err == nil {
		t.Fatal("opaque marker stored as a file")
	}

	// Deterministic: the same layer gives the same bytes.
	out1, out2 := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	for _, p := range []string{out1, out2} {
		o, _ := os.Create(p)
		if _, err := Convert(context.Background(), bytes.NewReader(data), o, Options{TempDir: t.TempDir()}); err != nil {
			t.Fatal(err)
		}
		o.Close()
	}
	b1, _ := os.ReadFile(out1)
	b2, _ := os.ReadFile(out2)
	if !bytes.Equal(b1, b2) {
		t.Fatal("conversion is not deterministic")
	}

	// StripSetuid.
	img, st, err = convert(t, data, Options{StripSetuid: true})
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := fs.Stat(img, "dir/suid"); fi.Sys().(*goerofs.Stat).Mode&fs.ModeSetuid != 0 || st.SetuidStripped != 1 {
		t.Fatalf("setuid not stripped: %v %+v", fi.Mode(), st)
	}
}

func TestConvertBadInput(t *testing.T) {
	good := mkTar(t, f("a", "x"))
	huge := make([]ent, 0, 120)
	for i := 0; i < 120; i++ {
		huge = append(huge, f("f"+strings.Repeat("x", i%50)+string(rune('a'+i%26)), ""))
	}
	for _, tc := range []struct {
		name string
		data []byte
		opts Options
		cat  errdefs.Category
		msg  string
	}{
		{"dotdot", mkTar(t, f("a/../../b", "x")), Options{}, errdefs.Invalid, "escapes"},
		{"hardlink-escape", mkTar(t, ent{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../etc/passwd"}}), Options{}, errdefs.Invalid, "leaves the layer"},
		{"hardlink-missing", mkTar(t, ent{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "etc/passwd"}}), Options{}, errdefs.Invalid, "not in this layer"},
		{"hardlink-dir", mkTar(t, d("x/"), ent{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "x"}}), Options{}, errdefs.Invalid, "not a regular file"},
		{"under-file", mkTar(t, f("a", "x"), f("a/b", "y")), Options{}, errdefs.Invalid, "not a directory"},
		{"truncated", good[:600], Options{}, errdefs.Invalid, "truncated"},
		{"garbage", bytes.Repeat([]byte("not a tar "), 200), Options{}, errdefs.Invalid, ""},
		{"empty", nil, Options{}, errdefs.Invalid, "empty"},
		{"too-many-files", mkTar(t, huge...), Options{MaxFiles: 100}, errdefs.Exhausted, "more than 100"},
		{"too-many-bytes", mkTar(t, f("a", strings.Repeat("x", 5000))), Options{MaxBytes: 4096}, errdefs.Exhausted, "limit"},
		{"diffid", good, Options{ExpectDiffID: "sha256:" + strings.Repeat("0", 64)}, errdefs.Invalid, "diffID mismatch"},
		{"long-name", mkTar(t, f(strings.Repeat("n", 256), "")), Options{}, errdefs.Invalid, "longer than"},
		{"replace-root", mkTar(t, f(".", "")), Options{}, errdefs.Invalid, "root"},
		{"fifo-root-ok", mkTar(t, ent{hdr: tar.Header{Name: "p", Typeflag: tar.TypeFifo}}), Options{}, errdefs.Unknown, ""},
	} {
		_, _, err := convert(t, tc.data, tc.opts)
		if tc.cat == errdefs.Unknown {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || errdefs.CategoryOf(err) != tc.cat || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: want %v %q, got %v (%v)", tc.name, tc.cat, tc.msg, errdefs.CategoryOf(err), err)
		}
	}
}

// Directories holding whiteouts get an empty trusted.overlay.origin, so
// overlayfs never lists them directly (which would show the whiteouts);
// names need not be UTF-8; directories named ".wh.*" are refused.
func TestConvertWhiteoutDirsAndNames(t *testing.T) {
	data := mkTar(t, d("a/"), f("a/.wh.x", ""), f("a/y", "y"), d("b/"), f("b/z", "z"), f(".wh.top", ""),
		f("latin1/caf\xe9", "bytes"))
	img, st, err := convert(t, data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Whiteouts != 2 {
		t.Fatalf("stats %+v", st)
	}
	for p, want := range map[string]bool{".": true, "a": true, "b": false, "latin1": false} {
		fi, err := fs.Stat(img, p)
		if err != nil {
			t.Fatal(err)
		}
		v, ok := fi.Sys().(*goerofs.Stat).Xattrs[OriginXattr]
		if ok != want || v != "" {
			t.Errorf("%s: %s present %v (%q), want %v", p, OriginXattr, ok, v, want)
		}
	}
	if b, err := fs.ReadFile(img, "latin1/caf\xe9"); err != nil || string(b) != "bytes" {
		t.Fatalf("non-UTF-8 name: %q %v", b, err)
	}
	_, _, err = convert(t, mkTar(t, f("a/.wh.dir/file", "x")), Options{})
	if errdefs.CategoryOf(err) != errdefs.Invalid || !strings.Contains(err.Error(), "reserved for whiteouts") {
		t.Fatalf("a directory named .wh.*: %v", err)
	}
}

func TestConvertCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, _ := os.Create(filepath.Join(t.TempDir(), "x"))
	defer out.Close()
	_, err := Convert(ctx, bytes.NewReader(mkTar(t, f("a", "b"))), out, Options{TempDir: t.TempDir()})
	if err == nil {
		t.Fatal("conversion ignored a cancelled context")
	}
}

// BenchmarkConvert measures conversion speed on a synthetic layer.
func BenchmarkConvert(b *testing.B) {
	var ents []ent
	body := strings.Repeat("z", 64<<10)
	for i := 0; i < 1024; i++ {
		ents = append(ents, f("dir"+string(rune('a'+i%26))+"/file"+strings.Repeat("x", i%7)+string(rune('a'+i/26%26))+string(rune('a'+i%26)), body))
	}
	data := mkTar(b, ents...)
	dir := b.TempDir()
	b.SetBytes(int64(len(data)))
	for i := 0; i < b.N; i++ {
		out, _ := os.Create(filepath.Join(dir, "out"))
		if _, err := Convert(context.Background(), bytes.NewReader(data), out, Options{TempDir: dir}); err != nil {
			b.Fatal(err)
		}
		out.Close()
	}
	_ = io.Discard
}

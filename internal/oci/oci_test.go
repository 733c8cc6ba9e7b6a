package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/testutil"
)

// ent describes one tar entry of a generated layer.
type ent struct {
	name, link string
	typ        byte
	mode       int64
	uid, gid   int
	body       string
	xattrs     map[string]string
}

func dir(n string, mode int64) ent { return ent{name: n, typ: tar.TypeDir, mode: mode} }
func file(n, body string) ent      { return ent{name: n, typ: tar.TypeReg, mode: 0o644, body: body} }
func symlink(n, target string) ent {
	return ent{name: n, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(n, target string) ent  { return ent{name: n, typ: tar.TypeLink, link: target} }
func whiteout(dirName, n string) ent { return file(filepath.Join(dirName, ".wh."+n), "") }

func layerTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, Linkname: e.link,
			ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if len(e.xattrs) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range e.xattrs {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
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

func mkLayer(t testing.TB, data []byte, opts ...tarball.LayerOption) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is a three-layer image exercising whiteouts of files and
// directories, opaque directories, hardlinks, symlinks (absolute and
// relative), setuid bits, owners and xattrs.
func testImage(t testing.TB, opts ...tarball.LayerOption) v1.Image {
	t.Helper()
	big := strings.Repeat("0123456789abcdef", 20000) // 320 KB, several blocks
	l0 := layerTar(t,
		dir("etc/", 0o755), file("etc/passwd", "root:x:0:0\n"),
		ent{name: "etc/shadow", typ: tar.TypeReg, mode: 0o640, gid: 42, body: "secret\n"},
		dir("usr/", 0o755), dir("usr/bin/", 0o755),
		ent{name: "usr/bin/tool", typ: tar.TypeReg, mode: 0o4755, body: "#!/bin/sh\necho tool\n"},
		hardlink("usr/bin/tool2", "usr/bin/tool"),
		symlink("usr/lib", "/lib"), symlink("usr/rel", "../etc/passwd"),
		dir("opq/", 0o755), file("opq/a", "a"), dir("opq/sub/", 0o700), file("opq/sub/b", "b"),
		dir("gone/", 0o755), file("gone/x", "x"), dir("gone/inner/", 0o755), file("gone/inner/y", "y"),
		dir("keep/", 0o755), ent{name: "keep/file", typ: tar.TypeReg, mode: 0o644, body: "v1", xattrs: map[string]string{"user.test": "one", "user.other": "x"}},
		file("todelete", "bye"), file("big", big), dir("emptydir/", 0o1777),
	)
	l1 := layerTar(t,
		whiteout("", "todelete"), whiteout("", "gone"),
		dir("opq/", 0o750), file("opq/.wh..wh..opq", ""), file("opq/new", "new"),
		dir("etc/", 0o755), file("etc/passwd", "root:x:0:0\nuser:x:1000:1000\n"),
		dir("keep/", 0o755), symlink("keep/file2", "file"),
		dir("newdir/", 0o755), file("newdir/h1", "linked"), hardlink("newdir/h2", "newdir/h1"),
		dir("data/", 0o711), ent{name: "data/owned", typ: tar.TypeReg, mode: 0o600, uid: 1000, gid: 1001, body: "mine"},
	)
	l2 := layerTar(t,
		dir("etc/", 0o755), whiteout("etc", "shadow"),
		dir("gone/", 0o755), file("gone/again", "back"),
		dir("usr/", 0o755), dir("usr/bin/", 0o755), symlink("usr/bin/tool", "tool2"),
		dir("keep/", 0o755), ent{name: "keep/file", typ: tar.TypeReg, mode: 0o600, body: "v2", xattrs: map[string]string{"user.test": "two"}},
		ent{name: "sbin/", typ: tar.TypeDir, mode: 0o755}, ent{name: "sbin/sg", typ: tar.TypeReg, mode: 0o2755, gid: 5, body: "sg"},
	)
	img, err := mutate.AppendLayers(empty.Image, mkLayer(t, l0, opts...), mkLayer(t, l1, opts...), mkLayer(t, l2, opts...))
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/usr/bin:/bin", "A=b"}, Cmd: []string{"/bin/sh"}, WorkingDir: "/work"})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// builders runs fn once per layer converter: go-erofs, and mkfs.erofs
// >= 1.8 (skipped, saying why, when it is not installed).
func builders(t *testing.T, fn func(t *testing.T, mk *erofs.Mkfs)) {
	t.Run("go-erofs", func(t *testing.T) { fn(t, nil) })
	t.Run("mkfs.erofs", func(t *testing.T) {
		mk, why, err := erofs.SelectMkfs(os.Getenv(erofs.MkfsEnv))
		if err != nil {
			t.Fatalf("$%s: %v", erofs.MkfsEnv, err)
		}
		if mk == nil {
			t.Skipf("mkfs.erofs converter not tested: %v", why)
		}
		fn(t, mk)
	})
}

func newStore(t *testing.T, mk ...*erofs.Mkfs) *image.Store {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	o := image.Options{Root: filepath.Join(dir, "store"), MountDir: filepath.Join(dir, "mnt"), MountGrace: -1, GCGrace: -1}
	if len(mk) > 0 {
		o.Mkfs = mk[0]
	}
	s, err := image.OpenStore(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		s.Mounts().UnmountAll()
	})
	return s
}

// mountStack mounts the image's layers as a read-only overlay.
func mountStack(t *testing.T, s *image.Store, img image.Image) string {
	t.Helper()
	dirs, release, err := s.LayerDirs(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	mp := t.TempDir()
	opts := "lowerdir=" + strings.Join(dirs, ":")
	if len(dirs) == 1 {
		// overlayfs needs two lower layers without an upper one.
		opts += ":" + t.TempDir()
	}
	if err := unix.Mount("overlay", mp, "overlay", unix.MS_RDONLY, opts); err != nil {
		release()
		t.Fatalf("mount overlay %s: %v", opts, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mp, 0); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
		release()
	})
	return mp
}

type fileState struct {
	typ    string
	mode   fs.FileMode
	uid    int
	gid    int
	sum    string
	link   string
	xattrs string
}

func (f fileState) String() string {
	return fmt.Sprintf("%s %v %d:%d %s %q [%s]", f.typ, f.mode, f.uid, f.gid, f.sum, f.link, f.xattrs)
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// flatten reads mutate.Extract's tarball into path -> state.
func flatten(t *testing.T, img v1.Image) map[string]fileState {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]fileState{}
	for h, data := range testutil.TarEntries(t, rc) {
		p := strings.TrimSuffix(strings.TrimPrefix(filepath.Clean("/"+h.Name), "/"), "/")
		if p == "" {
			continue
		}
		st := fileState{mode: h.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), uid: h.Uid, gid: h.Gid}
		var xs []string
		for k, v := range h.PAXRecords {
			if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok && strings.HasPrefix(x, "user.") {
				xs = append(xs, x+"="+v)
			}
		}
		sort.Strings(xs)
		st.xattrs = strings.Join(xs, ",")
		switch h.Typeflag {
		case tar.TypeDir:
			st.typ = "dir"
		case tar.TypeSymlink:
			st.typ, st.mode, st.link = "symlink", 0, h.Linkname
		case tar.TypeLink:
			target := strings.TrimPrefix(filepath.Clean("/"+h.Linkname), "/")
			st = out[target]
		default:
			b, err := io.ReadAll(data)
			if err != nil {
				t.Fatal(err)
			}
			st.typ, st.sum = "file", sum(b)
		}
		out[p] = st
	}
	return out
}

// walk reads a mounted tree into path -> state.
func walk(t *testing.T, root string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fi, _ := d.Info()
		s := fileState{mode: fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), uid: int(st.Uid), gid: int(st.Gid)}
		switch {
		case d.IsDir():
			s.typ = "dir"
		case d.Type()&fs.ModeSymlink != 0:
			s.typ, s.mode = "symlink", 0
			s.link, _ = os.Readlink(p)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s.typ, s.sum = "file", sum(b)
		default:
			s.typ = fmt.Sprintf("other(%v)", d.Type())
		}
		buf := make([]byte, 4096)
		n, _ := unix.Llistxattr(p, buf)
		var xs []string
		for _, x := range strings.Split(string(buf[:n]), "\x00") {
			if strings.HasPrefix(x, "user.") {
				v := make([]byte, 4096)
				m, err := unix.Lgetxattr(p, x, v)
				if err == nil {
					xs = append(xs, x+"="+string(v[:m]))
				}
			}
		}
		sort.Strings(xs)
		s.xattrs = strings.Join(xs, ",")
		out[rel] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func compareTrees(t *testing.T, want, got map[string]fileState) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("missing in the mounted stack: %s (%v)", p, w)
			continue
		}
		if g != w {
			t.Errorf("%s:\n  want %v\n  got  %v", p, w, g)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("extra in the mounted stack: %s (%v)", p, g)
		}
	}
}

func checkImage(t *testing.T, s *image.Store, rec image.Image, img v1.Image) {
	t.Helper()
	want := flatten(t, img)
	// mutate.Extract's flattened tar keeps "usr/bin/tool2" as a hardlink
	// to "usr/bin/tool", which an upper layer replaced by a symlink: the
	// name now resolves to the symlink. In the layer stack (as in Docker)
	// tool2 stays the file of the lower layer.
	if w, ok := want["usr/bin/tool2"]; ok && w.typ == "symlink" {
		want["usr/bin/tool2"] = fileState{typ: "file", mode: 0o755 | fs.ModeSetuid, sum: sum([]byte("#!/bin/sh\necho tool\n"))}
	}
	stack := mountStack(t, s, rec)
	got := walk(t, stack)
	compareTrees(t, want, got)
	checkHardlinks(t, s, rec, stack)
	for _, p := range []string{"gone/x", "todelete", "opq/a", "etc/shadow", "usr/bin/tool2"} {
		_, inWant := want[p]
		_, inGot := got[p]
		if inWant != inGot {
			t.Errorf("%s: want present=%v, got %v", p, inWant, inGot)
		}
	}
	if len(want) < 20 {
		t.Fatalf("oracle too small: %d entries", len(want))
	}
}

// checkHardlinks checks newdir/h1 and newdir/h2 (layer 1): one inode with
// two links when mkfs.erofs converted the layer (its metadata says so),
// two inodes with one link each (copies) with go-erofs; in the layer's
// own mount and in the stack.
func checkHardlinks(t *testing.T, s *image.Store, rec image.Image, stack string) {
	t.Helper()
	m, err := s.LayerMeta(rec.Layers[1])
	if err != nil {
		t.Fatal(err)
	}
	mkfs := strings.Contains(m.Builder, " mkfs.erofs/1.")
	if !mkfs && m.Builder != erofs.BuilderVersion {
		t.Fatalf("layer builder %q", m.Builder)
	}
	dirs, release, err := s.LayerDirs(context.Background(), rec)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	for _, root := range []string{dirs[1], stack} {
		var a, b unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, "newdir/h1"), &a); err != nil {
			t.Fatal(err)
		}
		if err := unix.Lstat(filepath.Join(root, "newdir/h2"), &b); err != nil {
			t.Fatal(err)
		}
		same := a.Ino == b.Ino && a.Dev == b.Dev
		if mkfs && (!same || a.Nlink != 2 || b.Nlink != 2) || !mkfs && (same || a.Nlink != 1 || b.Nlink != 1) {
			t.Errorf("%s (%s): h1 ino %d nlink %d, h2 ino %d nlink %d", root, m.Builder, a.Ino, a.Nlink, b.Ino, b.Nlink)
		}
	}
}

func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, host, repo string, img v1.Image) string {
	t.Helper()
	ref := host + "/" + repo
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

func TestImportRegistryMatchesExtract(t *testing.T) { builders(t, testImportRegistryMatchesExtract) }

func testImportRegistryMatchesExtract(t *testing.T, mk *erofs.Mkfs) {
	s := newStore(t, mk)
	host := startRegistry(t)
	img := testImage(t)
	ref := push(t, host, "test/img:v1", img)
	var events []Event
	rec, err := Import(context.Background(), s, ref, Options{Progress: func(e Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Name != DefaultName(Ref{Kind: KindRegistry, Location: ref}) || len(rec.Layers) != 3 || len(rec.DiffIDs) != 3 {
		t.Fatalf("record %+v", rec)
	}
	if rec.Config == nil || rec.Config.WorkingDir != "/work" || len(rec.Config.Env) != 2 || !strings.Contains(rec.Source, "@sha256:") {
		t.Fatalf("config %+v source %q", rec.Config, rec.Source)
	}
	done := 0
	for _, e := range events {
		if e.Status == "done" {
			done++
		}
	}
	if done != 3 {
		t.Fatalf("want 3 done events, got %d of %d", done, len(events))
	}
	checkImage(t, s, rec, img)

	// Importing again converts nothing: every layer "exists".
	events = nil
	rec2, err := Import(context.Background(), s, "docker://"+ref, Options{Name: "again", Progress: func(e Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rec2.Layers, ",") != strings.Join(rec.Layers, ",") {
		t.Fatalf("re-import changed the layers: %v vs %v", rec2.Layers, rec.Layers)
	}
	for _, e := range events {
		if e.Status == "downloading" || e.Status == "converting" {
			t.Fatalf("re-import fetched a layer: %+v", e)
		}
	}
}

func TestImportZstdAndUncompressedLayers(t *testing.T) {
	builders(t, testImportZstdAndUncompressedLayers)
}

func testImportZstdAndUncompressedLayers(t *testing.T, mk *erofs.Mkfs) {
	s := newStore(t, mk)
	host := startRegistry(t)
	for _, tc := range []struct {
		name string
		opts []tarball.LayerOption
	}{
		{"zstd", []tarball.LayerOption{tarball.WithCompression("zstd"), tarball.WithMediaType(types.OCILayerZStd)}},
	} {
		img := testImage(t, tc.opts...)
		ref := push(t, host, "test/"+tc.name+":v1", img)
		rec, err := Import(context.Background(), s, ref, Options{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		checkImage(t, s, rec, img)
	}
}

func TestImportLayoutAndDockerArchive(t *testing.T) { builders(t, testImportLayoutAndDockerArchive) }

func testImportLayoutAndDockerArchive(t *testing.T, mk *erofs.Mkfs) {
	s := newStore(t, mk)
	img := testImage(t)
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: "v1"})); err != nil {
		t.Fatal(err)
	}
	rec, err := Import(context.Background(), s, "oci:"+filepath.Join(dir, "layout")+":v1", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Name != "layout:v1" {
		t.Fatalf("name %q", rec.Name)
	}
	checkImage(t, s, rec, img)
	_, err = Import(context.Background(), s, "oci:"+filepath.Join(dir, "layout")+":nope", Options{})
	wantCat(t, err, errdefs.NotFound)

	tarPath := filepath.Join(dir, "img.tar")
	tag, _ := name.NewTag("example.com/app:v2")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}
	rec2, err := Import(context.Background(), s, "docker-archive:"+tarPath, Options{Name: "fromarchive"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rec2.Layers, ",") != strings.Join(rec.Layers, ",") {
		t.Fatalf("archive import gave other blobs: %v vs %v", rec2.Layers, rec.Layers)
	}
	// Same blobs: convert afresh in a new store to check the archive path.
	s2 := newStore(t, mk)
	rec3, err := Import(context.Background(), s2, "docker-archive:"+tarPath+":example.com/app:v2", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rec3.Name != "app:v2" {
		t.Fatalf("name %q", rec3.Name)
	}
	checkImage(t, s2, rec3, img)
}

func wantCat(t *testing.T, err error, cat errdefs.Category) {
	t.Helper()
	if err == nil || errdefs.CategoryOf(err) != cat {
		t.Fatalf("want a %v error, got %v (%v)", cat, errdefs.CategoryOf(err), err)
	}
}

// noPartial checks that a failed import left no blob, temp file or record.
func noPartial(t *testing.T, s *image.Store, before []string) {
	t.Helper()
	after, err := s.Blobs()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.GC(); err != nil {
		t.Fatal(err)
	}
	after, _ = s.Blobs()
	if strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("blobs left behind: %v (before %v)", after, before)
	}
	filepath.WalkDir(s.Root(), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".tmp-") || strings.HasPrefix(d.Name(), ".erofs-spool") {
			t.Errorf("temp file left: %s", p)
		}
		return nil
	})
	for _, m := range s.Mounts().List() {
		if m.Mounted {
			t.Errorf("mount left: %+v", m)
		}
	}
}

func TestImportBadInput(t *testing.T) { builders(t, testImportBadInput) }

func testImportBadInput(t *testing.T, mk *erofs.Mkfs) {
	s := newStore(t, mk)
	host := startRegistry(t)
	ctx := context.Background()
	good := layerTar(t, file("ok", "ok"))
	before, _ := s.Blobs()

	// A foreign layer.
	foreign, err := mutate.Append(empty.Image, mutate.Addendum{Layer: mkLayer(t, good), MediaType: types.DockerForeignLayer,
		URLs: []string{"https://example.invalid/layer"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Import(ctx, s, push(t, host, "bad/foreign:v1", foreign), Options{})
	wantCat(t, err, errdefs.Invalid)
	if !strings.Contains(err.Error(), "foreign") {
		t.Fatalf("error %v", err)
	}

	// A non-image artifact (its config is not an image config).
	art := mutate.MediaType(mutate.ConfigMediaType(empty.Image, "application/vnd.example.thing.config.v1+json"), types.OCIManifestSchema1)
	art, err = mutate.AppendLayers(art, mkLayer(t, good))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Import(ctx, s, push(t, host, "bad/artifact:v1", art), Options{})
	wantCat(t, err, errdefs.Invalid)

	// Unknown image.
	_, err = Import(ctx, s, host+"/no/such:v1", Options{})
	wantCat(t, err, errdefs.NotFound)

	// Malicious layers.
	for _, tc := range []struct {
		name string
		tar  []byte
		cat  errdefs.Category
	}{
		{"dotdot", layerTar(t, file("../../etc/evil", "x")), errdefs.Invalid},
		{"hardlink-escape", layerTar(t, file("a", "x"), hardlink("b", "../../../etc/shadow")), errdefs.Invalid},
		{"hardlink-nowhere", layerTar(t, hardlink("b", "etc/shadow")), errdefs.Invalid},
		{"under-symlink", layerTar(t, symlink("d", "/etc"), file("d/passwd", "x")), errdefs.Invalid},
		{"whiteout-named-dir", layerTar(t, file(".wh.d/passwd", "x")), errdefs.Invalid},
	} {
		img, err := mutate.AppendLayers(empty.Image, mkLayer(t, good), mkLayer(t, tc.tar))
		if err != nil {
			t.Fatal(err)
		}
		_, err = Import(ctx, s, push(t, host, "bad/"+tc.name+":v1", img), Options{})
		if err == nil || errdefs.CategoryOf(err) != tc.cat {
			t.Fatalf("%s: want %v, got %v (%v)", tc.name, tc.cat, errdefs.CategoryOf(err), err)
		}
		if _, gerr := s.Get("bad/" + tc.name + ":v1"); errdefs.CategoryOf(gerr) != errdefs.NotFound {
			t.Fatalf("%s: a record was written: %v", tc.name, gerr)
		}
	}
	noPartial(t, s, before)
}

func TestImportDigestMismatch(t *testing.T) { builders(t, testImportDigestMismatch) }

func testImportDigestMismatch(t *testing.T, mk *erofs.Mkfs) {
	s := newStore(t, mk)
	ctx := context.Background()
	before, _ := s.Blobs()
	img := testImage(t)
	dir := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ls, _ := img.Layers()
	d, _ := ls[1].Digest()
	blob := filepath.Join(dir, "blobs", "sha256", d.Hex)
	data, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	// Flip a byte inside the gzip stream (past its header).
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(blob, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Import(ctx, s, "oci:"+dir, Options{Name: "corrupt"})
	wantCat(t, err, errdefs.Invalid)
	noPartial(t, s, before)

	// A layer whose content does not match the config's diffID.
	l0 := layerTar(t, file("a", "a"))
	other := layerTar(t, file("a", "b"))
	img2, err := mutate.AppendLayers(empty.Image, mkLayer(t, l0))
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img2.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0], _, _ = v1.SHA256(bytes.NewReader(other))
	img2, err = mutate.ConfigFile(img2, cf)
	if err != nil {
		t.Fatal(err)
	}
	dir2 := filepath.Join(t.TempDir(), "layout")
	lp2, err := layout.Write(dir2, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp2.AppendImage(img2); err != nil {
		t.Fatal(err)
	}
	_, err = Import(ctx, s, "oci:"+dir2, Options{Name: "wrongdiff"})
	wantCat(t, err, errdefs.Invalid)
	if !strings.Contains(err.Error(), "diffID") {
		t.Fatalf("error %v", err)
	}
	noPartial(t, s, before)
}

func TestParseRefAndNames(t *testing.T) {
	for in, want := range map[string]string{
		"python:3.12":                             "python:3.12",
		"docker://docker.io/library/busybox":      "busybox:latest",
		"ghcr.io/org/app:v1":                      "ghcr.io/org/app:v1",
		"127.0.0.1:5000/a/b:c":                    "127.0.0.1:5000/a/b:c",
		"oci:/x/y/layout:v3":                      "layout:v3",
		"oci:/x/y/Layout":                         "layout",
		"docker-archive:/tmp/img.tar":             "img",
		"docker-archive:/tmp/img.tar:repo/app:v9": "app:v9",
	} {
		r, err := ParseRef(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := DefaultName(r); got != want {
			t.Errorf("DefaultName(%s) = %q, want %q (%+v)", in, got, want, r)
		}
	}
	if _, err := ParseRef("UPPER case"); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("bad ref: %v", err)
	}
}

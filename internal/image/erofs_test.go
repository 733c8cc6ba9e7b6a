package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/errdefs"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts)")
	}
}

// newEROFSStore opens an EROFS store in a temp dir; its mounts go before
// the directory is removed.
func newEROFSStore(t *testing.T, tweak ...func(*Options)) *Store {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	o := Options{Root: filepath.Join(dir, "images"), MountDir: filepath.Join(dir, "mnt"), MountGrace: -1, GCGrace: -1, NodeID: "n1"}
	for _, f := range tweak {
		f(&o)
	}
	s, err := OpenStore(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		s.Mounts().UnmountAll()
	})
	return s
}

func layerTarball(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for n, body := range files {
		h := &tar.Header{Name: n, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(n, "/") {
			h = &tar.Header{Name: n, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	return buf.Bytes()
}

func noLeftovers(t *testing.T, s *Store) {
	t.Helper()
	filepath.WalkDir(s.Root(), func(p string, d fs.DirEntry, err error) error {
		if err == nil && (strings.HasPrefix(d.Name(), ".tmp-") || strings.HasPrefix(d.Name(), ".erofs-spool")) {
			t.Errorf("temp file left: %s", p)
		}
		return nil
	})
}

func TestEROFSImportDirAndMount(t *testing.T) {
	s := newEROFSStore(t)
	bb := busybox(t)
	img, err := s.ImportDir(ctx, "busybox", bb)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.LayerMeta(img.Layers[0])
	if err != nil || m.Format != FormatEROFS || m.BlobSize == 0 || m.Files < 100 || m.Size != img.SizeBytes || len(img.DiffIDs) != 1 || m.DiffID != img.DiffIDs[0] {
		t.Fatalf("meta %+v %v img %+v", m, err, img)
	}
	// The diffID is the digest of the tree's canonical tar: the legacy
	// layer digest of the same tree.
	if d, _ := treeDigest(ctx, bb); d != m.DiffID {
		t.Fatalf("diffID %s, tree digest %s", m.DiffID, d)
	}
	bp, _ := s.BlobPath(img.Layers[0])
	if fi, err := os.Stat(bp); err != nil || fi.Mode().Perm() != 0o444 || fi.Size() != m.BlobSize {
		t.Fatalf("blob %v %v", fi, err)
	}
	// Same tree, same blob, same image ID (and a tarball of it too).
	img2, err := s.ImportDir(ctx, "bb2", bb)
	if err != nil || img2.ID != img.ID {
		t.Fatalf("re-import %+v %v", img2, err)
	}
	img3, err := s.ImportTar(ctx, "bb3", bytes.NewReader(tarOf(t, bb, true)))
	if err != nil || img3.ID != img.ID {
		t.Fatalf("tar import %+v %v", img3, err)
	}
	dirs, release, err := s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 1 || dirs[0] != filepath.Join(s.Mounts().Dir(), img.Layers[0][7:]) {
		t.Fatalf("dirs %v", dirs)
	}
	if l, err := os.Readlink(filepath.Join(dirs[0], "bin/sh")); err != nil || l != "/bin/busybox" {
		t.Fatalf("bin/sh: %q %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(dirs[0], "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("tmp: %v %v", fi, err)
	}
	if err := os.WriteFile(filepath.Join(dirs[0], "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("layer is writable: %v", err)
	}
	dirs2, release2, err := s.LayerDirs(ctx, img2)
	if err != nil || dirs2[0] != dirs[0] || s.Mounts().Refs(img.Layers[0][7:]) != 2 {
		t.Fatalf("second use: %v %v refs %d", dirs2, err, s.Mounts().Refs(img.Layers[0][7:]))
	}
	release()
	release2()
	if l := s.Mounts().List(); len(l) != 0 {
		t.Fatalf("mounts after release: %+v", l)
	}
	if err := s.Verify(ctx, img.Layers[0]); err != nil {
		t.Fatal(err)
	}
	noLeftovers(t, s)
}

func TestEROFSNamedLayersResolve(t *testing.T) {
	s := newEROFSStore(t)
	base, err := s.ImportTar(ctx, "base", bytes.NewReader(layerTarball(t, map[string]string{"etc/": "", "etc/os": "base", "etc/gone": "x", "app/": "", "app/a": "1"})))
	if err != nil {
		t.Fatal(err)
	}
	ws, err := s.BuildLayerTar(ctx, "ws-1", bytes.NewReader(layerTarball(t, map[string]string{"etc/": "", "etc/.wh.gone": "", "work/": "", "work/code.py": "print(1)"})))
	if err != nil {
		t.Fatal(err)
	}
	tk, err := s.BuildLayerTar(ctx, "toolkit", bytes.NewReader(layerTarball(t, map[string]string{"app/": "", "app/.wh..wh..opq": "", "app/tool": "t", "work/": "", "work/code.py": "print(2)"})))
	if err != nil {
		t.Fatal(err)
	}
	if ws.Name != "ws-1" || ws.Digest == "" || ws.Files == 0 {
		t.Fatalf("layer %+v", ws)
	}
	ls, err := s.ListLayers()
	if err != nil || len(ls) != 2 || ls[0].Name != "toolkit" {
		t.Fatalf("list %+v %v", ls, err)
	}
	if imgs, _ := s.List(); len(imgs) != 1 {
		t.Fatalf("layers leaked into images: %+v", imgs)
	}
	rec, digests, err := s.Resolve("base", []string{"ws-1", "toolkit"})
	if err != nil || rec.Name != "base" || len(digests) != 3 || digests[0] != base.Layers[0] || digests[1] != ws.Digest || digests[2] != tk.Digest {
		t.Fatalf("resolve %v %v", digests, err)
	}
	if _, d2, err := s.Resolve("base", []string{ws.Digest}); err != nil || d2[1] != ws.Digest {
		t.Fatalf("resolve by digest %v %v", d2, err)
	}
	_, _, err = s.Resolve("base", []string{"nope"})
	wantCat(t, err, errdefs.NotFound)
	_, _, err = s.Resolve("nope", nil)
	wantCat(t, err, errdefs.NotFound)

	dirs, release, err := s.LayerDirs(ctx, Image{Name: "sb", Layers: digests})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	mp := t.TempDir()
	if err := unix.Mount("overlay", mp, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(dirs, ":")); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mp, 0)
	for p, want := range map[string]string{"etc/os": "base", "etc/gone": "", "app/a": "", "app/tool": "t", "work/code.py": "print(2)"} {
		b, err := os.ReadFile(filepath.Join(mp, p))
		if want == "" {
			if err == nil {
				t.Errorf("%s visible: %q", p, b)
			}
			continue
		}
		if string(b) != want {
			t.Errorf("%s = %q (%v), want %q", p, b, err, want)
		}
	}
	users, layers, err := s.LayerUsers(ws.Digest)
	if err != nil || len(users) != 0 || len(layers) != 1 {
		t.Fatalf("users %v %v %v", users, layers, err)
	}
	// Removing a held layer keeps its blob until released.
	if err := s.RemoveLayer("ws-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LayerMeta(ws.Digest); err != nil {
		t.Fatalf("held blob collected: %v", err)
	}
	wantCat(t, s.RemoveLayer("ws-1"), errdefs.NotFound)
	_, err = s.BuildLayerTar(ctx, "Bad Name", bytes.NewReader(nil))
	wantCat(t, err, errdefs.Invalid)
}

func TestEROFSGC(t *testing.T) {
	s := newEROFSStore(t)
	a, err := s.ImportTar(ctx, "a", bytes.NewReader(layerTarball(t, map[string]string{"a": "a"})))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.ImportTar(ctx, "b", bytes.NewReader(layerTarball(t, map[string]string{"b": "b"})))
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.ImportTar(ctx, "c", bytes.NewReader(layerTarball(t, map[string]string{"c": "c"})))
	if err != nil {
		t.Fatal(err)
	}
	_, release, err := s.LayerDirs(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	// Another node's lease holds c.
	os.WriteFile(filepath.Join(s.Root(), "leases", "n2.json"), []byte(`{"node":"n2","updated":"`+time.Now().UTC().Format(time.RFC3339)+`","digests":["`+c.Layers[0]+`"]}`), 0o644)
	for _, n := range []string{"a", "b", "c"} {
		if err := s.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(d string) bool { _, err := s.LayerMeta(d); return err == nil }
	if !exists(a.Layers[0]) || exists(b.Layers[0]) || !exists(c.Layers[0]) {
		t.Fatalf("after remove: a %v b %v c %v", exists(a.Layers[0]), exists(b.Layers[0]), exists(c.Layers[0]))
	}
	if bp, _ := s.BlobPath(b.Layers[0]); fileExists(bp) {
		t.Fatal("blob file of b left")
	}
	if _, ok := s.LayerByDiffID(b.DiffIDs[0]); ok {
		t.Fatal("diffID index of b left")
	}
	// Our lease lists a while held.
	data, _ := os.ReadFile(filepath.Join(s.Root(), "leases", "n1.json"))
	if !strings.Contains(string(data), a.Layers[0]) {
		t.Fatalf("lease %s", data)
	}
	release()
	if exists(a.Layers[0]) {
		t.Fatal("released orphan not collected")
	}
	// The daemon's keep set.
	os.Remove(filepath.Join(s.Root(), "leases", "n2.json"))
	if err := s.GC(c.Layers[0]); err != nil || !exists(c.Layers[0]) {
		t.Fatalf("kept digest collected: %v", err)
	}
	if err := s.GC([]string{}...); err != nil || exists(c.Layers[0]) {
		t.Fatalf("unkept digest not collected: %v", err)
	}
	noLeftovers(t, s)

	// The GC grace protects fresh blobs (imports of other nodes).
	s2 := newEROFSStore(t, func(o *Options) { o.GCGrace = time.Hour })
	d, err := s2.ImportTar(ctx, "d", bytes.NewReader(layerTarball(t, map[string]string{"d": "d"})))
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Remove("d"); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.LayerMeta(d.Layers[0]); err != nil {
		t.Fatal("fresh blob collected despite the grace period")
	}
}

// TestLeaseWrites: the lease is written when the node starts using a
// blob it does not list, not again when a sandbox of the same image
// follows one that was deleted, and dropped by the next rewrite (GC).
func TestLeaseWrites(t *testing.T) {
	s := newEROFSStore(t)
	img, err := s.ImportTar(ctx, "x", bytes.NewReader(layerTarball(t, map[string]string{"x": "x"})))
	if err != nil {
		t.Fatal(err)
	}
	d := img.Layers[0]
	path := filepath.Join(s.Root(), "leases", "n1.json")
	lease := func() (string, uint64) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return string(data), st.Ino
	}
	_, release, err := s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	data, ino := lease()
	if !strings.Contains(data, d) {
		t.Fatalf("lease while held: %s", data)
	}
	release()
	_, release, err = s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if data2, ino2 := lease(); ino2 != ino || data2 != data {
		t.Errorf("lease rewritten on re-use of a leased blob: inode %d -> %d", ino, ino2)
	}
	if err := s.GC(); err != nil {
		t.Fatal(err)
	}
	if data, _ := lease(); strings.Contains(data, d) {
		t.Errorf("lease after release and GC still lists %s: %s", d, data)
	}
	// Used again: listed again.
	_, release, err = s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if data, _ := lease(); !strings.Contains(data, d) {
		t.Errorf("lease after re-use: %s", data)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func TestEROFSCorruptBlobAndFailedImport(t *testing.T) {
	s := newEROFSStore(t, func(o *Options) { o.VerifyOnMount = true })
	img, err := s.ImportTar(ctx, "a", bytes.NewReader(layerTarball(t, map[string]string{"f": strings.Repeat("x", 10000)})))
	if err != nil {
		t.Fatal(err)
	}
	bp, _ := s.BlobPath(img.Layers[0])
	data, _ := os.ReadFile(bp)
	data[len(data)-100] ^= 1
	os.Chmod(bp, 0o644)
	os.WriteFile(bp, data, 0o444)
	err = s.Verify(ctx, img.Layers[0])
	wantCat(t, err, errdefs.Internal)
	if !strings.Contains(err.Error(), "corrupt") {
		t.Fatal(err)
	}
	_, _, err = s.LayerDirs(ctx, img)
	wantCat(t, err, errdefs.Internal)
	if l := s.Mounts().List(); len(l) != 0 {
		t.Fatalf("mount left: %+v", l)
	}
	// Truncated blob.
	os.Chmod(bp, 0o644)
	os.Truncate(bp, 4096)
	wantCat(t, s.Verify(ctx, img.Layers[0]), errdefs.Internal)

	before, _ := s.Blobs()
	for _, bad := range [][]byte{
		layerTarball(t, map[string]string{"../escape": "x"}),
		[]byte("garbage garbage garbage"),
		{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0},
	} {
		_, err := s.ImportTar(ctx, "bad", bytes.NewReader(bad))
		wantCat(t, err, errdefs.Invalid)
	}
	after, _ := s.Blobs()
	if len(after) != len(before) {
		t.Fatalf("blobs %v -> %v", before, after)
	}
	if _, err := s.Get("bad"); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatal("record of a failed import")
	}
	noLeftovers(t, s)
}

func TestEROFSResidency(t *testing.T) {
	s := newEROFSStore(t)
	files := map[string]string{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		files[n] = strings.Repeat(n, 1<<20)
	}
	img, err := s.ImportTar(ctx, "big", bytes.NewReader(layerTarball(t, files)))
	if err != nil {
		t.Fatal(err)
	}
	bp, _ := s.BlobPath(img.Layers[0])
	f, _ := os.Open(bp)
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	f.Close()
	r, err := s.Residency(ctx, img.Layers[0])
	res, size := r.Resident, r.Size
	if err != nil || size < 8<<20 || res > size/4 {
		t.Fatalf("after dropping: %+v %v", r, err)
	}
	dirs, release, err := s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if b, err := os.ReadFile(filepath.Join(dirs[0], "c")); err != nil || len(b) != 1<<20 {
		t.Fatal(err)
	}
	r2, _ := s.Residency(ctx, img.Layers[0])
	res2 := r2.Resident
	if res2 < res+(1<<20) || res2 > size/2 || !r2.Mounted || r2.Files < 1<<20 {
		t.Fatalf("after reading 1 MiB of %d: %+v (was %d)", size, r2, res)
	}
	st, err := s.Stats(ctx, img.Layers)
	if err != nil || len(st) != 1 || !st[0].Mounted || st[0].Refs != 1 || st[0].Resident != res2 && st[0].Resident < res2 {
		t.Fatalf("stats %+v %v", st, err)
	}
	t.Logf("resident %d of %d after reading one 1 MiB file", res2, size)
}

func TestEROFSServesLegacyLayersAndRestart(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "images")
	legacy, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	old, err := legacy.ImportTar(ctx, "old", bytes.NewReader(layerTarball(t, map[string]string{"old": "1"})))
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Root: root, MountDir: filepath.Join(dir, "mnt"), MountGrace: time.Hour, GCGrace: -1, NodeID: "n1"}
	s, err := OpenStore(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Mounts().UnmountAll() })
	img, err := s.Get("old")
	if err != nil {
		t.Fatal(err)
	}
	dirs, relOld, err := s.LayerDirs(ctx, img)
	if err != nil || !strings.HasSuffix(dirs[0], "/fs") {
		t.Fatalf("legacy layer %v %v", dirs, err)
	}
	if m, _ := s.LayerMeta(old.Layers[0]); m.Format != FormatDir {
		t.Fatalf("format %q", m.Format)
	}
	relOld()
	nu, err := s.ImportTar(ctx, "new", bytes.NewReader(layerTarball(t, map[string]string{"new": "1"})))
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.ImportTar(ctx, "other", bytes.NewReader(layerTarball(t, map[string]string{"other": "1"})))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LayerDirs(ctx, nu); err != nil { // held by a "sandbox" across the restart
		t.Fatal(err)
	}
	if _, _, err := s.LayerDirs(ctx, other); err != nil { // its sandbox dies while the daemon is down
		t.Fatal(err)
	}
	// Restart: the daemon dies without releasing.
	s2, err := OpenStore(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Mounts().UnmountAll() })
	if l := s2.Mounts().List(); len(l) != 2 {
		t.Fatalf("adopted %+v", l)
	}
	d2, rel2, err := s2.LayerDirs(ctx, nu) // the adopted sandbox takes its layer again
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.GC(); err != nil {
		t.Fatal(err)
	}
	l := s2.Mounts().List()
	if len(l) != 1 || l[0].Key != nu.Layers[0][7:] || l[0].Refs != 1 {
		t.Fatalf("after GC: %+v", l)
	}
	if b, err := os.ReadFile(filepath.Join(d2[0], "new")); err != nil || string(b) != "1" {
		t.Fatal(err)
	}
	rel2()
	// Legacy layers are collected like blobs once unused.
	if err := s2.Remove("old"); err != nil {
		t.Fatal(err)
	}
	if fileExists(filepath.Join(root, "layers", "sha256-"+old.Layers[0][7:])) {
		t.Fatal("legacy layer not collected")
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if l := s2.Mounts().List(); len(l) != 0 {
		t.Fatalf("mounts after close: %+v", l)
	}
	var _ = context.Background
}

func TestEROFSConcurrentImports(t *testing.T) {
	s := newEROFSStore(t)
	data := layerTarball(t, map[string]string{"same": strings.Repeat("s", 100000)})
	errs := make(chan error, 16)
	ids := make(chan string, 8)
	for i := 0; i < 8; i++ {
		go func() {
			img, err := s.ImportTar(ctx, "img-"+string(rune('a'+i)), bytes.NewReader(data))
			if err == nil {
				ids <- img.ID
			}
			errs <- err
		}()
		go func() { errs <- s.GC() }()
	}
	for i := 0; i < 16; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	first := <-ids
	for i := 1; i < 8; i++ {
		if id := <-ids; id != first {
			t.Fatalf("ids differ: %s %s", id, first)
		}
	}
	blobs, _ := s.Blobs()
	imgs, _ := s.List()
	if len(blobs) != 1 || len(imgs) != 8 {
		t.Fatalf("blobs %v images %d", blobs, len(imgs))
	}
	if err := s.Verify(ctx, blobs[0]); err != nil {
		t.Fatal(err)
	}
	noLeftovers(t, s)
}

// With mkfs.erofs the store keeps hardlinks as hardlinks and records the
// builder; with go-erofs they are copies.
func TestEROFSBuilders(t *testing.T) {
	requireRoot(t)
	src := t.TempDir()
	for _, d := range []string{"a", "b", "c"} {
		if err := os.Mkdir(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "a/x"), []byte("shared"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"b/y", "c/z"} {
		if err := os.Link(filepath.Join(src, "a/x"), filepath.Join(src, l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "c/alone"), []byte("alone"), 0o644); err != nil {
		t.Fatal(err)
	}
	mk, why, err := erofs.SelectMkfs(os.Getenv(erofs.MkfsEnv))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mk   *erofs.Mkfs
	}{{"go-erofs", nil}, {"mkfs.erofs", mk}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "mkfs.erofs" && mk == nil {
				t.Skipf("mkfs.erofs converter not tested: %v", why)
			}
			work := t.TempDir()
			s := newEROFSStore(t, func(o *Options) { o.Mkfs, o.WorkDir = tc.mk, work })
			img, err := s.ImportDir(ctx, "links", src)
			if err != nil {
				t.Fatal(err)
			}
			m, err := s.LayerMeta(img.Layers[0])
			if err != nil {
				t.Fatal(err)
			}
			want := erofs.BuilderVersion
			if tc.mk != nil {
				want = tc.mk.BuilderVersion()
			}
			if m.Builder != want {
				t.Fatalf("builder %q, want %q", m.Builder, want)
			}
			dirs, release, err := s.LayerDirs(ctx, img)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			var st [3]unix.Stat_t
			for i, p := range []string{"a/x", "b/y", "c/z"} {
				if err := unix.Stat(filepath.Join(dirs[0], p), &st[i]); err != nil {
					t.Fatal(err)
				}
				if b, _ := os.ReadFile(filepath.Join(dirs[0], p)); string(b) != "shared" || st[i].Mode&0o777 != 0o640 {
					t.Fatalf("%s: %q mode %o", p, b, st[i].Mode)
				}
			}
			for i := 1; i < 3; i++ {
				same := st[i].Ino == st[0].Ino
				if tc.mk != nil && (!same || st[i].Nlink != 3) || tc.mk == nil && (same || st[i].Nlink != 1) {
					t.Errorf("link %d: ino %d nlink %d (first: ino %d nlink %d)", i, st[i].Ino, st[i].Nlink, st[0].Ino, st[0].Nlink)
				}
			}
			var alone unix.Stat_t
			if err := unix.Stat(filepath.Join(dirs[0], "c/alone"), &alone); err != nil || alone.Nlink != 1 {
				t.Fatalf("c/alone: nlink %d %v", alone.Nlink, err)
			}
			noLeftovers(t, s)
			if ents, _ := os.ReadDir(work); len(ents) != 0 {
				t.Fatalf("left in the work dir: %v", ents)
			}
		})
	}
}

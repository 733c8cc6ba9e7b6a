package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx"
)

var ctx = context.Background()

func newStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	bbOnce sync.Once
	bbDir  string
	bbErr  error
)

// busybox builds one busybox root per test process.
func busybox(t *testing.T) string {
	t.Helper()
	bbOnce.Do(func() {
		var dir string
		dir, bbErr = os.MkdirTemp("", "warren-image-test-")
		if bbErr == nil {
			bbDir = filepath.Join(dir, "rootfs")
			bbErr = BuildBusybox(ctx, bbDir)
		}
	})
	if bbErr != nil {
		if errdefs.CategoryOf(bbErr) == errdefs.Unavailable {
			t.Skip(bbErr)
		}
		t.Fatal(bbErr)
	}
	return bbDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bbDir != "" {
		os.RemoveAll(filepath.Dir(bbDir))
	}
	os.Exit(code)
}

func wantCat(t *testing.T, err error, cat errdefs.Category) {
	t.Helper()
	if got := errdefs.CategoryOf(err); err == nil || got != cat {
		t.Fatalf("want a %v error, got %v (%v)", cat, got, err)
	}
}

func TestBuildBusybox(t *testing.T) {
	dir := busybox(t)
	for p, want := range map[string]string{"bin/sh": "/bin/busybox", "bin/ls": "/bin/busybox"} {
		if got, err := os.Readlink(filepath.Join(dir, p)); err != nil || got != want {
			t.Errorf("%s -> %q (%v), want %q", p, got, err, want)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	if !strings.HasPrefix(string(passwd), "root:x:0:0:") || !strings.Contains(string(passwd), "nobody:x:65534:65534:") {
		t.Errorf("passwd: %q", passwd)
	}
	fi, err := os.Stat(filepath.Join(dir, "tmp"))
	if err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp: %v %v", fi.Mode(), err)
	}
	for _, d := range []string{"dev", "proc", "sys", "root", "etc/hostname", "etc/group", "usr/bin"} {
		if _, err := os.Stat(filepath.Join(dir, d)); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	if os.Geteuid() == 0 {
		out, err := exec.Command("chroot", dir, "/bin/sh", "-c", "echo hello from $(basename $(readlink /bin/ls))").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "hello from busybox" {
			t.Errorf("chroot sh: %v %q", err, out)
		}
	}
	// A non-empty destination is refused.
	wantCat(t, BuildBusybox(ctx, dir), errdefs.Conflict)
	// A missing busybox says what to install.
	old := BusyboxPath
	BusyboxPath = "/nonexistent/busybox"
	defer func() { BusyboxPath = old }()
	err = BuildBusybox(ctx, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "apt-get install busybox-static") {
		t.Fatalf("want an install hint, got %v", err)
	}
}

func layerCount(t *testing.T, s *Store) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.Root(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func tmpEmpty(t *testing.T, s *Store) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(s.Root(), "tmp"))
	if len(ents) != 0 {
		t.Fatalf("tmp not empty: %v", ents)
	}
	recs, _ := os.ReadDir(filepath.Join(s.Root(), "images"))
	for _, r := range recs {
		if strings.HasPrefix(r.Name(), ".") {
			t.Fatalf("leftover temp record %s", r.Name())
		}
	}
}

func TestImportDirGetListLayerDirs(t *testing.T) {
	s := newStore(t)
	bb := busybox(t)
	img, err := s.ImportDir(ctx, "busybox", bb)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "busybox" || len(img.Layers) != 1 || !strings.HasPrefix(img.Layers[0], "sha256:") ||
		!strings.HasPrefix(img.ID, "sha256:") || img.SizeBytes < 500_000 || img.CreatedAt.IsZero() {
		t.Fatalf("image %+v", img)
	}
	got, err := s.Get("busybox")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != img.ID || got.Layers[0] != img.Layers[0] || !got.CreatedAt.Equal(img.CreatedAt) {
		t.Fatalf("Get = %+v, want %+v", got, img)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Name != "busybox" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	meta, err := s.LayerMeta(img.Layers[0])
	if err != nil || meta.Digest != img.Layers[0] || meta.Builder != BuilderVersion || meta.Files < 100 || meta.Size != img.SizeBytes {
		t.Fatalf("meta %+v %v", meta, err)
	}
	dirs, release, err := s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if len(dirs) != 1 || !strings.HasSuffix(dirs[0], "/layers/sha256-"+img.Layers[0][7:]+"/fs") {
		t.Fatalf("dirs %v", dirs)
	}
	if l, err := os.Readlink(filepath.Join(dirs[0], "bin/sh")); err != nil || l != "/bin/busybox" {
		t.Fatalf("bin/sh in layer: %q %v", l, err)
	}
	fi, err := os.Stat(filepath.Join(dirs[0], "tmp"))
	if err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("tmp mode lost: %v", fi.Mode())
	}
	// The layer digest is the digest of the canonical tar of the tree.
	d, err := treeDigest(ctx, bb)
	if err != nil || d != img.Layers[0] {
		t.Fatalf("digest of source %s != layer %s (%v)", d, img.Layers[0], err)
	}
	tmpEmpty(t, s)

	_, err = s.Get("nope")
	wantCat(t, err, errdefs.NotFound)
	if !strings.Contains(err.Error(), "nope") {
		t.Fatalf("NotFound error does not name the image: %v", err)
	}
	_, err = s.ImportDir(ctx, "x", "/nonexistent/dir")
	wantCat(t, err, errdefs.NotFound)
}

func tarOf(t *testing.T, dir string, gz bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tarx.Create(ctx, dir, &buf, "/"); err != nil {
		t.Fatal(err)
	}
	if !gz {
		return buf.Bytes()
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(buf.Bytes())
	zw.Close()
	return z.Bytes()
}

func TestImportTarAndDedup(t *testing.T) {
	s := newStore(t)
	bb := busybox(t)
	a, err := s.ImportDir(ctx, "a", bb)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.ImportTar(ctx, "b", bytes.NewReader(tarOf(t, bb, false)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.ImportTar(ctx, "registry.local/team/c:v1.2", bytes.NewReader(tarOf(t, bb, true)))
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.ImportDir(ctx, "d", bb)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []Image{b, c, d} {
		if img.Layers[0] != a.Layers[0] || img.ID != a.ID {
			t.Fatalf("identical content not deduplicated: %s vs %s", img.Layers[0], a.Layers[0])
		}
	}
	if n := layerCount(t, s); n != 1 {
		t.Fatalf("%d layers, want 1", n)
	}
	tmpEmpty(t, s)
	// Names with slashes are stored flat.
	if _, err := os.Stat(filepath.Join(s.Root(), "images", "registry.local%2Fteam%2Fc:v1.2.json")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get("registry.local/team/c:v1.2"); err != nil || got.ID != a.ID {
		t.Fatalf("Get c: %+v %v", got, err)
	}

	// Different content, different layer.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "hello"), []byte("world"), 0o644)
	e, err := s.ImportDir(ctx, "e", other)
	if err != nil {
		t.Fatal(err)
	}
	if e.Layers[0] == a.Layers[0] || layerCount(t, s) != 2 {
		t.Fatalf("different content shares a layer")
	}
}

func TestRemoveAndGC(t *testing.T) {
	s := newStore(t)
	dir1, dir2 := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(dir1, "f"), []byte("one"), 0o644)
	os.WriteFile(filepath.Join(dir2, "f"), []byte("two"), 0o644)
	one, _ := s.ImportDir(ctx, "one", dir1)
	if _, err := s.ImportDir(ctx, "one-again", dir1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ImportDir(ctx, "two", dir2); err != nil {
		t.Fatal(err)
	}
	if n := layerCount(t, s); n != 2 {
		t.Fatalf("%d layers", n)
	}
	if err := s.Remove("one"); err != nil {
		t.Fatal(err)
	}
	if n := layerCount(t, s); n != 2 {
		t.Fatalf("layer still referenced by one-again was collected")
	}
	// Held layers survive removal until released.
	dirs, release, err := s.LayerDirs(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("one-again"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dirs[0], "f")); err != nil {
		t.Fatalf("held layer collected: %v", err)
	}
	release()
	release() // idempotent
	if _, err := os.Stat(dirs[0]); !os.IsNotExist(err) {
		t.Fatalf("released orphan layer not collected: %v", err)
	}
	if n := layerCount(t, s); n != 1 {
		t.Fatalf("%d layers, want 1", n)
	}
	_, _, err = s.LayerDirs(ctx, one)
	wantCat(t, err, errdefs.NotFound)
	wantCat(t, s.Remove("one"), errdefs.NotFound)

	// Replacing an image collects its old layer.
	two, _ := s.Get("two")
	if _, err := s.ImportDir(ctx, "two", dir1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Layer(two.Layers[0]); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("replaced image's layer kept: %v", err)
	}
	if err := s.Remove("two"); err != nil {
		t.Fatal(err)
	}
	if n := layerCount(t, s); n != 0 {
		t.Fatalf("%d layers left", n)
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Fatalf("images left: %v", list)
	}
	tmpEmpty(t, s)
}

func TestFailedImportLeavesNothing(t *testing.T) {
	s := newStore(t)
	bb := busybox(t)
	data := tarOf(t, bb, false)
	for name, bad := range map[string][]byte{
		"truncated": data[:len(data)/2],
		"garbage":   []byte(strings.Repeat("garbage!", 1000)),
		"empty":     nil,
	} {
		_, err := s.ImportTar(ctx, "bad", bytes.NewReader(bad))
		if errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Fatalf("%s: want Invalid, got %v", name, err)
		}
	}
	// A device entry is dropped, not fatal; an unsafe hardlink is fatal.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o600})
	tw.WriteHeader(&tar.Header{Name: "pw", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"})
	tw.Close()
	_, err := s.ImportTar(ctx, "bad", bytes.NewReader(buf.Bytes()))
	wantCat(t, err, errdefs.Invalid)
	// A cancelled import.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.ImportDir(cctx, "bad", bb); err == nil {
		t.Fatal("cancelled import succeeded")
	}
	if _, err := s.Get("bad"); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("record left: %v", err)
	}
	if n := layerCount(t, s); n != 0 {
		t.Fatalf("%d layers left", n)
	}
	tmpEmpty(t, s)

	// Replacing a good image with a bad import keeps the good one.
	good, err := s.ImportDir(ctx, "good", bb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ImportTar(ctx, "good", bytes.NewReader(data[:1000])); err == nil {
		t.Fatal("bad import succeeded")
	}
	if got, err := s.Get("good"); err != nil || got.ID != good.ID {
		t.Fatalf("good image damaged: %+v %v", got, err)
	}
	tmpEmpty(t, s)
}

func TestBadNames(t *testing.T) {
	s := newStore(t)
	dir := t.TempDir()
	for _, name := range []string{"", "Busybox", "-x", ".x", "_x", "/x", "a b", "a\nb", "ä", strings.Repeat("a", 129), "x@sha256"} {
		_, err := s.ImportDir(ctx, name, dir)
		wantCat(t, err, errdefs.Invalid)
		_, err = s.Get(name)
		wantCat(t, err, errdefs.Invalid)
		wantCat(t, s.Remove(name), errdefs.Invalid)
	}
	for _, name := range []string{"a", "0", "ubuntu:22.04", "a/../../b", strings.Repeat("a", 128), "my-img_v1.0"} {
		if _, err := s.ImportDir(ctx, name, dir); err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		if _, err := s.Get(name); err != nil {
			t.Fatalf("%q: %v", name, err)
		}
	}
	// "a/../../b" did not escape the images directory.
	ents, _ := os.ReadDir(s.Root())
	if len(ents) != 3 {
		t.Fatalf("store root has %v", ents)
	}
}

func TestOpenRemovesLeftovers(t *testing.T) {
	root := filepath.Join(t.TempDir(), "images")
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "tmp", "import-123", "fs", "bin"), 0o755)
	os.WriteFile(filepath.Join(root, "images", ".tmp-999"), []byte("{"), 0o644)
	if _, err := Open(root); err != nil {
		t.Fatal(err)
	}
	tmpEmpty(t, s)
}

func TestConcurrentImports(t *testing.T) {
	s := newStore(t)
	srcs := make([][]byte, 3)
	for i := range srcs {
		d := t.TempDir()
		for j := 0; j < 50; j++ {
			os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", j)), []byte(fmt.Sprintf("content %d %d", i, j)), 0o644)
		}
		srcs[i] = tarOf(t, d, i%2 == 1)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name := fmt.Sprintf("img%d", i%6) // two imports per name race
			img, err := s.ImportTar(ctx, name, bytes.NewReader(srcs[i%3]))
			if err != nil {
				errs <- err
				return
			}
			dirs, release, err := s.LayerDirs(ctx, img)
			if err == nil {
				if _, serr := os.Stat(filepath.Join(dirs[0], "f0")); serr != nil {
					err = serr
				}
				release()
			}
			if err != nil && errdefs.CategoryOf(err) != errdefs.NotFound {
				errs <- err
			}
			if i%4 == 0 {
				if err := s.Remove(name); err != nil && errdefs.CategoryOf(err) != errdefs.NotFound {
					errs <- err
				}
			}
			if _, err := s.List(); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every remaining image's layer exists, and no other layer does.
	if err := s.GC(); err != nil {
		t.Fatal(err)
	}
	list, _ := s.List()
	used := map[string]bool{}
	for _, img := range list {
		used[img.Layers[0]] = true
		if _, err := s.Layer(img.Layers[0]); err != nil {
			t.Fatalf("%s: %v", img.Name, err)
		}
	}
	if n := layerCount(t, s); n != len(used) {
		t.Fatalf("%d layers for %d used digests", n, len(used))
	}
	tmpEmpty(t, s)
}

func TestRecordFormat(t *testing.T) {
	s := newStore(t)
	img, err := s.ImportDir(ctx, "fmt", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(s.Root(), "images", "fmt.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "id", "layers", "size_bytes", "created_at"} {
		if _, ok := m[k]; !ok {
			t.Errorf("record lacks %q: %s", k, data)
		}
	}
	if time.Since(img.CreatedAt) > time.Minute {
		t.Errorf("CreatedAt %v", img.CreatedAt)
	}
}

func TestFindMirror(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755)
	write := func(name, content string) {
		os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
	}
	_, err := FindMirror(dir, "bookworm", "main")
	wantCat(t, err, errdefs.Unavailable)

	write("sources.list.d/a.sources", `# comment
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src deb
URIs: cdrom:/media
Suites: bookworm
Components: main

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://mirror.example/debian/
Suites: bookworm
 bookworm-updates
Components: contrib main
`)
	write("sources.list.d/b.list.disabled", "deb http://ignored.example/debian bookworm main\n")
	got, err := FindMirror(dir, "bookworm", "main")
	if err != nil || got != "http://mirror.example/debian" {
		t.Fatalf("deb822: %q %v", got, err)
	}
	write("sources.list", `# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/x.gpg] https://first.example/debian bookworm contrib main # trailing
`)
	got, err = FindMirror(dir, "bookworm", "main")
	if err != nil || got != "https://first.example/debian" {
		t.Fatalf("one-line: %q %v", got, err)
	}
	// The host's own sources serve bookworm (this is a Debian 12 machine).
	if _, err := os.Stat("/etc/apt"); err == nil {
		if m, err := FindMirror("/etc/apt", "bookworm", "main"); err == nil {
			t.Logf("host mirror: %s", m)
		}
	}
}

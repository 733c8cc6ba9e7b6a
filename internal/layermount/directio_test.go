package layermount

import (
	"archive/tar"
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/testutil"
)

// treeBlob writes an EROFS image of files (name -> content) to path.
func treeBlob(t *testing.T, path string, files map[string][]byte) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(files[n])
	}
	tw.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := erofs.Convert(context.Background(), &buf, f, erofs.Options{TempDir: filepath.Dir(path)}); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// superOptions returns the superblock options of the mount at dir.
func superOptions(t *testing.T, dir string) []string {
	t.Helper()
	ms, err := mountinfo.Under(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Point == dir {
			return m.Options
		}
	}
	t.Fatalf("%s is not a mount point", dir)
	return nil
}

// cachedBytes is the page cache of path (cachestat).
func cachedBytes(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
		t.Fatal(err)
	}
	return int64(cs.Cache) * int64(os.Getpagesize())
}

func supportsODirect(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

func TestDirectIOMount(t *testing.T) {
	testutil.RequireRoot(t)
	tmp := t.TempDir()
	big := randomBytes(4<<20, 1)
	files := map[string][]byte{"big": big, "small": []byte("small file\n"), "d/e/nested": randomBytes(10000, 2)}
	src := filepath.Join(tmp, "tree.erofs")
	treeBlob(t, src, files)
	if !supportsODirect(src) {
		t.Skipf("the filesystem of %s does not do O_DIRECT", tmp)
	}
	c := newCache(t, filepath.Join(tmp, "layers"), Options{Grace: -1, ReadAheadKB: 256})
	testutil.DropFromCache(t, src)
	dir, rel, err := c.Acquire(context.Background(), "k", src)
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	if c.noDirectIOOpt {
		t.Skip("this kernel has no EROFS directio option (Linux 6.13)")
	}
	if opts := superOptions(t, dir); !slices.Contains(opts, "directio") {
		t.Fatalf("mounted without directio: %v", opts)
	}
	l := c.List()
	if len(l) != 1 || !l[0].DirectIO {
		t.Fatalf("list: %+v", l)
	}
	// The readahead knob is the mount's own bdi.
	if l[0].ReadAheadKB != 256 {
		t.Fatalf("read_ahead_kb %d, want 256", l[0].ReadAheadKB)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes, %v", name, len(got), err)
		}
	}
	// Reading 4 MiB through the mount left the blob's own page cache
	// (metadata only) nearly empty: the data went round it.
	if n := cachedBytes(t, src); n > 256<<10 {
		t.Fatalf("blob page cache holds %d bytes after reading %d through a directio mount", n, len(big))
	}
	if n := cachedBytes(t, filepath.Join(dir, "big")); n != int64(len(big)) {
		t.Fatalf("big: %d bytes cached", n)
	}

	// Without direct I/O the same reads go through the blob's cache.
	c2 := newCache(t, filepath.Join(tmp, "layers2"), Options{Grace: -1, BufferedIO: true})
	testutil.DropFromCache(t, src)
	dir2, rel2, err := c2.Acquire(context.Background(), "k", src)
	if err != nil {
		t.Fatal(err)
	}
	defer rel2()
	if opts := superOptions(t, dir2); slices.Contains(opts, "directio") || c2.List()[0].DirectIO {
		t.Fatalf("BufferedIO mounted with directio: %v", opts)
	}
	if got, err := os.ReadFile(filepath.Join(dir2, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big via buffered mount: %v", err)
	}
	if n := cachedBytes(t, src); n < int64(len(big)) {
		t.Fatalf("buffered mount: blob page cache %d < %d read", n, len(big))
	}
}

// A blob on a filesystem without O_DIRECT (here: inside another EROFS
// mount) is mounted without directio, and works.
func TestDirectIOFallback(t *testing.T) {
	testutil.RequireRoot(t)
	tmp := t.TempDir()
	inner := filepath.Join(tmp, "inner.erofs")
	treeBlob(t, inner, map[string][]byte{"hello": []byte("from the inner layer\n")})
	innerBytes, err := os.ReadFile(inner)
	if err != nil {
		t.Fatal(err)
	}
	outer := filepath.Join(tmp, "outer.erofs")
	treeBlob(t, outer, map[string][]byte{"inner.erofs": innerBytes})
	c := newCache(t, filepath.Join(tmp, "layers"), Options{Grace: -1})
	ctx := context.Background()
	od, rel, err := c.Acquire(ctx, "outer", outer)
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	nested := filepath.Join(od, "inner.erofs")
	if supportsODirect(nested) {
		t.Skip("this kernel's EROFS does O_DIRECT on file-backed mounts: no filesystem at hand refuses it")
	}
	id, rel2, err := c.Acquire(ctx, "inner", nested)
	if err != nil {
		t.Fatal(err)
	}
	defer rel2()
	if opts := superOptions(t, id); slices.Contains(opts, "directio") {
		t.Fatalf("directio claimed on a blob without O_DIRECT: %v", opts)
	}
	for _, in := range c.List() {
		if in.Key == "inner" && in.DirectIO {
			t.Fatalf("list: %+v", in)
		}
	}
	if b, err := os.ReadFile(filepath.Join(id, "hello")); err != nil || string(b) != "from the inner layer\n" {
		t.Fatalf("read: %q %v", b, err)
	}
}

func TestReadAheadLoop(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no loop devices")
	}
	tmp := t.TempDir()
	src := blob(t, tmp, "ra")
	c := newCache(t, filepath.Join(tmp, "layers"), Options{Grace: -1, ForceLoop: true, ReadAheadKB: 64})
	_, rel, err := c.Acquire(context.Background(), "k", src)
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	l := c.List()
	if len(l) != 1 || l[0].DirectIO || l[0].ReadAheadKB != 64 {
		t.Fatalf("list %+v", l)
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(l[0].Device), "queue", "read_ahead_kb"))
	if err != nil || strings.TrimSpace(string(b)) != "64" {
		t.Fatalf("loop read_ahead_kb %q %v", b, err)
	}
}

func TestMountinfoOptions(t *testing.T) {
	testutil.RequireRoot(t)
	tmp := t.TempDir()
	src := blob(t, tmp, "opts")
	dir := filepath.Join(tmp, "layers")
	c1, err := New(dir, Options{Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c1.Acquire(context.Background(), "k", src); err != nil {
		t.Fatal(err)
	}
	want := c1.List()[0].DirectIO
	// A new process adopts the mount with what mountinfo says.
	c2 := newCache(t, dir, Options{Grace: time.Hour})
	if l := c2.List(); len(l) != 1 || l[0].DirectIO != want {
		t.Fatalf("adopted %+v, want direct_io=%v", l, want)
	}
}

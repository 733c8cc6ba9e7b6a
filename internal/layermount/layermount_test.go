package layermount

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/testutil"
)

// blob writes an EROFS image holding /hello with content body.
func blob(t *testing.T, dir, body string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write([]byte(body))
	tw.Close()
	p := filepath.Join(dir, body+".erofs")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := erofs.Convert(context.Background(), &buf, f, erofs.Options{TempDir: dir}); err != nil {
		t.Fatal(err)
	}
	return p
}

func newCache(t *testing.T, dir string, opts Options) *Cache {
	t.Helper()
	c, err := New(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.UnmountAll() })
	return c
}

func isMount(t *testing.T, p string) bool {
	t.Helper()
	ms, err := mountinfo.Under(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Point == p {
			return true
		}
	}
	return false
}

func read(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSharedRefcountedMount(t *testing.T) {
	testutil.RequireRoot(t)
	tmp := t.TempDir()
	src := blob(t, tmp, "one")
	c := newCache(t, filepath.Join(tmp, "layers"), Options{Grace: 200 * time.Millisecond})
	ctx := context.Background()

	// Concurrent acquires share one mount.
	var wg sync.WaitGroup
	rels := make([]func(), 32)
	dirs := make([]string, 32)
	errs := make([]error, 32)
	for i := range rels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dirs[i], rels[i], errs[i] = c.Acquire(ctx, "k1", src)
		}()
	}
	wg.Wait()
	for i := range rels {
		if errs[i] != nil || dirs[i] != c.MountPoint("k1") {
			t.Fatalf("acquire %d: %q %v", i, dirs[i], errs[i])
		}
	}
	if n, _ := mountinfo.Under(c.Dir()); len(n) != 1 {
		t.Fatalf("want one mount, got %v", n)
	}
	if c.Refs("k1") != 32 || read(t, dirs[0]) != "one" {
		t.Fatalf("refs %d", c.Refs("k1"))
	}
	// Concurrent releases and re-acquires.
	for i := range rels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rels[i]()
			rels[i]() // idempotent
			_, rel, err := c.Acquire(ctx, "k1", src)
			if err != nil {
				t.Error(err)
				return
			}
			rel()
		}()
	}
	wg.Wait()
	if c.Refs("k1") != 0 {
		t.Fatalf("refs %d", c.Refs("k1"))
	}
	// Kept during the grace period, gone after.
	if !isMount(t, c.MountPoint("k1")) {
		t.Fatal("unmounted before the grace period")
	}
	// The unmount and the mount point's removal are two steps: poll for
	// both.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := os.Stat(c.MountPoint("k1"))
		mounted := isMount(t, c.MountPoint("k1"))
		if !mounted && os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the grace period: mounted %v, mount point: %v", mounted, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Taken again inside the grace period: the timer must not unmount it.
	_, rel, err := c.Acquire(ctx, "k1", src)
	if err != nil {
		t.Fatal(err)
	}
	rel()
	time.Sleep(100 * time.Millisecond)
	_, rel, err = c.Acquire(ctx, "k1", src)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if !isMount(t, c.MountPoint("k1")) || read(t, c.MountPoint("k1")) != "one" {
		t.Fatal("a held mount was unmounted")
	}
	rel()
}

func TestRestartRecovery(t *testing.T) {
	testutil.RequireRoot(t)
	tmp := t.TempDir()
	a, b := blob(t, tmp, "aaa"), blob(t, tmp, "bbb")
	dir := filepath.Join(tmp, "layers")
	c1, err := New(dir, Options{Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := c1.Acquire(ctx, "ka", a); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c1.Acquire(ctx, "kb", b); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "stale"), 0o755) // a mount point left empty
	// The process "dies" holding both; a new one adopts the mounts.
	c2 := newCache(t, dir, Options{Grace: time.Hour})
	if got := len(c2.List()); got != 2 {
		t.Fatalf("adopted %d mounts: %+v", got, c2.List())
	}
	if _, err := os.Stat(filepath.Join(dir, "stale")); !os.IsNotExist(err) {
		t.Fatal("stale mount point kept")
	}
	// "ka" is still used by an adopted sandbox: re-used, not remounted.
	d, rel, err := c2.Acquire(ctx, "ka", a)
	if err != nil || read(t, d) != "aaa" {
		t.Fatal(err)
	}
	if n, _ := mountinfo.Under(c2.MountPoint("ka")); len(n) != 1 {
		t.Fatalf("remounted: %v", n)
	}
	// Nobody took "kb": collected.
	if err := c2.UnmountIdle(); err != nil {
		t.Fatal(err)
	}
	if isMount(t, c2.MountPoint("kb")) || !isMount(t, c2.MountPoint("ka")) {
		t.Fatalf("after UnmountIdle: %+v", c2.List())
	}
	rel()
	// Close keeps nothing idle.
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := mountinfo.Under(dir); len(n) != 0 {
		t.Fatalf("mounts left after Close: %v", n)
	}
	if _, _, err := c2.Acquire(ctx, "ka", a); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("acquire after close: %v", err)
	}
}

func TestLoopFallbackAndErrors(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no loop devices")
	}
	tmp := t.TempDir()
	src := blob(t, tmp, "looped")
	c := newCache(t, filepath.Join(tmp, "layers"), Options{Grace: -1, ForceLoop: true})
	ctx := context.Background()
	d, rel, err := c.Acquire(ctx, "kl", src)
	if err != nil {
		t.Fatal(err)
	}
	if read(t, d) != "looped" {
		t.Fatal("bad content")
	}
	l := c.List()
	if len(l) != 1 || !strings.HasPrefix(l[0].Device, "/dev/loop") || l[0].Source != src {
		t.Fatalf("list %+v", l)
	}
	dev := l[0].Device
	rel()
	// Grace < 0: unmounted at once, and the device auto-cleared.
	if isMount(t, c.MountPoint("kl")) {
		t.Fatal("still mounted")
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
		if len(b) == 0 || !strings.Contains(string(b), src) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("loop device %s still attached to %s", dev, b)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A corrupt blob and a missing one fail cleanly, leaving no mount.
	bad := filepath.Join(tmp, "bad.erofs")
	os.WriteFile(bad, bytes.Repeat([]byte{0x5a}, 8192), 0o444)
	c2 := newCache(t, filepath.Join(tmp, "layers2"), Options{Grace: -1})
	if _, _, err := c2.Acquire(ctx, "bad", bad); err == nil {
		t.Fatal("mounted garbage")
	}
	if _, _, err := c2.Acquire(ctx, "missing", filepath.Join(tmp, "nope")); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("missing blob: %v", err)
	}
	if n, _ := mountinfo.Under(c2.Dir()); len(n) != 0 || len(c2.List()) != 0 {
		t.Fatalf("leftovers: %v %+v", n, c2.List())
	}
	if _, _, err := c2.Acquire(ctx, "../x", bad); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("bad key: %v", err)
	}
}

func BenchmarkMount(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("root")
	}
	tmp := b.TempDir()
	src := blob(&testing.T{}, tmp, "bench")
	c, _ := New(filepath.Join(tmp, "layers"), Options{Grace: -1})
	defer c.UnmountAll()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, rel, err := c.Acquire(context.Background(), fmt.Sprint("k", i%4), src)
		if err != nil {
			b.Fatal(err)
		}
		rel()
	}
	_ = unix.MNT_DETACH
}

// TestMountsNosuidNodev: layer mounts honour no set-uid bits or device
// nodes, whether mounted directly, through a loop device, or adopted from
// an older process that mounted without the flags.
func TestMountsNosuidNodev(t *testing.T) {
	testutil.RequireRoot(t)
	tmp := t.TempDir()
	src := blob(t, tmp, "flags")
	check := func(what, dir string) {
		t.Helper()
		ms, err := mountinfo.Under(dir)
		if err != nil || len(ms) != 1 {
			t.Fatalf("%s: mounts %v %v", what, ms, err)
		}
		for _, f := range []string{"ro", "nosuid", "nodev"} {
			if !slices.Contains(ms[0].MountOptions, f) {
				t.Errorf("%s: mount options %v lack %s", what, ms[0].MountOptions, f)
			}
		}
	}
	ctx := context.Background()
	c := newCache(t, filepath.Join(tmp, "direct"), Options{Grace: -1})
	d, rel, err := c.Acquire(ctx, "k", src)
	if err != nil {
		t.Fatal(err)
	}
	check("file-backed", d)
	rel()
	if _, err := os.Stat("/dev/loop-control"); err == nil {
		c := newCache(t, filepath.Join(tmp, "loop"), Options{Grace: -1, ForceLoop: true})
		d, rel, err := c.Acquire(ctx, "k", src)
		if err != nil {
			t.Fatal(err)
		}
		check("loop", d)
		rel()
	}
	// An older daemon's mount, without the flags, is adopted with them.
	old := filepath.Join(tmp, "old")
	if err := os.MkdirAll(filepath.Join(old, "k"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, filepath.Join(old, "k"), "erofs", unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	c = newCache(t, old, Options{Grace: time.Hour})
	check("adopted", c.MountPoint("k"))
}

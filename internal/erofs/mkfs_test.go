package erofs

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/layermount"
	"github.com/warrenrl/warren/internal/testutil"
)

// requireMkfs returns the mkfs.erofs the tests use ($WARREN_MKFS_EROFS or
// FindMkfs), or skips saying why there is none.
func requireMkfs(t testing.TB) *Mkfs {
	t.Helper()
	m, why, err := SelectMkfs(os.Getenv(MkfsEnv))
	if err != nil {
		t.Fatalf("$%s: %v", MkfsEnv, err)
	}
	if m == nil {
		t.Skipf("mkfs.erofs converter not tested: %v", why)
	}
	return m
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts)")
	}
}

// convertFile converts data into a file and returns its path.
func convertFile(t testing.TB, data []byte, opts Options) (string, Stats) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layer.erofs")
	out, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if opts.TempDir == "" {
		opts.TempDir = t.TempDir()
	}
	st, err := Convert(context.Background(), bytes.NewReader(data), out, opts)
	if err != nil {
		t.Fatalf("convert (%s): %v", builderName(opts), err)
	}
	return p, st
}

func builderName(o Options) string {
	if o.Mkfs != nil {
		return "mkfs.erofs"
	}
	return "go-erofs"
}

var mountCaches = map[testing.TB]*layermount.Cache{}

// mountImage mounts an image read-only (file-backed, or through a loop
// device where the kernel wants one) until the test ends.
func mountImage(t testing.TB, img string) string {
	t.Helper()
	mc := mountCaches[t]
	if mc == nil {
		var err error
		mc, err = layermount.New(t.TempDir(), layermount.Options{Grace: -1})
		if err != nil {
			t.Fatal(err)
		}
		mountCaches[t] = mc
		t.Cleanup(func() {
			delete(mountCaches, t)
			if err := mc.UnmountAll(); err != nil {
				t.Errorf("unmount: %v", err)
			}
		})
	}
	sum := sha256.Sum256([]byte(img))
	dir, release, err := mc.Acquire(context.Background(), hex.EncodeToString(sum[:8]), img)
	if err != nil {
		t.Fatalf("mount %s: %v", img, err)
	}
	t.Cleanup(release)
	return dir
}

// inode is what a mounted tree shows of one name.
type inode struct {
	mode          uint32
	uid, gid      uint32
	size          int64 // not for directories (layout-dependent)
	mtime         int64
	mtimeNs       int64
	rdev          uint64
	nlink         uint64 // not for regular files (hardlinks differ)
	link          string
	sum           string
	xattrs        string // all namespaces, sorted
	ino, fileLink uint64 // compared separately
}

func (i inode) String() string {
	return fmt.Sprintf("mode %o %d:%d size %d mtime %d.%09d rdev %d nlink %d link %q sum %s xattrs [%s]",
		i.mode, i.uid, i.gid, i.size, i.mtime, i.mtimeNs, i.rdev, i.nlink, i.link, i.sum, i.xattrs)
}

func readTree(t testing.TB, root string) map[string]inode {
	t.Helper()
	out := map[string]inode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		n := inode{mode: st.Mode, uid: st.Uid, gid: st.Gid, size: st.Size, mtime: st.Mtim.Sec, mtimeNs: st.Mtim.Nsec,
			rdev: st.Rdev, nlink: st.Nlink, ino: st.Ino, fileLink: st.Nlink}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			n.size = 0
		case unix.S_IFLNK:
			n.link, _ = os.Readlink(p)
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			n.sum = hex.EncodeToString(h[:8])
			n.nlink = 0
		}
		n.xattrs = xattrsOf(t, p)
		out[rel] = n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func xattrsOf(t testing.TB, p string) string {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return ""
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	var xs []string
	for _, x := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		vs, err := unix.Lgetxattr(p, x, nil)
		if err == unix.ENODATA && strings.HasPrefix(x, "user.") {
			// Listed but not readable: user.* on a symlink (the kernel's
			// xattr_permission).
			xs = append(xs, x+"=ENODATA")
			continue
		}
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, x, err)
		}
		v := make([]byte, vs)
		if vs > 0 {
			if vs, err = unix.Lgetxattr(p, x, v); err != nil {
				t.Fatalf("getxattr %s %s: %v", p, x, err)
			}
		}
		xs = append(xs, fmt.Sprintf("%s=%q", x, v[:vs]))
	}
	sort.Strings(xs)
	return strings.Join(xs, ",")
}

// compareBuilders converts data with both builders, mounts both images
// and checks that they show the same tree; with mkfs.erofs the names of
// each hardlink group (links: name -> names of its group) are one inode.
// It returns the mkfs.erofs tree.
func compareBuilders(t *testing.T, m *Mkfs, data []byte, links map[string][]string) map[string]inode {
	t.Helper()
	goImg, goSt := convertFile(t, data, Options{})
	mkImg, mkSt := convertFile(t, data, Options{Mkfs: m})
	if goSt.Builder != BuilderVersion || mkSt.Builder != m.BuilderVersion() || !strings.Contains(mkSt.Builder, "mkfs.erofs/1.") {
		t.Fatalf("builders %q %q", goSt.Builder, mkSt.Builder)
	}
	goSt.Builder, mkSt.Builder = "", ""
	if goSt != mkSt {
		t.Fatalf("stats differ:\n go   %+v\n mkfs %+v", goSt, mkSt)
	}
	fsck(t, m, goImg)
	fsck(t, m, mkImg)
	gt, mt := readTree(t, mountImage(t, goImg)), readTree(t, mountImage(t, mkImg))
	for p, g := range gt {
		k, ok := mt[p]
		if !ok {
			t.Errorf("%s: only in the go-erofs image (%v)", p, g)
			continue
		}
		gc, kc := g, k
		gc.ino, kc.ino, gc.fileLink, kc.fileLink = 0, 0, 0, 0
		if gc != kc {
			t.Errorf("%s:\n  go-erofs   %v\n  mkfs.erofs %v", p, g, k)
		}
		if g.mode&unix.S_IFMT == unix.S_IFREG && g.fileLink != 1 {
			t.Errorf("%s: go-erofs file with nlink %d", p, g.fileLink)
		}
	}
	for p, k := range mt {
		if _, ok := gt[p]; !ok {
			t.Errorf("%s: only in the mkfs.erofs image (%v)", p, k)
		}
	}
	// Hardlinks: with mkfs.erofs each group is one inode with nlink =
	// the group's size; every other file has nlink 1.
	grouped := map[string]bool{}
	for p, group := range links {
		want := mt[p]
		for _, q := range group {
			grouped[q] = true
			if got := mt[q]; got.ino != want.ino || got.fileLink != uint64(len(group)) {
				t.Errorf("hardlink %s -> %s: ino %d nlink %d, want ino %d nlink %d", q, p, got.ino, got.fileLink, want.ino, len(group))
			}
		}
	}
	for p, k := range mt {
		if k.mode&unix.S_IFMT == unix.S_IFREG && !grouped[p] && k.fileLink != 1 {
			t.Errorf("%s: nlink %d, not a hardlink", p, k.fileLink)
		}
	}
	return mt
}

// fsck runs erofs-utils' fsck.erofs (next to mkfs.erofs) on an image.
func fsck(t *testing.T, m *Mkfs, img string) {
	t.Helper()
	f := filepath.Join(filepath.Dir(m.Path), "fsck.erofs")
	if _, err := os.Stat(f); err != nil {
		return
	}
	if out, err := exec.Command(f, img).CombinedOutput(); err != nil {
		t.Errorf("fsck.erofs %s: %v\n%s", img, err, out)
	}
}

func hdr(name string, typ byte, mode int64) tar.Header {
	return tar.Header{Name: name, Typeflag: typ, Mode: mode, ModTime: time.Unix(1700000000, 0)}
}

func TestMkfsMatchesGoErofs(t *testing.T) {
	requireRoot(t)
	m := requireMkfs(t)
	long := strings.Repeat("d", 200)
	deep := strings.Repeat(long+"/", 19) + strings.Repeat("f", 100) // ~3900 bytes
	data := mkTar(t,
		ent{hdr: tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o750, Uid: 3, Gid: 4, ModTime: time.Unix(1600000000, 5)}},
		d("dir/"),
		ent{hdr: tar.Header{Name: "dir/suid", Mode: 0o4755, Uid: 7, Gid: 8, ModTime: time.Unix(1234, 500000000),
			PAXRecords: map[string]string{"SCHILY.xattr.user.a": "1", "SCHILY.xattr.user.bin": "a\x00b\nc=d", "SCHILY.xattr.user.empty": "",
				"SCHILY.xattr.trusted.overlay.opaque": "y", "SCHILY.xattr.security.selinux": "x"}}, body: "hello"},
		ent{hdr: tar.Header{Name: "dir/link", Typeflag: tar.TypeSymlink, Linkname: "../../outside", ModTime: time.Unix(99, 999999999)}},
		ent{hdr: tar.Header{Name: "dir/hard", Typeflag: tar.TypeLink, Linkname: "dir/suid"}},
		ent{hdr: tar.Header{Name: "other/hard2", Typeflag: tar.TypeLink, Linkname: "./dir/suid"}},
		ent{hdr: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		f("dir/.wh.gone", ""), f(".wh.rootgone", ""), f("opq/.wh..wh..opq", ""), f("opq/kept", "k"),
		f("opq/.wh.inopq", ""),
		f("/abs/path", "neutralised"), f("./dup", "one"), f("dup", "two"),
		// Same-layer whiteout of an existing entry: the entry stays.
		f("stay", "s"), f(".wh.stay", ""),
		ent{hdr: tar.Header{Name: "ns/frac", ModTime: time.Unix(1700000000, 100)}, body: "x"},
		ent{hdr: tar.Header{Name: "ns/frac2", ModTime: time.Unix(1700000000, 120000000)}, body: "y"},
		ent{hdr: tar.Header{Name: "ns/zero", ModTime: time.Unix(0, 0)}, body: ""},
		ent{hdr: tar.Header{Name: "ns/future", ModTime: time.Unix(9999999999, 1)}, body: "z"},
		ent{hdr: tar.Header{Name: "ids/big", Uid: 4294967294, Gid: 2097152}, body: "ids"},
		ent{hdr: tar.Header{Name: "ids/edge", Uid: 2097151, Gid: 65536}, body: "ids"},
		ent{hdr: tar.Header{Name: "names/new\nline", Mode: 0o600}, body: "nl"},
		ent{hdr: tar.Header{Name: "names/ütf-8 ✓", Mode: 0o600}, body: "u"},
		ent{hdr: tar.Header{Name: "names/\xff\xfe-not-utf8", Mode: 0o600}, body: "b"},
		ent{hdr: tar.Header{Name: "names/a=b", Mode: 0o600}, body: "eq"},
		ent{hdr: tar.Header{Name: "names/" + strings.Repeat("n", 255), Mode: 0o600}, body: "255"},
		ent{hdr: tar.Header{Name: deep, Mode: 0o600}, body: "deep"},
		ent{hdr: tar.Header{Name: "names/longlink", Typeflag: tar.TypeSymlink, Linkname: strings.Repeat("t/", 2000)}},
		ent{hdr: tar.Header{Name: "sticky/", Typeflag: tar.TypeDir, Mode: 0o1777}},
		ent{hdr: tar.Header{Name: "sticky/sg", Mode: 0o2711, Gid: 50}, body: "sg"},
		f("blocks/4096", strings.Repeat("b", 4096)),
		f("blocks/4097", strings.Repeat("c", 4097)),
		f("blocks/big", strings.Repeat("0123456789abcdef", 40000)),
		// A link to a file that is replaced afterwards keeps the old data.
		f("swap/a", "old"), ent{hdr: tar.Header{Name: "swap/b", Typeflag: tar.TypeLink, Linkname: "swap/a"}}, f("swap/a", "new"),
		// Links of links, a chain of four names.
		f("chain/1", "c"), ent{hdr: tar.Header{Name: "chain/2", Typeflag: tar.TypeLink, Linkname: "chain/1"}},
		ent{hdr: tar.Header{Name: "chain/3", Typeflag: tar.TypeLink, Linkname: "chain/2"}},
		ent{hdr: tar.Header{Name: "z/4", Typeflag: tar.TypeLink, Linkname: "chain/3"}},
		// A directory first made implicitly, then given its own entry.
		f("late/file", "x"), ent{hdr: tar.Header{Name: "late/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 9}},
	)
	tree := compareBuilders(t, m, data, map[string][]string{
		"dir/suid": {"dir/suid", "dir/hard", "other/hard2"},
		"swap/b":   {"swap/b"},
		"chain/1":  {"chain/1", "chain/2", "chain/3", "z/4"},
	})
	// Spot checks of what both show.
	if r := tree["."]; r.mode != unix.S_IFDIR|0o750 || r.uid != 3 || r.mtimeNs != 5 || !strings.Contains(r.xattrs, OriginXattr) {
		t.Errorf("root %v", r)
	}
	if r := tree["ns/frac2"]; r.mtime != 1700000000 || r.mtimeNs != 120000000 {
		t.Errorf("mtime with ns: %v", r)
	}
	if r := tree["ids/big"]; r.uid != 4294967294 || r.gid != 2097152 {
		t.Errorf("big ids: %v", r)
	}
	if r := tree["dir/gone"]; r.mode != unix.S_IFCHR || r.rdev != 0 {
		t.Errorf("whiteout %v", r)
	}
	if r := tree["dir"]; !strings.Contains(r.xattrs, OriginXattr) {
		t.Errorf("a directory with whiteouts has no %s: %v", OriginXattr, r)
	}
	if r := tree["opq"]; !strings.Contains(r.xattrs, OpaqueXattr+`="y"`) {
		t.Errorf("opaque dir %v", r)
	}
	if r := tree["dir/suid"]; r.xattrs != `user.a="1",user.bin="a\x00b\nc=d",user.empty=""` {
		t.Errorf("xattrs %q", r.xattrs)
	}
	if _, ok := tree["stay"]; !ok {
		t.Error("a whiteout of the same layer removed an entry")
	}
	if _, ok := tree["dev/null"]; ok {
		t.Error("device node kept")
	}
}

// TestMkfsRandomTrees compares both builders on generated layers.
func TestMkfsRandomTrees(t *testing.T) {
	requireRoot(t)
	m := requireMkfs(t)
	for seed := int64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			data, links := randomLayer(t, rand.New(rand.NewSource(seed)), 300)
			compareBuilders(t, m, data, links)
		})
	}
}

// randomLayer generates a layer of n entries and the hardlink groups of
// its final tree.
func randomLayer(t testing.TB, r *rand.Rand, n int) ([]byte, map[string][]string) {
	var ents []ent
	dirs := []string{""}
	var files []string
	groups := map[string][]string{} // first name -> names
	groupOf := map[string]string{}
	name := func() string {
		b := make([]byte, 1+r.Intn(12))
		for i := range b {
			b[i] = "abcdefgh_-.xyzé"[r.Intn(15)]
		}
		return string(b)
	}
	xattrs := func() map[string]string {
		if r.Intn(4) != 0 {
			return nil
		}
		m := map[string]string{}
		for i := r.Intn(3); i >= 0; i-- {
			m["SCHILY.xattr.user."+name()] = strings.Repeat("v", r.Intn(300))
		}
		return m
	}
	used := map[string]bool{}
	for len(ents) < n {
		dir := dirs[r.Intn(len(dirs))]
		p := strings.TrimPrefix(dir+"/"+name(), "/")
		if used[p] || strings.HasPrefix(filepath.Base(p), ".wh.") || filepath.Base(p) == "." || filepath.Base(p) == ".." {
			continue
		}
		used[p] = true
		mt := time.Unix(int64(r.Intn(2000000000)), int64(r.Intn(3))*int64(r.Intn(1000000000)))
		h := tar.Header{Name: p, ModTime: mt, Uid: r.Intn(3) * r.Intn(70000), Gid: r.Intn(2) * 1000, PAXRecords: xattrs()}
		switch k := r.Intn(10); {
		case k < 2:
			h.Typeflag, h.Mode = tar.TypeDir, int64(0o700|r.Intn(0o1000)|r.Intn(2)*0o1000)
			h.Name += "/"
			dirs = append(dirs, p)
			ents = append(ents, ent{hdr: h})
		case k < 6:
			h.Mode = int64(r.Intn(0o10000))
			files = append(files, p)
			ents = append(ents, ent{hdr: h, body: strings.Repeat(string(rune('a'+r.Intn(26))), r.Intn(3)*r.Intn(9000))})
		case k < 7:
			h.Typeflag, h.Linkname = tar.TypeSymlink, name()+"/"+name()
			ents = append(ents, ent{hdr: h})
		case k < 9 && len(files) > 0:
			target := files[r.Intn(len(files))]
			h.Typeflag, h.Linkname, h.PAXRecords = tar.TypeLink, target, nil
			first := target
			if g, ok := groupOf[target]; ok {
				first = g
			} else {
				groups[first] = []string{first}
				groupOf[first] = first
			}
			groups[first] = append(groups[first], p)
			groupOf[p] = first
			ents = append(ents, ent{hdr: h})
		default:
			// A whiteout of a name that is not in this layer.
			target := name()
			wo := strings.TrimPrefix(dir+"/.wh."+target, "/")
			if target == "." || target == ".." || used[strings.TrimPrefix(dir+"/"+target, "/")] {
				continue
			}
			ents = append(ents, ent{hdr: tar.Header{Name: wo, Typeflag: tar.TypeReg}})
			if r.Intn(3) == 0 && dir != "" {
				ents = append(ents, ent{hdr: tar.Header{Name: dir + "/.wh..wh..opq", Typeflag: tar.TypeReg}})
			}
		}
	}
	return mkTar(t, ents...), groups
}

func TestMkfsDeterministicAndProgress(t *testing.T) {
	m := requireMkfs(t)
	data, _ := randomLayer(t, rand.New(rand.NewSource(7)), 200)
	var last int64
	p1, _ := convertFile(t, data, Options{Mkfs: m, Progress: func(n int64) { last = n }})
	p2, _ := convertFile(t, data, Options{Mkfs: m})
	b1, _ := os.ReadFile(p1)
	b2, _ := os.ReadFile(p2)
	if !bytes.Equal(b1, b2) || len(b1) == 0 || len(b1)%BlockSize != 0 {
		t.Fatalf("mkfs.erofs conversion is not deterministic (%d and %d bytes)", len(b1), len(b2))
	}
	if last < int64(len(data))/2 {
		t.Fatalf("progress reported %d bytes of a %d-byte layer", last, len(data))
	}
	// An output that is not an *os.File goes through a temporary file.
	ws := &memWriteSeeker{}
	if _, err := Convert(context.Background(), bytes.NewReader(data), ws, Options{Mkfs: m, TempDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ws.b, b1) {
		t.Fatalf("image through a WriteSeeker differs (%d vs %d bytes)", len(ws.b), len(b1))
	}
}

type memWriteSeeker struct {
	b   []byte
	off int64
}

func (m *memWriteSeeker) Write(p []byte) (int, error) {
	if need := m.off + int64(len(p)); need > int64(len(m.b)) {
		m.b = append(m.b, make([]byte, need-int64(len(m.b)))...)
	}
	copy(m.b[m.off:], p)
	m.off += int64(len(p))
	return len(p), nil
}

func (m *memWriteSeeker) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		m.off = off
	case io.SeekCurrent:
		m.off += off
	case io.SeekEnd:
		m.off = int64(len(m.b)) + off
	}
	return m.off, nil
}

// The canonical tar stream is a valid tar: archive/tar reads back the tree.
func TestCanonicalTarRoundTrip(t *testing.T) {
	data, _ := randomLayer(t, rand.New(rand.NewSource(3)), 150)
	c := &converter{ctx: context.Background(), opts: Options{MaxFiles: DefaultMaxFiles}, root: newDir(0o755), buf: make([]byte, 64<<10)}
	spool, err := os.CreateTemp(t.TempDir(), "spool")
	if err != nil {
		t.Fatal(err)
	}
	defer spool.Close()
	c.spool = spool
	if err := c.read(&countReader{r: bytes.NewReader(data)}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := c.writeTar(&buf); err != nil {
		t.Fatal(err)
	}
	seen := map[string]*tar.Header{}
	for h := range testutil.TarEntries(t, bytes.NewReader(buf.Bytes())) {
		if _, dup := seen[h.Name]; dup {
			t.Fatalf("%s twice", h.Name)
		}
		seen[h.Name] = h
		if h.Typeflag == tar.TypeLink {
			if _, ok := seen[h.Linkname]; !ok {
				t.Fatalf("%s links to %s, not written before", h.Name, h.Linkname)
			}
		}
	}
	// Convert of the canonical stream gives the same tree again (the
	// stream is its own fixed point, hardlinks and all).
	spool2, err := os.CreateTemp(t.TempDir(), "spool")
	if err != nil {
		t.Fatal(err)
	}
	defer spool2.Close()
	c2 := &converter{ctx: context.Background(), opts: Options{MaxFiles: DefaultMaxFiles}, root: newDir(0o755), buf: make([]byte, 64<<10), spool: spool2}
	if err := c2.read(&countReader{r: bytes.NewReader(buf.Bytes())}); err != nil {
		t.Fatal(err)
	}
	var buf2 bytes.Buffer
	if err := c2.writeTar(&buf2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), buf2.Bytes()) {
		t.Fatal("the canonical tar of the canonical tar differs")
	}
}

func TestMkfsBadInputAndCancel(t *testing.T) {
	m := requireMkfs(t)
	// The validation in front of both builders: the same errors.
	for _, tc := range []struct {
		name string
		data []byte
		msg  string
	}{
		{"dotdot", mkTar(t, f("a/../../b", "x")), "escapes"},
		{"hardlink-escape", mkTar(t, ent{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../etc/passwd"}}), "leaves the layer"},
		{"hardlink-absolute", mkTar(t, ent{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}}), "not in this layer"},
		{"hardlink-dir", mkTar(t, d("x/"), ent{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "x"}}), "not a regular file"},
		{"hardlink-whiteout", mkTar(t, f(".wh.x", ""), ent{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "x"}}), "not in this layer"},
		{"whiteout-dir-name", mkTar(t, f(".wh.x/y", "z")), "reserved for whiteouts"},
		{"under-file", mkTar(t, f("a", "x"), f("a/b", "y")), "not a directory"},
		{"truncated", mkTar(t, f("a", "x"))[:600], "truncated"},
		{"long-name", mkTar(t, f(strings.Repeat("n", 256), "")), "longer than"},
	} {
		for _, o := range []Options{{}, {Mkfs: m}} {
			out, _ := os.Create(filepath.Join(t.TempDir(), "x"))
			o.TempDir = t.TempDir()
			_, err := Convert(context.Background(), bytes.NewReader(tc.data), out, o)
			out.Close()
			if errdefs.CategoryOf(err) != errdefs.Invalid || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("%s (%s): want Invalid %q, got %v", tc.name, builderName(o), tc.msg, err)
			}
		}
	}

	// Cancelled while mkfs.erofs runs: it is killed, the error says so.
	data, _ := randomLayer(t, rand.New(rand.NewSource(5)), 400)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, _ := os.Create(filepath.Join(t.TempDir(), "x"))
	defer out.Close()
	_, err := Convert(ctx, bytes.NewReader(data), out, Options{Mkfs: m, TempDir: t.TempDir(), Progress: func(int64) { cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled conversion: %v", err)
	}
}

func TestSelectMkfs(t *testing.T) {
	if m, why, err := SelectMkfs("off"); m != nil || why == nil || err != nil {
		t.Fatalf("off: %v %v %v", m, why, err)
	}
	_, _, err := SelectMkfs(filepath.Join(t.TempDir(), "nope"))
	if errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("missing path: %v", err)
	}
	// A program that is not mkfs.erofs >= 1.8.
	old := filepath.Join(t.TempDir(), "mkfs.erofs")
	if err := os.WriteFile(old, []byte("#!/bin/sh\necho 'mkfs.erofs 1.5'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := SelectMkfs(old); errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "needs >= 1.8") {
		t.Fatalf("1.5: %v", err)
	}
	if err := os.WriteFile(old, []byte("#!/bin/sh\necho 'mkfs.erofs (erofs-utils) 1.9.1-g0abc'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if m, _, err := SelectMkfs(old); err != nil || m.Version != "1.9.1" || m.BuilderVersion() != "warren-erofs/2 mkfs.erofs/1.9.1" {
		t.Fatalf("1.9.1: %+v %v", m, err)
	}
	saved := MkfsSearchPath
	defer func() { MkfsSearchPath = saved }()
	MkfsSearchPath = []string{filepath.Join(t.TempDir(), "absent")}
	t.Setenv("PATH", t.TempDir())
	m, why, err := SelectMkfs("auto")
	if m != nil || err != nil || !strings.Contains(why.Error(), "not installed") || !strings.Contains(why.Error(), "scripts/erofs-utils.sh") {
		t.Fatalf("auto without any: %v %v %v", m, why, err)
	}
}

// An opaque root and whiteouts in directories no other layer has: in an
// overlay both builders' layers hide the whiteouts (the directories carry
// trusted.overlay.origin, so overlayfs never lists them directly).
func TestMkfsOpaqueRootAndHiddenWhiteouts(t *testing.T) {
	requireRoot(t)
	m := requireMkfs(t)
	data := mkTar(t, f(".wh..wh..opq", ""), d("x/"), f("x/.wh.foo", ""), f("x/bar", "b"),
		d("y/"), f("y/.wh..wh..opq", ""), f("y/.wh.gone", ""), f("y/kept", "k"), f(".wh.top", ""))
	tree := compareBuilders(t, m, data, nil)
	if r := tree["."]; !strings.Contains(r.xattrs, OpaqueXattr+`="y"`) || !strings.Contains(r.xattrs, OriginXattr) {
		t.Fatalf("root %v", r)
	}
	for _, o := range []Options{{}, {Mkfs: m}} {
		img, st := convertFile(t, data, o)
		if !st.RootOpaque {
			t.Fatalf("%s: root not opaque: %+v", builderName(o), st)
		}
		mp := t.TempDir()
		if err := unix.Mount("overlay", mp, "overlay", unix.MS_RDONLY, "lowerdir="+mountImage(t, img)+":"+t.TempDir()); err != nil {
			t.Fatal(err)
		}
		var got []string
		filepath.WalkDir(mp, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				t.Errorf("%s: %v", builderName(o), err)
				return nil
			}
			rel, _ := filepath.Rel(mp, p)
			got = append(got, rel)
			return nil
		})
		if err := unix.Unmount(mp, 0); err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, " ") != ". x x/bar y y/kept" {
			t.Errorf("%s: the overlay lists %q", builderName(o), got)
		}
	}
}

// BenchmarkBuilders converts one layer with each builder: the tar file
// $WARREN_BENCH_LAYER if set (e.g. a Debian root as Warren streams it),
// else a synthetic layer. Output and spool go to $WARREN_BENCH_DIR (default
// a temp dir).
func BenchmarkBuilders(b *testing.B) {
	src := os.Getenv("WARREN_BENCH_LAYER")
	if src == "" {
		var ents []ent
		body := strings.Repeat("z", 64<<10)
		for i := 0; i < 1024; i++ {
			ents = append(ents, f(fmt.Sprintf("dir%d/file%d", i%26, i), body))
		}
		src = filepath.Join(b.TempDir(), "layer.tar")
		if err := os.WriteFile(src, mkTar(b, ents...), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	fi, err := os.Stat(src)
	if err != nil {
		b.Fatal(err)
	}
	dir := os.Getenv("WARREN_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	mk, why, err := SelectMkfs(os.Getenv(MkfsEnv))
	if err != nil {
		b.Fatal(err)
	}
	for _, bl := range []struct {
		name string
		mk   *Mkfs
	}{{"go-erofs", nil}, {"mkfs.erofs", mk}} {
		b.Run(bl.name, func(b *testing.B) {
			if bl.name == "mkfs.erofs" && bl.mk == nil {
				b.Skipf("mkfs.erofs converter not measured: %v", why)
			}
			o := Options{Mkfs: bl.mk, TempDir: dir}
			b.SetBytes(fi.Size())
			var size int64
			for i := 0; i < b.N; i++ {
				in, err := os.Open(src)
				if err != nil {
					b.Fatal(err)
				}
				out, err := os.CreateTemp(dir, "bench-")
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Convert(context.Background(), in, out, o); err != nil {
					b.Fatal(err)
				}
				if err := out.Sync(); err != nil {
					b.Fatal(err)
				}
				size, _ = out.Seek(0, io.SeekEnd)
				in.Close()
				out.Close()
				os.Remove(out.Name())
			}
			b.ReportMetric(float64(size), "image-bytes")
		})
	}
}

// Progress comes at least every 64 KiB of the layer, as the import's
// progress events expect (one per 4 MiB window).
func TestMkfsProgressSteps(t *testing.T) {
	m := requireMkfs(t)
	data := mkTar(t, f("big", strings.Repeat("x", 3<<20)), f("small", "s"))
	var last, maxStep int64
	convertFile(t, data, Options{Mkfs: m, Progress: func(n int64) {
		maxStep = max(maxStep, n-last)
		last = n
	}})
	if maxStep > 64<<10 || last < int64(len(data))-2048 {
		t.Fatalf("progress: largest step %d, last %d of %d", maxStep, last, len(data))
	}
}

// A failing mkfs.erofs: its message and a category come back, a full disk
// is Exhausted; one that writes no image is caught.
func TestMkfsFailures(t *testing.T) {
	data := mkTar(t, f("a", strings.Repeat("x", 1<<20)))
	for _, tc := range []struct {
		script string
		cat    errdefs.Category
		msg    string
	}{
		{"echo '<E> erofs: something broke' >&2; exit 1", errdefs.Internal, "something broke"},
		{"cat >/dev/null; echo 'failed to write: No space left on device' >&2; exit 1", errdefs.Exhausted, "No space left"},
		{"cat >/dev/null; exit 0", errdefs.Internal, "wrote no EROFS image"},
	} {
		p := filepath.Join(t.TempDir(), "mkfs.erofs")
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+tc.script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		out, _ := os.Create(filepath.Join(t.TempDir(), "x"))
		_, err := Convert(context.Background(), bytes.NewReader(data), out, Options{Mkfs: &Mkfs{Path: p, Version: "1.8.0"}, TempDir: t.TempDir()})
		out.Close()
		if errdefs.CategoryOf(err) != tc.cat || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%q: want %v %q, got %v (%v)", tc.script, tc.cat, tc.msg, errdefs.CategoryOf(err), err)
		}
	}
}

package sandboxfs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// listAll pages through the directory p with pages of pageSize entries
// and returns every entry sorted by name.
func listAll(fs *FS, p string, pageSize int) ([]FileInfo, error) {
	var out []FileInfo
	tok := ""
	for {
		page, next, err := fs.List(ctx, p, pageSize, tok)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if next == "" {
			break
		}
		tok = next
	}
	slices.SortFunc(out, func(a, b FileInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// makeEntries creates n empty files in dir named prefix0, prefix1, ...
func makeEntries(t *testing.T, dir, prefix string, n int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		fd, err := unix.Open(filepath.Join(dir, fmt.Sprintf("%s%d", prefix, i)), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
	}
}

// checkPages pages through p with each page size and checks that every
// one of want is seen exactly once, that no page is larger than asked
// and that only the last page has no token.
func checkPages(t *testing.T, fs *FS, p string, want map[string]bool, sizes ...int) {
	t.Helper()
	for _, size := range sizes {
		seen := map[string]int{}
		tok, pages := "", 0
		for {
			page, next, err := fs.List(ctx, p, size, tok)
			if err != nil {
				t.Fatalf("page %d of %s (size %d): %v", pages, p, size, err)
			}
			pages++
			limit := size
			if limit == 0 {
				limit = DefaultPageSize
			}
			if len(page) > limit || (next != "" && len(page) == 0) {
				t.Fatalf("size %d: page %d has %d entries, next %q", size, pages, len(page), next)
			}
			for _, fi := range page {
				seen[fi.Name]++
				if fi.Path != filepath.Join(p, fi.Name) || fi.Type != "file" {
					t.Fatalf("entry %+v", fi)
				}
			}
			if next == "" {
				break
			}
			tok = next
		}
		if len(seen) != len(want) {
			t.Fatalf("size %d: saw %d names, want %d", size, len(seen), len(want))
		}
		for n, c := range seen {
			if c != 1 || !want[n] {
				t.Fatalf("size %d: %q seen %d times (expected: %v)", size, n, c, want[n])
			}
		}
		if wantPages := (len(want) + max(size, 1) - 1) / max(size, 1); size > 0 && pages != wantPages {
			t.Fatalf("size %d: %d pages for %d entries, want %d", size, pages, len(want), wantPages)
		}
	}
}

// TestListPagesPlainDir: on an ordinary directory (ext4 or tmpfs, with
// hash-ordered d_off cookies) paging sees every entry exactly once, for
// page sizes that divide the count and ones that do not.
func TestListPagesPlainDir(t *testing.T) {
	fs, root, _ := setup(t)
	const n = 5000
	makeEntries(t, filepath.Join(root, "big"), "f", n)
	want := map[string]bool{}
	for i := 0; i < n; i++ {
		want[fmt.Sprintf("f%d", i)] = true
	}
	checkPages(t, fs, "/big", want, 1, 7, 1000, 0, 5000, MaxPageSize, MaxPageSize*3)
}

// TestListPagesOverlay: a merged overlayfs directory (entries in two
// lower layers and the upper one) resumes from its own cookies too.
func TestListPagesOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount overlayfs")
	}
	base := t.TempDir()
	l1, l2, up, work, mnt := filepath.Join(base, "l1"), filepath.Join(base, "l2"), filepath.Join(base, "up"), filepath.Join(base, "work"), filepath.Join(base, "mnt")
	want := map[string]bool{}
	for i, d := range []string{l1, l2, up} {
		makeEntries(t, filepath.Join(d, "d"), fmt.Sprintf("l%d-", i), 1500)
		for j := 0; j < 1500; j++ {
			want[fmt.Sprintf("l%d-%d", i, j)] = true
		}
	}
	for _, d := range []string{work, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s", l1, l2, up, work)
	if err := unix.Mount("overlay", mnt, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	checkPages(t, New(mnt), "/d", want, 17, 1000, 0)
}

// TestListTokens: a page token is refused (Invalid) when it is garbage,
// belongs to another directory, or to a directory since replaced.
func TestListTokens(t *testing.T) {
	fs, root, _ := setup(t)
	makeEntries(t, filepath.Join(root, "a"), "x", 10)
	makeEntries(t, filepath.Join(root, "b"), "y", 10)
	_, tokA, err := fs.List(ctx, "/a", 3, "")
	if err != nil || tokA == "" {
		t.Fatalf("first page: %q %v", tokA, err)
	}
	for _, bad := range []string{"garbage", "!!!", tokA[:len(tokA)-2], tokA + "AA", "AQ", strings.Repeat("A", len(tokA))} {
		_, _, err := fs.List(ctx, "/a", 3, bad)
		wantCat(t, err, errdefs.Invalid, "page token")
	}
	_, _, err = fs.List(ctx, "/b", 3, tokA)
	wantCat(t, err, errdefs.Invalid, "another directory")
	// The same directory through a symlink is the same directory.
	if err := os.Symlink("/a", filepath.Join(root, "alink")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fs.List(ctx, "/alink", 3, tokA); err != nil {
		t.Fatalf("token through a symlink to the same directory: %v", err)
	}
	if err := os.Rename(filepath.Join(root, "a"), filepath.Join(root, "old")); err != nil {
		t.Fatal(err)
	}
	makeEntries(t, filepath.Join(root, "a"), "z", 10)
	_, _, err = fs.List(ctx, "/a", 3, tokA)
	wantCat(t, err, errdefs.Invalid, "another directory")
	_, _, err = fs.List(ctx, "/a", -1, "")
	wantCat(t, err, errdefs.Invalid, "page size")
	// An empty directory is one empty page.
	if err := os.Mkdir(filepath.Join(root, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if page, next, err := fs.List(ctx, "/empty", 0, ""); err != nil || len(page) != 0 || next != "" {
		t.Fatalf("empty dir: %v %q %v", page, next, err)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestListCursors: the directory of an unfinished listing stays open for
// its next page (a merged overlay directory is otherwise rebuilt by the
// kernel each page), at most maxCursors of them; a token sent twice
// gives the same page from the kept directory and from a reopened one;
// interleaved listings of one directory each see every entry once.
func TestListCursors(t *testing.T) {
	fs, root, _ := setup(t)
	makeEntries(t, filepath.Join(root, "d"), "e", 100)
	before := openFDs(t)
	var toks []string
	for i := 0; i < maxCursors+10; i++ {
		_, tok, err := fs.List(ctx, "/d", 1+i%3, "")
		if err != nil || tok == "" {
			t.Fatalf("listing %d: %q %v", i, tok, err)
		}
		toks = append(toks, tok)
	}
	if grew := openFDs(t) - before; grew > maxCursors {
		t.Fatalf("%d descriptors kept for unfinished listings, at most %d", grew, maxCursors)
	}
	names := func(page []FileInfo) []string {
		var out []string
		for _, f := range page {
			out = append(out, f.Name)
		}
		return out
	}
	tok := toks[len(toks)-1]
	p1, n1, err1 := fs.List(ctx, "/d", 5, tok)
	p2, n2, err2 := fs.List(ctx, "/d", 5, tok)
	if err1 != nil || err2 != nil || !slices.Equal(names(p1), names(p2)) || n1 != n2 || len(p1) != 5 {
		t.Fatalf("the same token twice: %v %q %v / %v %q %v", names(p1), n1, err1, names(p2), n2, err2)
	}
	want := map[string]bool{}
	for i := 0; i < 100; i++ {
		want[fmt.Sprintf("e%d", i)] = true
	}
	// Four listings of the directory, a page of each in turn.
	seen := make([]map[string]int, 4)
	next := make([]string, 4)
	for live := 4; live > 0; {
		live = 0
		for g := range seen {
			if seen[g] != nil && next[g] == "" {
				continue
			}
			if seen[g] == nil {
				seen[g] = map[string]int{}
			}
			page, n, err := fs.List(ctx, "/d", 3+g, next[g])
			if err != nil {
				t.Fatalf("listing %d: %v", g, err)
			}
			for _, f := range page {
				seen[g][f.Name]++
			}
			next[g] = n
			if n != "" {
				live++
			}
		}
	}
	for g, m := range seen {
		if len(m) != len(want) {
			t.Fatalf("listing %d saw %d names", g, len(m))
		}
		for name, c := range m {
			if c != 1 || !want[name] {
				t.Fatalf("listing %d: %s seen %d times", g, name, c)
			}
		}
	}
}

// TestListPageBytes: a page ends early when its names and symlink
// targets reach 4 MiB, and the next page goes on from there.
func TestListPageBytes(t *testing.T) {
	fs, root, _ := setup(t)
	dir := filepath.Join(root, "links")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	target := "/" + strings.Repeat("t", 4000)
	for i := 0; i < n; i++ {
		if err := os.Symlink(target, filepath.Join(dir, fmt.Sprintf("l%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	tok, pages := "", 0
	for {
		page, next, err := fs.List(ctx, "/links", MaxPageSize, tok)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		bytes := 0
		for _, fi := range page {
			seen[fi.Name]++
			if fi.LinkTarget != target {
				t.Fatalf("%s: target of %d bytes", fi.Name, len(fi.LinkTarget))
			}
			bytes += len(fi.LinkTarget)
		}
		if bytes > maxPageBytes+len(target) {
			t.Fatalf("page %d holds %d bytes of targets", pages, bytes)
		}
		if next == "" {
			break
		}
		tok = next
	}
	if len(seen) != n || pages < 2 {
		t.Fatalf("%d names in %d pages", len(seen), pages)
	}
	for name, c := range seen {
		if c != 1 {
			t.Fatalf("%s seen %d times", name, c)
		}
	}
}

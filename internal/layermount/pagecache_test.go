package layermount

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/testutil"
)

// CachedExtents finds exactly the pages read through the mount, where
// they are in the blob, in both I/O modes, and does not keep the
// directory pages its own walk read.
func TestCachedExtents(t *testing.T) {
	testutil.RequireRoot(t)
	tmp := t.TempDir()
	files := map[string][]byte{"a/one": randomBytes(256<<10, 3), "a/two": randomBytes(100<<10, 4)}
	for i := range 300 {
		files["many/f"+strconv.Itoa(i)] = []byte(strconv.Itoa(i))
	}
	src := filepath.Join(tmp, "tree.erofs")
	treeBlob(t, src, files)
	blobBytes, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, buffered := range []bool{false, true} {
		t.Run("buffered="+strconv.FormatBool(buffered), func(t *testing.T) {
			c := newCache(t, filepath.Join(tmp, "layers-"+strconv.FormatBool(buffered)), Options{Grace: -1, BufferedIO: buffered})
			ctx := context.Background()
			if _, ok, err := c.CachedExtents(ctx, "k", func(int64, int64) {}); ok || err != nil {
				t.Fatalf("unmounted layer: %v %v", ok, err)
			}
			dir, rel, err := c.Acquire(ctx, "k", src)
			if err != nil {
				t.Fatal(err)
			}
			defer rel()
			// Start cold: the files' and the blob's pages.
			for _, p := range []string{filepath.Join(dir, "a/one"), filepath.Join(dir, "a/two"), src} {
				testutil.DropFromCache(t, p)
			}
			f, err := os.Open(filepath.Join(dir, "a/one"))
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
				t.Fatal(err)
			}
			page := make([]byte, pageSize)
			if _, err := f.ReadAt(page, 64<<10); err != nil { // one page, no readahead
				t.Fatal(err)
			}
			f.Close()
			manyDir := filepath.Join(dir, "many")
			testutil.DropFromCache(t, manyDir)

			var marks [][2]int64
			pc, ok, err := c.CachedExtents(ctx, "k", func(off, n int64) { marks = append(marks, [2]int64{off, n}) })
			if err != nil || !ok {
				t.Fatalf("walk: %v %v", ok, err)
			}
			if pc.Files != int64(len(files)) || pc.Dirs != 3 || pc.Unmapped != 0 {
				t.Fatalf("walked %+v", pc)
			}
			// The one page of a/one read, plus directory pages the
			// lookups needed before the walk (the root's and a/'s).
			var got []byte
			dataMarks := 0
			for _, m := range marks {
				chunk := blobBytes[m[0] : m[0]+m[1]]
				if bytes.Equal(chunk, files["a/one"][64<<10:64<<10+pageSize]) {
					dataMarks++
					got = chunk
				}
			}
			if dataMarks != 1 || got == nil {
				t.Fatalf("the page read is not among the marks %v (page cache %+v)", marks, pc)
			}
			if pc.Bytes < pageSize || pc.Bytes > 4*pageSize {
				t.Fatalf("page cache of the files %d bytes, want one data page and a few directory pages (marks %v)", pc.Bytes, marks)
			}
			// The walk read many/ (300 entries) but did not keep it.
			if n := cachedBytes(t, manyDir); n != 0 {
				t.Fatalf("walk left %d bytes of a directory it read in the page cache", n)
			}
		})
	}
}

package image

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/warrenrl/warren/internal/testutil"
)

// The residency of a mounted layer counts what was read through it once,
// with and without direct I/O, and a measurement does not count the
// metadata its own walk read.
func TestResidencyCountsReadsOnce(t *testing.T) {
	files := map[string]string{}
	for i := range 8 {
		files["d/f"+strconv.Itoa(i)] = string(bytes.Repeat([]byte{byte('a' + i)}, 1<<20))
	}
	for i := range 200 {
		files["small/s"+strconv.Itoa(i)] = strconv.Itoa(i)
	}
	for _, buffered := range []bool{false, true} {
		t.Run("buffered="+strconv.FormatBool(buffered), func(t *testing.T) {
			s := newEROFSStore(t, func(o *Options) { o.BufferedIO = buffered })
			img, err := s.ImportTar(ctx, "img", bytes.NewReader(layerTarball(t, files)))
			if err != nil {
				t.Fatal(err)
			}
			d := img.Layers[0]
			dirs, release, err := s.LayerDirs(ctx, img)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			bp, _ := s.BlobPath(d)
			testutil.DropFromCache(t, bp)
			r0, err := s.Residency(ctx, d)
			if err != nil || !r0.Mounted {
				t.Fatalf("cold: %+v %v", r0, err)
			}
			st, err := s.Stats(ctx, img.Layers)
			if err != nil || len(st) != 1 || st[0].DirectIO == buffered {
				t.Fatalf("stats %+v %v (buffered %v)", st, err, buffered)
			}

			f, err := os.Open(filepath.Join(dirs[0], "d/f3"))
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 2<<20)
			n, _ := f.Read(b)
			f.Close()
			if n != 1<<20 || !bytes.Equal(b[:n], []byte(files["d/f3"])) {
				t.Fatalf("read %d bytes", n)
			}
			r1, err := s.Residency(ctx, d)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("cold %+v, after reading 1 MiB %+v", r0, r1)
			if r1.Resident < r0.Resident+1<<20 || r1.Files < 1<<20 || r1.Resident > r1.Size {
				t.Fatalf("1 MiB read, not counted: %+v -> %+v", r0, r1)
			}
			if buffered {
				// The MiB is in both caches and counts once.
				if r1.Blob < 1<<20 || r1.Resident > r1.Blob+r1.Files-1<<20+64<<10 {
					t.Fatalf("counted twice: %+v", r1)
				}
			} else {
				// Direct I/O: the blob's cache holds metadata only.
				if r1.Blob > 128<<10 || r1.Resident > r1.Blob+r1.Files {
					t.Fatalf("direct I/O: %+v", r1)
				}
			}
			// Measuring again, with nothing read meanwhile, finds the same.
			r2, err := s.Residency(ctx, d)
			if err != nil || r2 != r1 {
				t.Fatalf("second measurement %+v, first %+v (%v)", r2, r1, err)
			}
		})
	}
}

package tarx

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/testutil"
)

// sparseTree makes files with holes in every place a hole can be, a file
// with none, and one that is only a hole.
func sparseTree(t *testing.T) (string, map[string]int64) {
	t.Helper()
	dir := t.TempDir()
	const mib = 1 << 20
	write := func(name string, size int64, at ...int64) {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, off := range at {
			if _, err := f.WriteAt([]byte("data at "+name), off); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
	}
	write("trailing-hole", 64*mib, 0, 8*mib)
	write("leading-hole", 64*mib+9, 64*mib-8)
	write("only-hole", 16*mib)
	dense := make([]byte, 300<<10)
	rand.Read(dense)
	if err := os.WriteFile(filepath.Join(dir, "dense"), dense, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("sub/nested", 32*mib, 4*mib)
	long := "sub/" + strings.Repeat("long-name-", 12)
	write(long, 9<<30, 5<<30) // past the 8 GiB a ustar size field holds
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "only-hole"), &st); err != nil || st.Blocks != 0 {
		t.Skipf("the test directory's filesystem does not keep holes (%d blocks)", st.Blocks)
	}
	return dir, map[string]int64{"trailing-hole": 64 * mib, "leading-hole": 64*mib + 9, "only-hole": 16 * mib,
		"dense": 300 << 10, "sub/nested": 32 * mib, long: 9 << 30}
}

func allocated(t *testing.T, p string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// TestSparseArchive: with Sparse, holes cost nothing on the wire, and Go's
// archive/tar, GNU tar and Python's tarfile read back every file whole.
func TestSparseArchive(t *testing.T) {
	dir, want := sparseTree(t)
	var buf bytes.Buffer
	if err := CreateWith(context.Background(), dir, &buf, "/", CreateOptions{Sparse: true}); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 400<<10 {
		t.Fatalf("sparse archive of 9 GiB of mostly holes is %d bytes", buf.Len())
	}
	var dense countWriter
	if err := CreateWith(context.Background(), dir, &dense, "/sub/nested", CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if dense.n < 32<<20 {
		t.Fatalf("the default archive of a 32 MiB file is %d bytes: holes must be written out without Sparse", dense.n)
	}
	t.Logf("archive: %d bytes sparse", buf.Len())

	// Go's reader.
	seen := map[string]bool{}
	for h, tr := range testutil.TarEntries(t, bytes.NewReader(buf.Bytes())) {
		if h.Typeflag != tar.TypeReg {
			continue
		}
		size, ok := want[h.Name]
		if !ok || h.Size != size {
			t.Fatalf("entry %q of %d bytes, want one of %v", h.Name, h.Size, want)
		}
		seen[h.Name] = true
		fi, err := os.Stat(filepath.Join(dir, h.Name))
		if err != nil || !h.ModTime.Equal(fi.ModTime()) || os.FileMode(h.Mode) != fi.Mode().Perm() {
			t.Fatalf("%s: mtime %v mode %o, want %v", h.Name, h.ModTime, h.Mode, fi)
		}
		if h.Size < 1<<30 {
			sameContent(t, h.Name, tr, filepath.Join(dir, h.Name))
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("read %v, want %v", seen, want)
	}

	// GNU tar and Python's tarfile, extracting to disk.
	extractors := map[string][]string{
		"tar":    {"tar", "-xf", "-", "-C"},
		"python": {"python3", "-c", "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|').extractall(sys.argv[1])"},
	}
	for name, argv := range extractors {
		t.Run(name, func(t *testing.T) {
			if _, err := exec.LookPath(argv[0]); err != nil {
				t.Skipf("%s not installed", argv[0])
			}
			out := t.TempDir()
			cmd := exec.Command(argv[0], append(argv[1:], out)...)
			cmd.Stdin = bytes.NewReader(buf.Bytes())
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v: %v\n%s", argv, err, b)
			}
			for f, size := range want {
				p := filepath.Join(out, f)
				fi, err := os.Stat(p)
				if err != nil || fi.Size() != size {
					t.Fatalf("%s: %v %v, want %d bytes", f, fi, err, size)
				}
				g, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				if size < 1<<30 {
					sameContent(t, f, g, filepath.Join(dir, f))
				} else if got := allocated(t, p); got > 1<<20 {
					t.Errorf("%s: %d bytes of disk, want its holes kept", f, got)
				}
				g.Close()
			}
			if _, err := os.Stat(filepath.Join(out, "GNUSparseFile.0")); err == nil {
				t.Fatal("the extractor wrote the entries under their stand-in names")
			}
		})
	}
}

func sameContent(t *testing.T, name string, r io.Reader, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := 0; ; off += len(a) {
		na, erra := io.ReadFull(r, a)
		nb, _ := io.ReadFull(f, b)
		if na != nb || !bytes.Equal(a[:na], b[:nb]) {
			t.Fatalf("%s differs in the MiB at %d (%d against %d bytes)", name, off, na, nb)
		}
		if erra != nil {
			return
		}
	}
}

// TestSparseSegments: the map is the data, with a zero-length last
// segment for a trailing hole; a file without holes gets none.
func TestSparseSegments(t *testing.T) {
	dir, _ := sparseTree(t)
	seg := func(name string) []segment {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fi, _ := f.Stat()
		return dataSegments(int(f.Fd()), fi.Size())
	}
	if s := seg("dense"); s != nil {
		t.Errorf("dense: %v", s)
	}
	if s := seg("only-hole"); len(s) != 1 || s[0] != (segment{16 << 20, 0}) {
		t.Errorf("only-hole: %v", s)
	}
	s := seg("trailing-hole")
	if len(s) != 3 || s[0].off != 0 || s[1].off > 8<<20 || s[1].off+s[1].n < 8<<20 || s[2] != (segment{64 << 20, 0}) {
		t.Errorf("trailing-hole: %v", s)
	}
	s = seg("leading-hole")
	if len(s) != 1 || s[0].off > 64<<20-8 || s[0].off+s[0].n != 64<<20+9 {
		t.Errorf("leading-hole: %v", s)
	}
}

// TestExtractKeepsHoles: Extract skips all-zero blocks, so a sparse
// archive's files, and zeros that a plain archive spells out, land as
// holes: what a sandbox's disk limit counts is the data.
func TestExtractKeepsHoles(t *testing.T) {
	dir, want := sparseTree(t)
	zeros := filepath.Join(dir, "zeros-inside")
	b := make([]byte, 3<<20)
	copy(b, "head")
	copy(b[len(b)-4:], "tail")
	if err := os.WriteFile(zeros, b, 0o644); err != nil {
		t.Fatal(err)
	}
	want["zeros-inside"] = 3 << 20
	for _, sparse := range []bool{true, false} {
		var buf bytes.Buffer
		src := "/"
		if !sparse {
			src = "/zeros-inside" // a plain archive of the whole tree would be 9 GiB
		}
		if err := CreateWith(context.Background(), dir, &buf, src, CreateOptions{Sparse: sparse}); err != nil {
			t.Fatal(err)
		}
		out := t.TempDir()
		if _, err := Extract(context.Background(), out, &buf, Options{}); err != nil {
			t.Fatal(err)
		}
		for f, size := range want {
			if !sparse && f != "zeros-inside" {
				continue
			}
			p := filepath.Join(out, f)
			fi, err := os.Stat(p)
			if err != nil || fi.Size() != size {
				t.Fatalf("sparse %v: %s: %v %v, want %d bytes", sparse, f, fi, err, size)
			}
			was := allocated(t, filepath.Join(dir, f))
			if f == "zeros-inside" {
				was = 0 // written out at its source; two blocks of data
			}
			if got := allocated(t, p); got > was+8<<10 {
				t.Errorf("sparse %v: %s takes %d bytes of disk, want at most %d", sparse, f, got, was+8<<10)
			}
			if size < 1<<30 {
				g, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				sameContent(t, f, g, filepath.Join(dir, f))
				g.Close()
			}
		}
	}
}

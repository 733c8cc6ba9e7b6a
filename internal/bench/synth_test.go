package bench

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/testutil"
)

// treeDigest hashes paths, modes, mtimes and contents below dir.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %v %d\n", rel, fi.Mode(), fi.ModTime().Unix())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestGenerateSynth(t *testing.T) {
	ctx := context.Background()
	const sizeMB = 16
	a, err := GenerateSynth(ctx, filepath.Join(t.TempDir(), "a"), sizeMB)
	if err != nil {
		t.Fatal(err)
	}
	b, err := GenerateSynth(ctx, filepath.Join(t.TempDir(), "b"), sizeMB)
	if err != nil {
		t.Fatal(err)
	}
	if treeDigest(t, a.Dir) != treeDigest(t, b.Dir) {
		t.Fatal("two generations of the same size differ")
	}
	if lo, hi := int64(sizeMB)<<20*9/10, int64(sizeMB)<<20*12/10; a.Bytes < lo || a.Bytes > hi {
		t.Errorf("generated %d bytes for %d MiB", a.Bytes, sizeMB)
	}
	if a.WorkspaceB+a.ToolkitB != a.Bytes || a.TextFiles+a.BinaryFiles != a.Files {
		t.Errorf("inconsistent totals: %+v", a)
	}
	// Every file the tool calls name exists.
	need := []string{
		"workspace/workspace/repo/README.md",
		"workspace/workspace/repo/scripts/build.sh",
		"workspace/workspace/repo/scripts/run_tests.sh",
		"workspace/workspace/repo/scripts/check.py",
		"workspace/workspace/repo/src/pkg01/file0000.go",
		"workspace/workspace/repo/src/pkg02/file0001.go",
		"workspace/workspace/repo/src/pkg03/file0009.go",
		"toolkit/opt/toolkit/bin/cc1",
		"toolkit/opt/toolkit/lib/libcore.so",
	}
	for _, n := range need {
		if _, err := os.Stat(filepath.Join(a.Dir, n)); err != nil {
			t.Error(err)
		}
	}
	for _, tc := range toolCalls {
		if tc.Kind == "read" && strings.HasPrefix(tc.Path, repoDir+"/src/") {
			if _, err := os.Stat(filepath.Join(a.WorkspaceDir, tc.Path)); err != nil {
				t.Errorf("tool call %q: %v", tc.Name, err)
			}
		}
	}
	src, err := os.ReadFile(filepath.Join(a.Dir, "workspace/workspace/repo/src/pkg02/file0001.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), "TODO") {
		t.Error("the edited file has no TODO: the edit tool call would fail")
	}

	// The tarball holds both trees under the layers' paths.
	tgz := filepath.Join(t.TempDir(), "c.tar.gz")
	n, err := a.WriteTarGz(ctx, tgz)
	if err != nil {
		t.Fatal(err)
	}
	if n <= 0 || n >= a.Bytes {
		t.Errorf("tar.gz of %d bytes for %d bytes of content", n, a.Bytes)
	}
	f, err := os.Open(tgz)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files, total := 0, int64(0)
	seen := map[string]bool{}
	for h := range testutil.TarEntries(t, zr) {
		seen[h.Name] = true
		if h.Typeflag == tar.TypeReg {
			files++
			total += h.Size
		}
	}
	if files != a.Files || total != a.Bytes {
		t.Errorf("tar.gz has %d files, %d bytes; want %d, %d", files, total, a.Files, a.Bytes)
	}
	for _, want := range []string{"workspace/repo/README.md", "opt/toolkit/bin/cc1", "opt/"} {
		if !seen[want] {
			t.Errorf("tar.gz lacks %s", want)
		}
	}
}

func TestParseSectorsWritten(t *testing.T) {
	const stats = `   7       0 loop0 570 35 35258 29 2086 384 2945524 4042 0 1400 4765 0 0 0 0 243 692
 254       0 vda 569148 259818 49504682 188029 994971 865320 80071432 813532 0 176940 1091413 821521 519 76710768 67177 178136 22673
`
	got, err := parseSectorsWritten([]byte(stats), "vda")
	if err != nil || got != 80071432 {
		t.Errorf("vda: %d, %v", got, err)
	}
	if got, err := parseSectorsWritten([]byte(stats), "loop0"); err != nil || got != 2945524 {
		t.Errorf("loop0: %d, %v", got, err)
	}
	if _, err := parseSectorsWritten([]byte(stats), "sda"); err == nil {
		t.Error("a missing device should be an error")
	}
	if got, err := parseDiskstat([]byte(stats), "loop0", 5); err != nil || got != 35258 {
		t.Errorf("loop0 sectors read: %d, %v", got, err)
	}
}

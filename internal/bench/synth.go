package bench

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The synthetic workspace and toolkit of `bench layers` and `bench
// ondemand`: a deterministic tree (same size, same bytes, same mtimes for
// the same size) in two layer directories, plus one tarball of both.
//
//	<dir>/workspace/workspace/repo/...   the "workspace" layer's root
//	<dir>/toolkit/opt/toolkit/...        the "toolkit" layer's root
//
// The workspace is 40% of the size: a source tree (75%: many small text
// files of 1-12 KiB in 64 packages, scripts) and test fixtures (25%: six
// binaries). The toolkit is 60%: sixteen "compiler" and "library"
// binaries (90%) and small headers and docs (10%). Binaries are half
// random, half repetitive 4 KiB blocks, so gzip shrinks them about as much
// as real ones; text compresses about 4x.

// synthPackages is the number of source packages of the workspace.
const synthPackages = 64

// synthMtime is the modification time of every generated file.
var synthMtime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// Synth describes a generated tree.
type Synth struct {
	Dir          string // parent of the two layer roots
	WorkspaceDir string // layer root holding workspace/repo
	ToolkitDir   string // layer root holding opt/toolkit
	Bytes        int64  // file content bytes
	Files        int
	TextFiles    int
	BinaryFiles  int
	WorkspaceB   int64
	ToolkitB     int64
}

// GenerateSynth writes a tree of about sizeMB MiB below dir (which must
// not exist or be empty).
func GenerateSynth(ctx context.Context, dir string, sizeMB int) (*Synth, error) {
	if sizeMB < 1 {
		return nil, fmt.Errorf("size must be at least 1 MiB")
	}
	s := &Synth{Dir: dir, WorkspaceDir: filepath.Join(dir, "workspace"), ToolkitDir: filepath.Join(dir, "toolkit")}
	total := int64(sizeMB) << 20
	wsBytes := total * 40 / 100
	tkBytes := total - wsBytes
	repo := filepath.Join(s.WorkspaceDir, "workspace", "repo")
	tk := filepath.Join(s.ToolkitDir, "opt", "toolkit")

	g := &synthGen{s: s}
	// Workspace: fixed files the tool calls use, then sources, fixtures.
	for name, body := range synthScripts {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := g.write(filepath.Join(repo, name), []byte(body), mode, true); err != nil {
			return nil, err
		}
	}
	wsText := wsBytes*3/4 - g.bytes
	// At least 10 files per package: the tool calls name a few of them.
	minFiles := synthPackages * 10
	for k := 0; g.budget(wsText) || k < minFiles; k++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pkg := k % synthPackages
		rng := rand.New(rand.NewPCG(uint64(k), 0x5eed))
		body := goSource(rng, pkg, k/synthPackages, 1024+rng.IntN(11*1024))
		p := filepath.Join(repo, "src", fmt.Sprintf("pkg%02d", pkg), fmt.Sprintf("file%04d.go", k/synthPackages))
		if err := g.write(p, body, 0o644, true); err != nil {
			return nil, err
		}
	}
	wsBin := wsBytes - g.bytes
	for i := 0; i < 6; i++ {
		p := filepath.Join(repo, "testdata", fmt.Sprintf("fixture%02d.bin", i))
		if err := g.binary(p, uint64(1000+i), max(wsBin/6, 4096), 0o644); err != nil {
			return nil, err
		}
	}
	s.WorkspaceB = g.bytes

	// Toolkit.
	tkBin := tkBytes * 9 / 10
	names := []string{"bin/cc1", "lib/libcore.so"}
	for i := len(names); i < 16; i++ {
		if i%2 == 0 {
			names = append(names, fmt.Sprintf("bin/tool%02d", i))
		} else {
			names = append(names, fmt.Sprintf("lib/lib%02d.so", i))
		}
	}
	for i, n := range names {
		mode := os.FileMode(0o644)
		if strings.HasPrefix(n, "bin/") {
			mode = 0o755
		}
		if err := g.binary(filepath.Join(tk, n), uint64(2000+i), max(tkBin/16, 4096), mode); err != nil {
			return nil, err
		}
	}
	for k := 0; g.budget(s.WorkspaceB+tkBytes) || k < 64; k++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rng := rand.New(rand.NewPCG(uint64(k), 0x700c))
		var p string
		if k%3 == 2 {
			p = filepath.Join(tk, "share", "doc", fmt.Sprintf("topic%02d", k%16), fmt.Sprintf("page%04d.txt", k))
		} else {
			p = filepath.Join(tk, "include", fmt.Sprintf("mod%02d", k%32), fmt.Sprintf("api%04d.h", k))
		}
		if err := g.write(p, goSource(rng, k%32, k, 512+rng.IntN(6*1024)), 0o644, true); err != nil {
			return nil, err
		}
	}
	s.ToolkitB = g.bytes - s.WorkspaceB
	s.Bytes = g.bytes
	// The whole tree, its top directory included: two generations must
	// be identical whatever second each was made in.
	if err := fixDirTimes(s.Dir); err != nil {
		return nil, err
	}
	return s, nil
}

type synthGen struct {
	s     *Synth
	bytes int64
}

// budget reports whether fewer than want bytes were written so far.
func (g *synthGen) budget(want int64) bool { return g.bytes < want }

func (g *synthGen) write(p string, body []byte, mode os.FileMode, text bool) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p, body, mode); err != nil {
		return err
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	if err := os.Chtimes(p, synthMtime, synthMtime); err != nil {
		return err
	}
	g.bytes += int64(len(body))
	g.s.Files++
	if text {
		g.s.TextFiles++
	} else {
		g.s.BinaryFiles++
	}
	return nil
}

// binary writes size bytes of 4 KiB blocks, each either random or a short
// repeated pattern (half of each, in a random order).
func (g *synthGen) binary(p string, seed uint64, size int64, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 0xb1))
	cc := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 'w', 'a', 'r', 'r', 'e', 'n'})
	w := bufio.NewWriterSize(f, 1<<20)
	block := make([]byte, 4096)
	for left := size; left > 0; left -= int64(len(block)) {
		b := block[:min(int64(len(block)), left)]
		if rng.IntN(2) == 0 {
			_, _ = cc.Read(b)
		} else {
			pat := []byte(fmt.Sprintf("\x7fELF.sym_%08x.text.", rng.Uint32()))
			for i := range b {
				b[i] = pat[i%len(pat)]
			}
		}
		if _, err := w.Write(b); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	if err := os.Chtimes(p, synthMtime, synthMtime); err != nil {
		return err
	}
	g.bytes += size
	g.s.Files++
	g.s.BinaryFiles++
	return nil
}

// fixDirTimes sets the mtime of every directory below root (root
// included) to synthMtime, deepest first.
func fixDirTimes(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := os.Chtimes(d, synthMtime, synthMtime); err != nil {
			return err
		}
	}
	return nil
}

var synthWords = strings.Fields(`request response handler buffer cache index token parse
encode decode stream reader writer config option session worker queue batch
record field value schema table column cursor commit rollback snapshot layer
image mount device socket packet frame header payload digest checksum retry
timeout deadline cancel signal process thread memory page block inode entry`)

func ident(rng *rand.Rand, upper bool) string {
	a := synthWords[rng.IntN(len(synthWords))]
	b := synthWords[rng.IntN(len(synthWords))]
	s := a + strings.ToUpper(b[:1]) + b[1:]
	if upper {
		s = strings.ToUpper(s[:1]) + s[1:]
	}
	return s
}

// goSource returns about size bytes of Go-like source. Every file has a
// TODO and at least one function with a return.
func goSource(rng *rand.Rand, pkg, file, size int) []byte {
	var b strings.Builder
	b.Grow(size + 512)
	fmt.Fprintf(&b, "// Code generated for warren bench; DO NOT EDIT.\n// Package pkg%02d, file %04d.\n// TODO(gen): split this file.\n\npackage pkg%02d\n\nimport (\n\t\"errors\"\n\t\"fmt\"\n)\n\n", pkg, file, pkg)
	for b.Len() < size {
		name := ident(rng, true)
		if rng.IntN(4) == 0 {
			name = "Handle" + name
		}
		fmt.Fprintf(&b, "// %s %ss the %s of a %s.\nfunc %s(%s int, %s string) (int, error) {\n",
			name, synthWords[rng.IntN(len(synthWords))], ident(rng, false), ident(rng, false), name, ident(rng, false), ident(rng, false))
		for n := 2 + rng.IntN(8); n > 0; n-- {
			switch rng.IntN(5) {
			case 0:
				fmt.Fprintf(&b, "\tif %s > %d {\n\t\treturn 0, errors.New(%q)\n\t}\n", ident(rng, false), rng.IntN(1000), ident(rng, false)+" too large")
			case 1:
				fmt.Fprintf(&b, "\t// TODO: handle %s when %s is empty\n", ident(rng, false), ident(rng, false))
			case 2:
				fmt.Fprintf(&b, "\t%s := fmt.Sprintf(\"%%s-%%d\", %q, %d)\n\t_ = %s\n", ident(rng, false), ident(rng, false), rng.IntN(1<<16), ident(rng, false))
			default:
				fmt.Fprintf(&b, "\tfor i := 0; i < %d; i++ {\n\t\t%s += i * %d\n\t}\n", rng.IntN(64), ident(rng, false), rng.IntN(97))
			}
		}
		fmt.Fprintf(&b, "\treturn %d, nil\n}\n\n", rng.IntN(1<<20))
	}
	return []byte(b.String())
}

// synthScripts are the workspace's fixed files, relative to repo.
var synthScripts = map[string]string{
	"README.md": `# repo

A synthetic project for warren bench: sources in src/pkgNN, fixtures in
testdata, a toolchain in /opt/toolkit. Build with scripts/build.sh, test
with scripts/run_tests.sh.
`,
	"scripts/build.sh": `#!/bin/sh
# "Compile" two packages: hash the sources, pack them into an object,
# read the compiler and link against a slice of the core library.
set -e
cd /workspace/repo
mkdir -p /workspace/build
md5sum src/pkg00/*.go src/pkg01/*.go > /workspace/build/manifest.txt
cat src/pkg00/*.go src/pkg01/*.go | gzip -1 > /workspace/build/app.o
md5sum < /opt/toolkit/bin/cc1 > /workspace/build/toolchain.sum
head -c 1048576 /opt/toolkit/lib/libcore.so > /workspace/build/libcore.a
wc -l < /workspace/build/manifest.txt
`,
	"scripts/run_tests.sh": `#!/bin/sh
# "Test" one package: a shell loop over ten files, and a Python checker
# where the image has python3.
cd /workspace/repo
pass=0
fail=0
for f in src/pkg03/file000*.go; do
	n=$(grep -c return "$f")
	if [ "$n" -gt 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); fi
done
if command -v python3 >/dev/null 2>&1; then
	python3 scripts/check.py src/pkg03 > /workspace/build/report.json
fi
echo "PASS $pass FAIL $fail"
`,
	"scripts/check.py": `import collections, hashlib, json, os, re, sys

root = sys.argv[1]
funcs = collections.Counter()
digest = hashlib.sha256()
for name in sorted(os.listdir(root))[:40]:
    with open(os.path.join(root, name), "rb") as f:
        data = f.read()
    digest.update(data)
    funcs[name] = len(re.findall(rb"^func ", data, re.M))
json.dump({"files": len(funcs), "funcs": sum(funcs.values()), "sha256": digest.hexdigest()}, sys.stdout)
`,
}

// WriteTarGz packs the two layer roots of s into one gzip-compressed
// tarball at path (default compression level, like tar czf), with the
// same paths as the layers: workspace/... and opt/toolkit/....
func (s *Synth) WriteTarGz(ctx context.Context, path string) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	zw := gzip.NewWriter(bw)
	tw := tar.NewWriter(zw)
	for _, root := range []string{s.WorkspaceDir, s.ToolkitDir} {
		if err := tarTree(ctx, tw, root); err != nil {
			f.Close()
			return 0, err
		}
	}
	err = tw.Close()
	if err == nil {
		err = zw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// tarTree writes the tree below root (root itself excluded) in lexical
// order, owned by root:root.
func tarTree(ctx context.Context, tw *tar.Writer, root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.Format = tar.FormatPAX
		hdr.ModTime = fi.ModTime()
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, in)
		in.Close()
		return err
	})
}

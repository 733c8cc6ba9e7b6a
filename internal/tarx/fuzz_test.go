package tarx

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzExtractStaysInRoot builds archives from a small alphabet of
// dangerous names and link targets and checks that extraction never
// creates or changes anything outside the root, whatever it returns.
func FuzzExtractStaysInRoot(f *testing.F) {
	f.Add([]byte{0x31, 0x02, 0x10, 0x23, 0x40})
	f.Add([]byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0})
	f.Add([]byte("symlink then write through it"))
	f.Add([]byte{2, 5, 6, 0, 5, 1, 3, 7, 7, 1})
	f.Fuzz(func(t *testing.T, prog []byte) {
		parent := t.TempDir()
		root := filepath.Join(parent, "root")
		outside := filepath.Join(parent, "outside")
		os.Mkdir(root, 0o755)
		os.Mkdir(outside, 0o755)
		victim := filepath.Join(outside, "victim")
		os.WriteFile(victim, []byte("v"), 0o644)

		parts := []string{"a", "b", "..", "../..", "/", ".", "outside", "victim", "root", outside, parent}
		name := func(b byte) string {
			var ps []string
			for i := 0; i < 1+int(b>>6); i++ {
				ps = append(ps, parts[int(b+byte(i)*7)%len(parts)])
			}
			return strings.Join(ps, "/")
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for i := 0; i+1 < len(prog) && i < 64; i += 2 {
			op, arg := prog[i], prog[i+1]
			hdr := &tar.Header{Name: name(op), Mode: 0o755}
			switch op % 4 {
			case 0:
				hdr.Typeflag = tar.TypeReg
				hdr.Size = 1
			case 1:
				hdr.Typeflag = tar.TypeDir
			case 2:
				hdr.Typeflag = tar.TypeSymlink
				hdr.Linkname = name(arg)
			case 3:
				hdr.Typeflag = tar.TypeLink
				hdr.Linkname = name(arg)
			}
			if err := tw.WriteHeader(hdr); err != nil {
				continue
			}
			if hdr.Size == 1 {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		Extract(context.Background(), root, bytes.NewReader(buf.Bytes()), Options{})

		ents, _ := os.ReadDir(parent)
		if len(ents) != 2 {
			t.Fatalf("parent now holds %v", ents)
		}
		ents, _ = os.ReadDir(outside)
		if len(ents) != 1 {
			t.Fatalf("outside now holds %v", ents)
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "v" {
			t.Fatalf("victim changed: %q %v", b, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(victim, &st); err != nil || st.Mode&0o7777 != 0o644 || st.Nlink != 1 {
			t.Fatalf("victim changed: mode %o, %d links, %v", st.Mode, st.Nlink, err)
		}
	})
}

package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// fakeUpper builds what overlayfs leaves in an upper directory: files, a
// whiteout (0/0 character device) and an opaque directory.
func fakeUpper(t *testing.T) string {
	t.Helper()
	up := filepath.Join(t.TempDir(), "upper")
	for _, d := range []string{"etc", "opq/sub", "plain"} {
		if err := os.MkdirAll(filepath.Join(up, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, c := range map[string]string{"etc/passwd": "root\n", "opq/new": "n", "plain/f": "f"} {
		if err := os.WriteFile(filepath.Join(up, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, wh := range []string{"etc/group", "gone"} {
		if err := unix.Mknod(filepath.Join(up, wh), unix.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setxattr(filepath.Join(up, "opq"), overlayOpaque, []byte("y"), 0); err != nil {
		t.Skipf("no trusted xattrs on %s: %v", up, err)
	}
	return up
}

func TestCommitUpper(t *testing.T) {
	s := newEROFSStore(t)
	ctx := context.Background()
	up := fakeUpper(t)
	nl, err := s.CommitUpper(ctx, "snap", up)
	if err != nil {
		t.Fatal(err)
	}
	if nl.Name != "snap" || nl.Files == 0 {
		t.Fatalf("layer %+v", nl)
	}
	dirs, release, err := s.LayerDirs(ctx, Image{Name: "x", Layers: []string{nl.Digest}})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	root := dirs[0]
	// Whiteouts are overlayfs whiteouts again, opaque directories opaque.
	for _, wh := range []string{"etc/group", "gone"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, wh), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Fatalf("%s: %+v %v", wh, st, err)
		}
	}
	var buf [4]byte
	if n, err := unix.Lgetxattr(filepath.Join(root, "opq"), overlayOpaque, buf[:]); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque xattr: %q %v", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(root, "plain"), overlayOpaque, buf[:]); err == nil {
		t.Fatal("plain directory is opaque")
	}
	if b, err := os.ReadFile(filepath.Join(root, "opq/new")); err != nil || string(b) != "n" {
		t.Fatalf("opq/new: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(root, "opq/sub")); err != nil {
		t.Fatal(err)
	}
	// The same tree gives the same blob.
	nl2, err := s.CommitUpper(ctx, "snap2", up)
	if err != nil || nl2.Digest != nl.Digest {
		t.Fatalf("recommit: %+v %v", nl2, err)
	}
}

func TestCommitUpperRefuses(t *testing.T) {
	s := newEROFSStore(t)
	ctx := context.Background()
	up := fakeUpper(t)
	if err := os.WriteFile(filepath.Join(up, "plain", ".wh.x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := s.CommitUpper(ctx, "bad", up)
	if errdefs.CategoryOf(err) != errdefs.Invalid || !strings.Contains(err.Error(), "/plain/.wh.x") {
		t.Fatalf("a .wh. file: %v", err)
	}
	os.Remove(filepath.Join(up, "plain", ".wh.x"))
	if err := unix.Setxattr(filepath.Join(up, "plain"), overlayRedirect, []byte("/elsewhere"), 0); err != nil {
		t.Fatal(err)
	}
	_, err = s.CommitUpper(ctx, "bad", up)
	if errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "redirect_dir") {
		t.Fatalf("a redirected directory: %v", err)
	}
	_, err = s.CommitUpper(ctx, "bad", filepath.Join(up, "nope"))
	if errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("missing upper: %v", err)
	}
	if _, err := s.GetLayer("bad"); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("a failed commit left a layer: %v", err)
	}
	noLeftovers(t, s)
}

package image

import (
	"bytes"
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
	nl, err := s.CommitUpper(ctx, "snap", up, CommitOptions{})
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
	nl2, err := s.CommitUpper(ctx, "snap2", up, CommitOptions{})
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
	_, err := s.CommitUpper(ctx, "bad", up, CommitOptions{})
	if errdefs.CategoryOf(err) != errdefs.Invalid || !strings.Contains(err.Error(), "/plain/.wh.x") {
		t.Fatalf("a .wh. file: %v", err)
	}
	os.Remove(filepath.Join(up, "plain", ".wh.x"))
	if err := unix.Setxattr(filepath.Join(up, "plain"), overlayRedirect, []byte("/elsewhere"), 0); err != nil {
		t.Fatal(err)
	}
	_, err = s.CommitUpper(ctx, "bad", up, CommitOptions{})
	if errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "redirect_dir") {
		t.Fatalf("a redirected directory: %v", err)
	}
	_, err = s.CommitUpper(ctx, "bad", filepath.Join(up, "nope"), CommitOptions{})
	if errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("missing upper: %v", err)
	}
	if _, err := s.GetLayer("bad"); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("a failed commit left a layer: %v", err)
	}
	noLeftovers(t, s)
}

// capNetBindService is a security.capability xattr (VFS_CAP_REVISION_2,
// effective) granting CAP_NET_BIND_SERVICE (bit 10).
var capNetBindService = []byte{0x01, 0, 0, 0x02, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// TestCommitStripsSetuid: a commit drops setuid/setgid bits of files and
// security.capability xattrs unless asked to keep them, keeps a directory's
// setgid bit, and records both choices and the count in the layer record.
func TestCommitStripsSetuid(t *testing.T) {
	s := newEROFSStore(t)
	ctx := context.Background()
	up := fakeUpper(t)
	for p, mode := range map[string]os.FileMode{"suid": 0o755 | os.ModeSetuid, "sgid": 0o755 | os.ModeSetgid, "capped": 0o755} {
		f := filepath.Join(up, p)
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(up, "plain"), 0o755|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(filepath.Join(up, "capped"), "security.capability", capNetBindService, 0); err != nil {
		t.Skipf("cannot set file capabilities on %s: %v", up, err)
	}
	for _, keep := range []bool{false, true} {
		name := map[bool]string{false: "stripped", true: "kept"}[keep]
		nl, err := s.CommitUpper(ctx, name, up, CommitOptions{KeepSetuid: keep})
		if err != nil {
			t.Fatal(err)
		}
		wantN := int64(3)
		if keep {
			wantN = 0
		}
		if nl.SetuidKept != keep || nl.SetuidStripped != wantN {
			t.Errorf("keep=%v: record %+v, want setuid_kept %v, setuid_stripped %d", keep, nl, keep, wantN)
		}
		if rec, err := s.GetLayer(name); err != nil || rec.SetuidKept != keep || rec.SetuidStripped != wantN {
			t.Errorf("keep=%v: stored record %+v %v", keep, rec, err)
		}
		dirs, release, err := s.LayerDirs(ctx, Image{Name: "x", Layers: []string{nl.Digest}})
		if err != nil {
			t.Fatal(err)
		}
		root := dirs[0]
		for p, want := range map[string]os.FileMode{"suid": os.ModeSetuid, "sgid": os.ModeSetgid, "plain": os.ModeSetgid} {
			fi, err := os.Lstat(filepath.Join(root, p))
			if err != nil {
				t.Fatal(err)
			}
			if p != "plain" && !keep {
				want = 0
			}
			if got := fi.Mode() & (os.ModeSetuid | os.ModeSetgid); got != want {
				t.Errorf("keep=%v: %s has mode %v, want setuid/setgid bits %v", keep, p, fi.Mode(), want)
			}
		}
		var buf [64]byte
		n, err := unix.Lgetxattr(filepath.Join(root, "capped"), "security.capability", buf[:])
		if keep && (err != nil || !bytes.Equal(buf[:n], capNetBindService)) {
			t.Errorf("keep=true: capability %x %v, want %x", buf[:max(n, 0)], err, capNetBindService)
		}
		if !keep && err != unix.ENODATA {
			t.Errorf("keep=false: capability %x %v, want none (ENODATA)", buf[:max(n, 0)], err)
		}
		release()
	}
}

// TestCommitDropsUserOverlayXattrs: user.overlay.* xattrs a sandbox set
// (whiteouts and redirects of overlayfs mounted with userxattr) are not
// in the layer; other user xattrs are.
func TestCommitDropsUserOverlayXattrs(t *testing.T) {
	s := newEROFSStore(t)
	ctx := context.Background()
	up := fakeUpper(t)
	plain := filepath.Join(up, "plain")
	for k, v := range map[string]string{"user.overlay.opaque": "y", "user.note": "kept"} {
		if err := unix.Lsetxattr(plain, k, []byte(v), 0); err != nil {
			t.Skipf("no user xattrs on %s: %v", up, err)
		}
	}
	nl, err := s.CommitUpper(ctx, "x", up, CommitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dirs, release, err := s.LayerDirs(ctx, Image{Name: "x", Layers: []string{nl.Digest}})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var buf [8]byte
	if n, err := unix.Lgetxattr(filepath.Join(dirs[0], "plain"), "user.overlay.opaque", buf[:]); err != unix.ENODATA {
		t.Errorf("user.overlay.opaque in the layer: %q %v", buf[:max(n, 0)], err)
	}
	if n, err := unix.Lgetxattr(filepath.Join(dirs[0], "plain"), "user.note", buf[:]); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("user.note: %q %v", buf[:max(n, 0)], err)
	}
}

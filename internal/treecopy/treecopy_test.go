package treecopy

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/testutil"
)

// tmpfs mounts a fresh tmpfs (its own filesystem, so that a rename from
// another one fails with EXDEV) and unmounts it at the end.
func tmpfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return st
}

// TestMoveAcrossFilesystemsKeepsEverything: a tree moved to another
// filesystem arrives with its owners, special modes, times, extended
// attributes, hard links, symlinks, whiteouts and fifos, and the source
// is gone.
func TestMoveAcrossFilesystemsKeepsEverything(t *testing.T) {
	testutil.RequireRoot(t)
	src := filepath.Join(tmpfs(t), "upper")
	dst := filepath.Join(tmpfs(t), "moved")
	must(t, os.MkdirAll(filepath.Join(src, "opaque"), 0o755))
	must(t, os.Mkdir(filepath.Join(src, "tmp"), 0o755))
	must(t, os.Chmod(filepath.Join(src, "tmp"), 0o777|os.ModeSticky))
	must(t, unix.Setxattr(filepath.Join(src, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, os.WriteFile(filepath.Join(src, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Chown(filepath.Join(src, "suid"), 1000, 1001))
	must(t, os.Chmod(filepath.Join(src, "suid"), 0o4755))
	must(t, os.WriteFile(filepath.Join(src, "a"), []byte("linked"), 0o640))
	must(t, os.Link(filepath.Join(src, "a"), filepath.Join(src, "opaque", "b")))
	must(t, os.Symlink("a", filepath.Join(src, "ln")))
	must(t, os.Lchown(filepath.Join(src, "ln"), 7, 8))
	must(t, unix.Mknod(filepath.Join(src, "gone"), unix.S_IFCHR|0o000, 0))
	must(t, unix.Mkfifo(filepath.Join(src, "fifo"), 0o620))
	old := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	must(t, os.Chtimes(filepath.Join(src, "a"), old, old))
	must(t, os.Chtimes(filepath.Join(src, "opaque"), old, old))

	want := map[string]unix.Stat_t{}
	for _, p := range []string{"", "opaque", "tmp", "suid", "a", "opaque/b", "ln", "gone", "fifo"} {
		want[p] = lstat(t, filepath.Join(src, p))
	}
	must(t, Move(src, dst))
	if _, err := os.Lstat(src); !os.IsNotExist(err) {
		t.Fatalf("source left behind: %v", err)
	}
	for p, w := range want {
		g := lstat(t, filepath.Join(dst, p))
		if g.Mode != w.Mode || g.Uid != w.Uid || g.Gid != w.Gid || g.Rdev != w.Rdev {
			t.Errorf("%q: mode %#o uid %d gid %d rdev %d, want %#o %d %d %d", p, g.Mode, g.Uid, g.Gid, g.Rdev, w.Mode, w.Uid, w.Gid, w.Rdev)
		}
		if g.Mode&unix.S_IFMT != unix.S_IFLNK && g.Mtim != w.Mtim {
			t.Errorf("%q: mtime %v, want %v", p, g.Mtim, w.Mtim)
		}
	}
	if a, b := lstat(t, filepath.Join(dst, "a")), lstat(t, filepath.Join(dst, "opaque", "b")); a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link not kept: inodes %d %d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "opaque", "b")); err != nil || string(b) != "linked" {
		t.Errorf("content: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "ln")); err != nil || l != "a" {
		t.Errorf("symlink: %q %v", l, err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr: %q %v", buf[:max(n, 0)], err)
	}
}

// TestMoveWithinAFilesystemRenames: on one filesystem the tree is
// renamed (the same inode), not copied.
func TestMoveWithinAFilesystemRenames(t *testing.T) {
	testutil.RequireRoot(t)
	root := tmpfs(t)
	src, dst := filepath.Join(root, "a"), filepath.Join(root, "b")
	must(t, os.Mkdir(src, 0o755))
	ino := lstat(t, src).Ino
	must(t, Move(src, dst))
	if got := lstat(t, dst).Ino; got != ino {
		t.Fatalf("inode %d after the move, %d before: copied", got, ino)
	}
}

// TestMovedOverlayUpperStillHides: the proof that matters: an overlay
// upper with a whiteout and an opaque directory, moved to another
// filesystem and stacked again, still hides what it hid.
func TestMovedOverlayUpperStillHides(t *testing.T) {
	testutil.RequireRoot(t)
	a, b := tmpfs(t), tmpfs(t)
	lower, upper, work, mnt := filepath.Join(a, "lower"), filepath.Join(a, "upper"), filepath.Join(a, "work"), filepath.Join(a, "mnt")
	for _, d := range []string{lower, upper, work, mnt, filepath.Join(lower, "dir"), filepath.Join(b, "work"), filepath.Join(b, "mnt")} {
		must(t, os.MkdirAll(d, 0o755))
	}
	must(t, os.WriteFile(filepath.Join(lower, "deleted"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(lower, "dir", "hidden"), []byte("x"), 0o644))
	mount := func(upper, work, mnt string) {
		t.Helper()
		if err := unix.Mount("overlay", mnt, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work); err != nil {
			t.Fatalf("mount overlay: %v", err)
		}
	}
	mount(upper, work, mnt)
	must(t, os.Remove(filepath.Join(mnt, "deleted")))
	must(t, os.RemoveAll(filepath.Join(mnt, "dir")))
	must(t, os.Mkdir(filepath.Join(mnt, "dir"), 0o755))
	must(t, os.WriteFile(filepath.Join(mnt, "dir", "new"), []byte("n"), 0o644))
	must(t, unix.Unmount(mnt, 0))

	moved := filepath.Join(b, "upper")
	must(t, Move(upper, moved))
	mount(moved, filepath.Join(b, "work"), filepath.Join(b, "mnt"))
	defer unix.Unmount(filepath.Join(b, "mnt"), unix.MNT_DETACH)
	if _, err := os.Stat(filepath.Join(b, "mnt", "deleted")); !os.IsNotExist(err) {
		t.Errorf("a deleted file is back after the move: %v", err)
	}
	ents, err := os.ReadDir(filepath.Join(b, "mnt", "dir"))
	if err != nil || len(ents) != 1 || ents[0].Name() != "new" {
		t.Errorf("opaque directory after the move: %v %v", ents, err)
	}
}

package inroot

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

func TestCleanSplit(t *testing.T) {
	for in, want := range map[string]string{"": "/", ".": "/", "../..": "/", "a/../../b": "/b", "/a//b/": "/a/b", "x": "/x"} {
		if got := Clean(in); got != want {
			t.Errorf("Clean(%q) = %q, want %q", in, got, want)
		}
	}
	if Rel("/") != "." || Rel("/a/b") != "a/b" {
		t.Error("Rel")
	}
	if d, b := Split("/a/b"); d != "/a" || b != "b" {
		t.Errorf("Split = %q %q", d, b)
	}
	if d, b := Split("/"); d != "/" || b != "" {
		t.Errorf("Split(/) = %q %q", d, b)
	}
}

func TestOpenMkdirAllRemoveAll(t *testing.T) {
	parent := t.TempDir()
	root := filepath.Join(parent, "root")
	os.MkdirAll(filepath.Join(root, "real"), 0o755)
	os.Symlink("/real", filepath.Join(root, "abs"))
	os.Symlink("../../../..", filepath.Join(root, "up"))
	os.Symlink(parent, filepath.Join(root, "host"))
	rootfd, err := OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rootfd)

	// ".." and symlinks never leave the root.
	fd, err := Open(rootfd, "up/up/root", unix.O_PATH, 0)
	if !errors.Is(err, unix.ENOENT) {
		t.Fatalf("up/up/root: %v", err)
	}
	fd, err = Open(rootfd, "up/up/real", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)

	fd, created, err := MkdirAll(rootfd, "/abs/x/y", 0o750)
	if err != nil || !created {
		t.Fatalf("MkdirAll: %v %v", created, err)
	}
	unix.Close(fd)
	fi, err := os.Stat(filepath.Join(root, "real/x/y"))
	if err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("real/x/y: %v %v", fi, err)
	}
	fd, created, err = MkdirAll(rootfd, "/abs/x", 0o750)
	if err != nil || created {
		t.Fatalf("existing MkdirAll: %v %v", created, err)
	}
	unix.Close(fd)
	// A host path through a symlink is a dangling path inside: it fails.
	if _, _, err := MkdirAll(rootfd, "/host/evil", 0o755); err == nil {
		t.Fatal("MkdirAll through a dangling symlink succeeded")
	}
	if _, err := os.Stat(filepath.Join(parent, "evil")); !os.IsNotExist(err) {
		t.Fatal("MkdirAll escaped")
	}
	if Category(err) != errdefs.NotFound && Category(err) != errdefs.Conflict {
		t.Logf("category %v", Category(err))
	}

	os.WriteFile(filepath.Join(root, "real/x/y/f"), []byte("x"), 0o644)
	os.Symlink(parent, filepath.Join(root, "real/x/y/link"))
	os.WriteFile(filepath.Join(parent, "keep"), []byte("x"), 0o644)
	if err := RemoveAll(rootfd, "real"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "real")); !os.IsNotExist(err) {
		t.Fatal("real not removed")
	}
	if _, err := os.Stat(filepath.Join(parent, "keep")); err != nil {
		t.Fatal("RemoveAll followed a symlink out")
	}
	if err := RemoveAll(rootfd, "missing"); err != nil {
		t.Fatal(err)
	}
}

func TestCategory(t *testing.T) {
	cases := map[unix.Errno]errdefs.Category{
		unix.ENOENT: errdefs.NotFound, unix.ENOSPC: errdefs.Exhausted, unix.EDQUOT: errdefs.Exhausted,
		unix.EEXIST: errdefs.Conflict, unix.ENOTDIR: errdefs.Invalid, unix.EIO: errdefs.Internal,
	}
	for en, want := range cases {
		if got := Category(&os.PathError{Op: "x", Path: "/p", Err: en}); got != want {
			t.Errorf("%v: %v, want %v", en, got, want)
		}
	}
	if Describe(unix.ENOSPC) != "no space left on device" {
		t.Error("Describe")
	}
}

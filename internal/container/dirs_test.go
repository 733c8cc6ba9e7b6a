package container

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRemoveKnown(t *testing.T) {
	root := t.TempDir()
	write := func(p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Only the expected entries: removed by name.
	write("a/sock")
	if err := os.MkdirAll(filepath.Join(root, "a/work/work"), 0o755); err != nil {
		t.Fatal(err)
	}
	// An expected directory that is not empty, and an unexpected file.
	write("b/upper/usr/bin/tool")
	write("b/surprise")
	if err := os.MkdirAll(filepath.Join(root, "b/work/work"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a", "b"} {
		if err := removeKnown(filepath.Join(root, d), "sock", "upper/", "work/work/", "work/"); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if _, err := os.Lstat(filepath.Join(root, d)); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", d, err)
		}
	}
	// Missing: no error.
	if err := removeKnown(filepath.Join(root, "missing"), "sock"); err != nil {
		t.Errorf("missing dir: %v", err)
	}
	// A file where a directory was expected.
	write("c")
	if err := removeTree(filepath.Join(root, "c")); err != nil {
		t.Errorf("file: %v", err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("left: %v", ents)
	}
}

func TestMkdir(t *testing.T) {
	root := t.TempDir()
	if err := mkdir(filepath.Join(root, "x/y/z")); err != nil {
		t.Fatal(err)
	}
	if err := mkdir(filepath.Join(root, "x/y/z")); !os.IsExist(err) {
		t.Errorf("second mkdir: %v, want exists", err)
	}
}

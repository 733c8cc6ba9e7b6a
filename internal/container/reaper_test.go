package container

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReaper(t *testing.T) {
	root := t.TempDir()
	trash := filepath.Join(root, "trash")
	// A daemon before left one behind.
	if err := os.MkdirAll(filepath.Join(trash, "old.1", "upper", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := newReaper(trash)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	sb := filepath.Join(root, "sandboxes", "sb1")
	for _, d := range []string{"upper/usr/lib", "work/work"} {
		if err := os.MkdirAll(filepath.Join(sb, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sb, "upper/usr/lib/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.discard(sb); err != nil {
		t.Fatal(err)
	}
	// The id is free at once.
	if _, err := os.Lstat(sb); !os.IsNotExist(err) {
		t.Errorf("state directory still in place: %v", err)
	}
	if err := os.MkdirAll(sb, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.discard(sb); err != nil {
		t.Fatal(err)
	}
	if err := r.discard(filepath.Join(root, "missing")); err != nil {
		t.Errorf("missing directory: %v", err)
	}
	r.wait()
	if ents, _ := os.ReadDir(trash); len(ents) != 0 {
		t.Errorf("trash not emptied: %v", ents)
	}
}

package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	for _, data := range []string{"one", "two, longer"} {
		if err := Write(p, ".tmp-", []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != data {
			t.Fatalf("read %q %v, want %q", b, err, data)
		}
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v %v, want 0640", fi.Mode(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("temp files left: %v", ents)
	}
	// A missing directory fails and leaves nothing.
	if err := Write(filepath.Join(dir, "no", "f"), ".tmp-", nil, 0o600); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

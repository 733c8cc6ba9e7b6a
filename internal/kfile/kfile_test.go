package kfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadWrite(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Longer than Read's first buffer.
	data := strings.Repeat("0123456789", 200)
	if err := Write(p, data); err != nil {
		t.Fatal(err)
	}
	b, err := Read(p)
	if err != nil || string(b) != data {
		t.Fatalf("read %d bytes, %v; want %d", len(b), err, len(data))
	}
	if _, err := Read(filepath.Join(t.TempDir(), "missing")); !os.IsNotExist(err) {
		t.Errorf("missing file: %v, want not-exist", err)
	}
	if err := Write(filepath.Join(t.TempDir(), "missing"), "x"); !os.IsNotExist(err) {
		t.Errorf("write to a missing file: %v, want not-exist (no create)", err)
	}
	if b, err := Read("/proc/self/stat"); err != nil || !strings.Contains(string(b), ")") {
		t.Errorf("/proc/self/stat: %q %v", b, err)
	}
}

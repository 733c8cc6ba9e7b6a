package container

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDirPoolOneOwner: a second pool on a directory another one owns is
// none (it would remove the owner's half-built entries under it), and
// the directory is free again once the owner closes.
func TestDirPoolOneOwner(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pool")
	a, err := newDirPool(dir, 4)
	if err != nil || a == nil {
		t.Fatalf("first pool: %v %v", a, err)
	}
	// A half-built entry of the owner's: the second start must not
	// touch it.
	tmp := filepath.Join(dir, "tmp-999")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := newDirPool(dir, 4)
	if err != nil || b != nil {
		t.Fatalf("second pool on an owned directory: %v %v, want none", b, err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("the second start removed the owner's entry: %v", err)
	}
	if b.claim(filepath.Join(t.TempDir(), "sb")) {
		t.Fatal("no pool claimed an entry")
	}
	// The owner fills to its size and hands entries out.
	for deadline := time.Now().Add(10 * time.Second); a.backlogReady() < 4; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pool filled %d of 4", a.backlogReady())
		}
	}
	dst := filepath.Join(t.TempDir(), "sb")
	if !a.claim(dst) || !poolEntryOK(dst) {
		t.Fatal("claim from the owner failed")
	}
	a.close()
	c, err := newDirPool(dir, 4)
	if err != nil || c == nil {
		t.Fatalf("pool after the owner closed: %v %v", c, err)
	}
	defer c.close()
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("the next owner kept a temporary entry: %v", err)
	}
}

func (p *dirPool) backlogReady() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

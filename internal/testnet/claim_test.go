package testnet

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestClaimsAreExclusive: a claimed block is refused to a second claim
// of this process and to another process (flock(1) on its file) while
// this one lives, and Subnet hands out distinct blocks.
func TestClaimsAreExclusive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("claims live under /run: needs root")
	}
	seen := map[string]bool{}
	for range 3 {
		p, err := Subnet()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p.String()] {
			t.Fatalf("Subnet handed out %s twice", p)
		}
		seen[p.String()] = true
		name := p.Addr().String() + "_24"
		if ok, err := claim(name); err != nil || ok {
			t.Errorf("a second claim of %s in the same process: %v %v, want refused", name, ok, err)
		}
		if _, err := exec.LookPath("flock"); err == nil {
			out, err := exec.Command("flock", "-n", filepath.Join(ClaimDir, name), "true").CombinedOutput()
			if err == nil {
				t.Errorf("another process took the lock of %s this one holds (%s)", name, out)
			}
		}
	}
	a, err := hostBase()
	if err != nil {
		t.Fatal(err)
	}
	b, err := hostBase()
	if err != nil {
		t.Fatal(err)
	}
	if a == b || a.Next().Next().Next().Next() != b {
		t.Errorf("two test hosts' /30s: %s and %s, want consecutive /30s of one block", a, b)
	}
}

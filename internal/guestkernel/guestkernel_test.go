package guestkernel

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/errdefs"
)

// TestLoadOrderPutsDependenciesFirst: the modules a microVM's init loads
// come in an order the kernel accepts: each after what its .modinfo says
// it depends on, each once.
func TestLoadOrderPutsDependenciesFirst(t *testing.T) {
	k, err := Find(Dir)
	if err != nil {
		t.Skipf("%v", err)
	}
	order, err := k.LoadOrder("virtio_mmio", "virtio_blk", "erofs", "virtio_console")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range order {
		names = append(names, strings.TrimSuffix(filepath.Base(p), ".ko"))
	}
	pos := func(n string) int {
		i := slices.Index(names, n)
		if i < 0 {
			t.Fatalf("%s not in the order %v", n, names)
		}
		return i
	}
	for _, dep := range [][2]string{{"virtio_ring", "virtio"}, {"virtio", "virtio_mmio"}, {"virtio", "virtio_blk"}, {"libcrc32c", "erofs"}} {
		if pos(dep[0]) > pos(dep[1]) {
			t.Errorf("%s after %s, which depends on it: %v", dep[0], dep[1], names)
		}
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("%s twice in %v", n, names)
		}
		seen[n] = true
	}
	if _, err := k.LoadOrder("no_such_module"); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Errorf("unknown module: %v, want not found", err)
	}
}

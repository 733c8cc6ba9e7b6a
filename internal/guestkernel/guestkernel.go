// Package guestkernel finds the kernel microVMs boot and the modules
// their init loads. scripts/vm.sh installs Debian's linux-image package
// under Dir without touching the node's own /boot: the uncompressed
// vmlinux (QEMU boots it straight through its PVH entry point, ~0.4 s
// faster to the first message than a bzImage under TCG here) and
// lib/modules. Debian builds the virtio, pmem, EROFS and OverlayFS
// drivers as modules, so the init loads them, in the order their
// .modinfo "depends" fields give (no depmod needed on the node).
package guestkernel

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Dir is where scripts/vm.sh installs kernels: Dir/<release>/vmlinux and
// Dir/<release>/lib/modules/<release>/.
const Dir = "/opt/warren/vm/kernels"

// Kernel is one installed guest kernel.
type Kernel struct {
	Release string
	Vmlinux string
	Modules string // lib/modules/<release>
}

// Find returns the installed kernel (the newest release by name when
// there are several), or NotFound saying how to install one.
func Find(dir string) (Kernel, error) {
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return Kernel{}, errdefs.Wrap(errdefs.Internal, err, "read guest kernels")
	}
	var rels []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "vmlinux")); err == nil {
			rels = append(rels, e.Name())
		}
	}
	if len(rels) == 0 {
		return Kernel{}, errdefs.NotFoundf("no guest kernel in %s: scripts/vm.sh installs one", dir)
	}
	sort.Strings(rels)
	r := rels[len(rels)-1]
	return Kernel{Release: r, Vmlinux: filepath.Join(dir, r, "vmlinux"), Modules: filepath.Join(dir, r, "lib", "modules", r)}, nil
}

// LoadOrder resolves names (module names, as in "virtio_pmem") and their
// dependencies to module files under k.Modules, dependencies first.
func (k Kernel) LoadOrder(names ...string) ([]string, error) {
	index := map[string]string{}
	err := filepath.WalkDir(k.Modules, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			index[strings.ReplaceAll(strings.TrimSuffix(d.Name(), ".ko"), "-", "_")] = p
		}
		return nil
	})
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "index guest kernel modules")
	}
	var out []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(n string) error
	visit = func(n string) error {
		n = strings.ReplaceAll(n, "-", "_")
		switch state[n] {
		case 1:
			return errdefs.Internalf("guest kernel modules: dependency cycle at %s", n)
		case 2:
			return nil
		}
		p, ok := index[n]
		if !ok {
			return errdefs.NotFoundf("guest kernel %s has no module %s", k.Release, n)
		}
		state[n] = 1
		deps, err := depends(p)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[n] = 2
		out = append(out, p)
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// depends reads a module's "depends=" from its .modinfo section.
func depends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read module "+path)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, nil
	}
	b, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo of %s: %w", path, err)
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(string(v), ","), nil
		}
	}
	return nil, nil
}

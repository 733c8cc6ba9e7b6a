package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/qmp"
)

// Layers on persistent memory with DAX (Config.PMEM): each layer file is
// mapped read-only and shared into the guest's physical memory (a NUMA
// node whose memory backend is the file: QEMU's virtio-pmem gets no
// address on -M microvm in QEMU 7.2, which wires no memory devices), and
// the kernel is told the range is persistent memory (memmap=SIZE!ADDR,
// e820 type 12). Its legacy pmem driver (nd_e820, nd_pmem) makes each one
// /dev/pmemN, which EROFS mounts with dax=always: the guest reads the
// host's page cache of the file through its page tables and keeps no copy,
// so every VM of the node shares one copy of a layer. The kernel registers
// the range (e820__reserve_resources_late) only from its PCI setup, which
// -M microvm runs only with pcie=on: that is the machine option's reason.
//
// Layout of the guest's physical memory, below 3 GiB (where -M microvm
// puts RAM without a split): RAM, then each layer (2 MiB-aligned, a 2
// MiB RAM spacer between two layers so that the kernel does not merge
// their ranges into one device), then pmemTailMB of RAM, where QEMU
// loads the initramfs (at the top of low memory, which must not be a
// read-only layer).
//
// A checkpoint leaves the layers out (pmemShared): they are in the store
// and read-only, so the restored QEMU maps the same files, and the
// migration stream (which would carry every page of a layer the guest
// read, and which a restore could not write into a read-only mapping)
// holds only the VM's RAM.
const (
	pmemAlign  = 2 << 20
	pmemTailMB = 64
	lowMemTop  = 3 << 30
)

// pmemModules are the guest drivers of legacy persistent memory.
var pmemModules = []string{"nd_pmem", "nd_e820"}

// modulesFor are the modules cfg's guest loads.
func modulesFor(cfg Config) []string {
	mods := append([]string(nil), guestModules...)
	if cfg.PMEM && len(cfg.Layers) > 0 {
		mods = append(mods, pmemModules...)
	}
	if cfg.Vsock != nil {
		mods = append(mods, vsockModules...)
	}
	return mods
}

// pmemArgs are QEMU's memory arguments and the kernel's for cfg's layers
// on persistent memory.
func pmemArgs(cfg Config) (args []string, cmdline string, err error) {
	if cfg.MemoryMB <= pmemTailMB {
		return nil, "", errdefs.Invalidf("microvm: %d MiB is too little memory for layers on pmem", cfg.MemoryMB)
	}
	mainMB := cfg.MemoryMB - pmemTailMB
	args = []string{
		"-object", ramObject(cfg, "ram0", fmt.Sprintf("%dM", mainMB)),
		"-numa", "node,memdev=ram0",
	}
	addr := uint64(mainMB) << 20
	var memmap, addrs []string
	for i, l := range cfg.Layers {
		img, size, err := pmemImage(cacheDir(cfg), l)
		if err != nil {
			return nil, "", err
		}
		if i > 0 {
			id := fmt.Sprintf("gap%d", i)
			args = append(args, "-object", ramObject(cfg, id, strconv.FormatUint(pmemAlign, 10)), "-numa", "node,memdev="+id)
			addr += pmemAlign
		}
		id := fmt.Sprintf("pmem%d", i)
		args = append(args,
			"-object", fmt.Sprintf("memory-backend-file,id=%s,mem-path=%s,size=%d,share=on,readonly=on", id, img, size),
			"-numa", "node,memdev="+id)
		memmap = append(memmap, fmt.Sprintf("memmap=%#x!%#x", size, addr))
		addrs = append(addrs, strconv.FormatUint(addr, 16))
		addr += size
	}
	total := addr + pmemTailMB<<20
	if total > lowMemTop {
		return nil, "", errdefs.Invalidf("microvm: the VM's memory and its layers on pmem take %d MiB, more than the 3 GiB -M microvm keeps below 4 GiB", total>>20)
	}
	args = append(args,
		"-object", ramObject(cfg, "tail", fmt.Sprintf("%dM", pmemTailMB)), "-numa", "node,memdev=tail",
		"-m", strconv.FormatUint(total>>20, 10)+"M")
	return args, " " + strings.Join(memmap, " ") + " warren.pmem=" + strings.Join(addrs, ","), nil
}

// ignoreShared has QEMU's migration skip the RAM blocks of shared memory
// backends: the layers', and only theirs (the VM's RAM is private). A
// migration capability (QEMU 7.2 still calls it experimental, x-, and
// has no property to set it at start) both ends need: the checkpoint's
// QEMU and the restore's (restoreVM, before its incoming migration).
func ignoreShared(ctx context.Context, c *qmp.Client) error {
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}
	if err := c.Run(ctx, "migrate-set-capabilities", caps, nil); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: QMP migrate-set-capabilities x-ignore-shared (the layers on pmem stay out of the checkpoint)")
	}
	return nil
}

// pmemImage is layer as a file whose size is a multiple of 2 MiB (a
// memory backend maps the whole file, the kernel's pmem wants aligned
// ranges): the layer itself when it is, else a zero-padded copy made
// once per layer content in the cache directory (EROFS ignores what
// follows its image).
func pmemImage(cache, layer string) (string, uint64, error) {
	fi, err := os.Stat(layer)
	if err != nil {
		return "", 0, errdefs.Wrap(errdefs.NotFound, err, "layer")
	}
	size := (uint64(fi.Size()) + pmemAlign - 1) / pmemAlign * pmemAlign
	if size == uint64(fi.Size()) && size > 0 {
		return layer, size, nil
	}
	if size == 0 {
		size = pmemAlign
	}
	h := sha256.New()
	fmt.Fprintln(h, layer, fi.Size(), fi.ModTime().UnixNano())
	out := filepath.Join(cache, "pmem-"+hex.EncodeToString(h.Sum(nil))[:16]+".img")
	if _, err := os.Stat(out); err == nil {
		return out, size, nil
	}
	in, err := os.Open(layer)
	if err != nil {
		return "", 0, errdefs.Wrap(errdefs.NotFound, err, "layer")
	}
	defer in.Close()
	tmp, err := os.CreateTemp(cache, ".pmem-*")
	if err != nil {
		return "", 0, errdefs.Wrap(errdefs.Internal, err, "pad a layer for pmem")
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, in)
	if err == nil {
		err = tmp.Truncate(int64(size))
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o444)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		return "", 0, errdefs.Wrap(errdefs.Internal, err, "pad a layer for pmem")
	}
	return out, size, nil
}

// cacheDir holds what VMs of a node share (initramfs images, padded
// layers): Config.CacheDir, else Dir's parent's parent.
func cacheDir(cfg Config) string {
	if cfg.CacheDir != "" {
		return cfg.CacheDir
	}
	return filepath.Dir(filepath.Dir(cfg.Dir))
}

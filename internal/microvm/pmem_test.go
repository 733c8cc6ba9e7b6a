package microvm

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/errdefs"
)

// TestPmemLayersAreReadThroughDAX: with Config.PMEM a VM's layers are
// persistent memory devices (no virtio block device), mounted with DAX
// under the sandbox's overlay: a 64 MiB file of the upper layer reads
// right, and reading it costs the node no guest memory (QEMU's anonymous
// memory grows by a fraction of it: the guest read the host's page cache
// of the layer file in place, which QEMU maps as file memory).
func TestPmemLayersAreReadThroughDAX(t *testing.T) {
	cfg := testConfig(t)
	mk, err := erofs.FindMkfs()
	if err != nil {
		t.Skipf("no mkfs.erofs: %v", err)
	}
	dir := t.TempDir()
	big := make([]byte, 64<<20)
	_, _ = rand.Read(big)
	if err := os.WriteFile(filepath.Join(dir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(t.TempDir(), "big.erofs")
	if out, err := exec.Command(mk.Path, layer, dir).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	cfg.Layers = append(cfg.Layers, layer)
	cfg.PMEM = true
	cfg.MemoryMB = 256
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	vm, err := Boot(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	t.Logf("boot to agent ready with pmem layers: %v", vm.Ready)
	r, err := vm.Exec(ctx, []string{"sh", "-c", "ls /sys/block | tr '\\n' ' '"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if devs := string(r.Stdout); !strings.Contains(devs, "pmem0") || !strings.Contains(devs, "pmem1") || strings.Contains(devs, "vd") {
		t.Fatalf("block devices %q: want pmem0 and pmem1 and no virtio block device", devs)
	}
	before, err := processMemory(vm.Pid())
	if err != nil {
		t.Fatal(err)
	}
	r, err = vm.Exec(ctx, []string{"sh", "-c", "md5sum /big | cut -d' ' -f1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := exec.Command("md5sum", filepath.Join(dir, "big")).Output()
	if got := strings.TrimSpace(string(r.Stdout)); got == "" || !strings.HasPrefix(string(want), got) {
		t.Fatalf("md5 of /big in the guest %q, on the host %q (%s)", got, want, r.Stderr)
	}
	after, err := processMemory(vm.Pid())
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	t.Logf("QEMU anon %d -> %d MiB, file %d -> %d MiB reading 64 MiB", before.Anon/mib, after.Anon/mib, before.File/mib, after.File/mib)
	if int64(after.Anon)-int64(before.Anon) > 16*mib {
		t.Fatalf("reading a 64 MiB file of a pmem layer grew QEMU's anonymous memory by %d MiB", (int64(after.Anon)-int64(before.Anon))/mib)
	}
}

// bigLayer is an EROFS layer holding /big, 64 MiB of random bytes, their
// md5, and a page of them from the middle.
func bigLayer(t *testing.T) (layer, sum string, page []byte) {
	t.Helper()
	mk, err := erofs.FindMkfs()
	if err != nil {
		t.Skipf("no mkfs.erofs: %v", err)
	}
	dir := t.TempDir()
	big := make([]byte, 64<<20)
	_, _ = rand.Read(big)
	if err := os.WriteFile(filepath.Join(dir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	layer = filepath.Join(t.TempDir(), "big.erofs")
	if out, err := exec.Command(mk.Path, layer, dir).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	out, _ := exec.Command("md5sum", filepath.Join(dir, "big")).Output()
	return layer, strings.Fields(string(out))[0], big[32<<20 : 32<<20+4096]
}

// cachedBytes is how much of file is in the node's page cache (mincore).
func cachedBytes(t *testing.T, file string) int64 {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	pg := os.Getpagesize()
	vec := make([]byte, (len(m)+pg-1)/pg)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * int64(pg)
}

// TestPmemCheckpointLeavesTheLayersOutAndVMsShareThem: a VM with its
// layers on pmem checkpoints without them (QEMU skips the shared RAM
// blocks: the guest read a 64 MiB file of a layer, and a page of it is
// not in the state file), and its restore and a fork
// map the same layer files again and read right. The two VMs share one
// copy of the layer, the node's page cache of its file: after both read
// the 64 MiB file, their QEMUs' proportional memory together grew by
// about 64 MiB, not 128 as two private copies would make it. A restore
// whose layer is gone from the store fails NotFound naming it. Destroy
// leaves no QEMU and no VM directory.
func TestPmemCheckpointLeavesTheLayersOutAndVMsShareThem(t *testing.T) {
	cfg := testConfig(t)
	layer, sum, page := bigLayer(t)
	state := t.TempDir()
	b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent, PMEM: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	spec := backend.Spec{ID: "pm", MemoryBytes: 128 << 20, CPUMillis: 1000,
		Layers: []backend.Layer{{Digest: "sha256:big", Blob: layer}, {Digest: "sha256:busybox", Blob: cfg.Layers[0]}}}
	src, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Destroy(context.Background())
	md5 := func(sb backend.Sandbox) {
		t.Helper()
		if got := strings.Fields(sh(t, sb, "md5sum /big"))[0]; got != sum {
			t.Fatalf("%s: md5 of /big %s, want %s", sb.ID(), got, sum)
		}
	}
	md5(src)
	use, err := processMemory(src.(*sandbox).vm.Pid())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := src.(backend.Checkpointer).Checkpoint(ctx, dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, stateFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint: state file %d MiB; QEMU's anonymous memory %d MiB, file %d MiB", fi.Size()>>20, use.Anon>>20, use.File>>20)
	// The guest read that page through DAX, which left no copy in its
	// RAM (md5sum's buffer holds the file's last bytes): found in the
	// stream, it came from the layer's block.
	if st, err := os.ReadFile(filepath.Join(dir, stateFile)); err != nil || bytes.Contains(st, page) {
		t.Fatalf("the state file holds the layer's pages (%v)", err)
	}
	_ = src.Destroy(ctx)

	vms := []backend.Sandbox{restoreAs(ctx, t, b, spec, "pm", dir), restoreAs(ctx, t, b, spec, "pm-fork", dir)}
	img, _, err := pmemImage(state, layer)
	if err != nil {
		t.Fatal(err)
	}
	pss := func() (n int64) {
		t.Helper()
		for _, sb := range vms {
			m, err := processMemory(sb.(*sandbox).vm.Pid())
			if err != nil {
				t.Fatal(err)
			}
			n += int64(m.Bytes)
		}
		return n
	}
	// The layer's pages leave the node's cache (none maps them yet: the
	// restores did not read them), so that the reads below bring them in.
	// The padded copy was written moments ago: written back first, as a
	// page still dirty or under writeback stays (24 of 64 MiB did).
	if f, err := os.Open(img); err == nil {
		_ = f.Sync()
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
	}
	c0, p0 := cachedBytes(t, img), pss()
	md5(vms[0])
	c1, p1 := cachedBytes(t, img), pss()
	md5(vms[1])
	c2, p2 := cachedBytes(t, img), pss()
	const mib = 1 << 20
	t.Logf("layer file cached %d -> %d -> %d MiB; the two QEMUs' Pss %d -> %d -> %d MiB", c0/mib, c1/mib, c2/mib, p0/mib, p1/mib, p2/mib)
	if c1-c0 < 48*mib {
		t.Fatalf("the first read brought %d MiB of the layer file into the node's cache, want ~64", (c1-c0)/mib)
	}
	if p1-p0 < 48*mib || p2-p0 > 96*mib {
		t.Fatalf("reading 64 MiB in each VM grew their memory by %d MiB after the first and %d MiB after both: want ~64 MiB, one shared copy", (p1-p0)/mib, (p2-p0)/mib)
	}
	for _, sb := range vms {
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A layer gone from the store.
	if err := os.Remove(layer); err != nil {
		t.Fatal(err)
	}
	s := spec
	s.ID, s.Restore = "pm-gone", dir
	if _, err := b.Create(ctx, s); errdefs.CategoryOf(err) != errdefs.NotFound || !strings.Contains(err.Error(), "sha256:big is gone from the store") {
		t.Fatalf("restore without its layer: %v, want NotFound naming it", err)
	}
	if left := leftovers(state); len(left) > 0 {
		t.Fatalf("after destroy: %v", left)
	}
}

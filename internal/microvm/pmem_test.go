package microvm

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	// Its checkpoint is refused (the stream would carry the layers), and
	// the VM runs on.
	sb := (&Backend{}).newSandbox("pmem", vm, vmState{})
	if err := sb.Checkpoint(ctx, filepath.Join(t.TempDir(), "ckpt")); errdefs.CategoryOf(err) != errdefs.Unsupported || !strings.Contains(err.Error(), "pmem") {
		t.Errorf("checkpoint of a VM with its layers on pmem: %v, want unsupported naming pmem", err)
	}
	if r, err := vm.Exec(ctx, []string{"echo", "on"}, nil); err != nil || string(r.Stdout) != "on\n" {
		t.Errorf("after the refused checkpoint: %v %v", r, err)
	}
}

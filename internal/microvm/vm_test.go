package microvm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/testutil"
)

// testConfig builds the guest agent and a layer of the test busybox root,
// or skips naming what the node lacks.
func testConfig(t *testing.T) Config {
	t.Helper()
	testutil.RequireRoot(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skipf("no qemu-system-x86_64 (scripts/vm.sh installs it): %v", err)
	}
	k, err := guestkernel.Find(guestkernel.Dir)
	if err != nil {
		t.Skipf("%v", err)
	}
	mk, err := erofs.FindMkfs()
	if err != nil {
		t.Skipf("no mkfs.erofs: %v", err)
	}
	dir := t.TempDir()
	agent := testutil.StaticBinary(t, "./cmd/warren-guest")
	layer := filepath.Join(dir, "busybox.erofs")
	if out, err := exec.Command(mk.Path, layer, testutil.BusyboxRoot(t)).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	return Config{QEMU: qemu, Kernel: k, GuestAgent: agent, Dir: filepath.Join(dir, "vms", "vm1"), Layers: []string{layer}}
}

// TestBootRunsCommandsInTheLayers: a microVM boots the Debian kernel with
// the guest agent as init, mounts the image's EROFS layer from a
// virtio-pmem device with DAX under a writable overlay, and runs commands
// there over the agent's port; closing it leaves no QEMU and no files.
func TestBootRunsCommandsInTheLayers(t *testing.T) {
	cfg := testConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vm, err := Boot(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	t.Logf("boot to agent ready: %v (guest kernel uptime %v)", vm.Ready, vm.GuestUptime)
	r, err := vm.Exec(ctx, []string{"sh", "-c", "echo hi; echo err >&2; echo kept > /root/f; cat /root/f; cat /proc/self/mountinfo | grep -c ' / / .* overlay ' ; exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Stdout) != "hi\nkept\n1\n" || string(r.Stderr) != "err\n" || r.Exit.Code != 3 {
		t.Fatalf("exec: stdout %q stderr %q exit %+v", r.Stdout, r.Stderr, r.Exit)
	}
	if _, err := vm.Exec(ctx, []string{"no-such-command"}, nil); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("exec of a missing command: %v", err)
	}
	pid := vm.Pid()
	vm.Close()
	if _, err := os.Stat(cfg.Dir); !os.IsNotExist(err) {
		t.Errorf("VM directory left: %v", err)
	}
	if err := exec.Command("kill", "-0", "--", strconv.Itoa(pid)).Run(); err == nil {
		t.Errorf("qemu %d still runs after Close", pid)
	}
}

// restoreAs creates sandbox id from the checkpoint in dir with spec's
// other fields, logs how long that took, and deletes it at the test's end.
func restoreAs(ctx context.Context, t *testing.T, b backend.Backend, spec backend.Spec, id, dir string) backend.Sandbox {
	t.Helper()
	spec.ID, spec.Restore = id, dir
	t0 := time.Now()
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore %s: %v", id, time.Since(t0))
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	// A VM's memory comes back whole, and says so where lazy was asked.
	if lazy, why := sb.(backend.MemoryRestorer).MemoryRestore(); lazy || (why != "") != spec.LazyPages {
		t.Errorf("restore %s asked lazy %v: MemoryRestore (%v, %q)", id, spec.LazyPages, lazy, why)
	}
	return sb
}

// backendAt returns a function making backends on one state directory:
// each call a daemon's start.
func backendAt(t *testing.T, cfg Config, state string) func() *Backend {
	return func() *Backend {
		b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

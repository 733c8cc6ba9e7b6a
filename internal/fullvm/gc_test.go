package fullvm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/testutil"
)

// TestImageScriptGCKeepsTheNewestAndWhatIsOpen: `fullvm-image.sh --gc`
// removes the suite's older images and trees, and keeps the newest (the
// link's target), one a process has a file of open (a VM's QEMU holds its
// image's disk), a stage being made (.tmp) and other suites'. It waits
// while a create holds the images shared (holdImages).
func TestImageScriptGCKeepsTheNewestAndWhatIsOpen(t *testing.T) {
	testutil.RequireRoot(t)
	vm := t.TempDir()
	dir := filepath.Join(vm, "images")
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "disk.qcow2"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, n := range []string{"bookworm-new", "bookworm-old", "bookworm-held", "bookworm-half.tmp", "rootfs-bookworm-old", "trixie-other"} {
		mk(n)
	}
	if err := os.Symlink("bookworm-new", filepath.Join(dir, "bookworm")); err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(filepath.Join(dir, "bookworm-held", "disk.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()

	gc := func(timeout time.Duration) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(testutil.ModuleRoot(), ImageScript), "--gc")
		cmd.Env = append(os.Environ(), "WARREN_VM_DIR="+vm)
		// The script's flock is a process of its own: the whole group
		// goes at the timeout.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// A create in flight: the GC waits for it.
	b := &Backend{opts: Options{ImageDir: filepath.Join(dir, "bookworm")}}
	release := b.holdImages()
	if out, err := gc(2 * time.Second); err == nil {
		t.Fatalf("the GC ran while a create held the images:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "bookworm-old")); err != nil {
		t.Fatalf("the blocked GC removed something: %v", err)
	}
	release()
	out, err := gc(time.Minute)
	if err != nil {
		t.Fatalf("gc: %v\n%s", err, out)
	}
	for n, want := range map[string]bool{"bookworm-new": true, "bookworm-old": false, "bookworm-held": true,
		"bookworm-half.tmp": true, "rootfs-bookworm-old": false, "trixie-other": true, "bookworm": true} {
		_, err := os.Lstat(filepath.Join(dir, n))
		if got := err == nil; got != want {
			t.Errorf("%s: there %v, want %v (%v)\n%s", n, got, want, err, out)
		}
	}
	if !strings.Contains(out, "keeping bookworm-held: in use") {
		t.Errorf("the GC did not say why it kept the open image:\n%s", out)
	}
}

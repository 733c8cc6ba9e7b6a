package fullvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/microvm"
)

// TestFullVMOverVsock: with transport vsock a full VM has a vsock device
// and no virtio-serial port, and the image's agent (a systemd service)
// serves it once udev has loaded its driver; commands run; a second
// backend adopts beside the live first without a port to hot-plug; both
// follow the agent across its restart by systemd; the
// VM pauses (a freeze of its cgroup, with a vhost-user device) across an
// adoption and resumes; Destroy leaves no QEMU, backend, cgroup or file.
func TestFullVMOverVsock(t *testing.T) {
	img := testImage(t)
	dev, err := microvm.PickVsock("")
	if err != nil {
		t.Skipf("%v", err)
	}
	state := t.TempDir()
	newBackend := func() *Backend {
		b, err := New(Options{StateDir: state, CgroupParent: testCgroupParent, ImageDir: img, Transport: microvm.TransportVsock})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	t0 := time.Now()
	sb, err := newBackend().Create(ctx, backend.Spec{ID: "fvs1", Layers: testLayers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	t.Logf("create over vsock (kernel device: %v): %v", dev.Kernel, time.Since(t0))
	pid := sb.(*sandbox).VMPid()
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if strings.Contains(string(cmdline), "virtserialport") || !strings.Contains(string(cmdline), "vsock-pci") {
		t.Fatalf("QEMU's devices: %s", strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"sh", "-c", "grep -c AF_VSOCK /proc/net/protocols; ls /dev/vport* 2>/dev/null | wc -l; hostname"}, Env: env}, ""); r.Stdout != "1\n0\nfvs1\n" {
		t.Fatalf("the guest's transport: %+v", r)
	}
	sb2, err := newBackend().Adopt(ctx, "fvs1", sb.State())
	if err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb2, backend.ProcSpec{Argv: []string{"echo", "adopted"}, Env: env}, ""); r.Stdout != "adopted\n" {
		t.Fatalf("exec through the second handle: %+v", r)
	}
	if ports, _ := filepath.Glob(filepath.Join(state, "vms", "fvs1", "a*.sock")); len(ports) != 0 {
		t.Fatalf("an adoption over vsock hot-plugged ports: %v", ports)
	}
	// systemd restarts the agent: the guest resets its connections, a
	// process in flight ends Unavailable, and both handles reach the next
	// agent on connections of their own.
	pidOf := func(sb backend.Sandbox) string {
		r, err := conformance.TryExec(sb, backend.ProcSpec{Argv: []string{"pgrep", "-x", "warren-guest"}, Env: env}, "")
		if err != nil {
			return ""
		}
		return strings.TrimSpace(r.Stdout)
	}
	old := pidOf(sb)
	long, err := sb.Start(ctx, backend.ProcSpec{Argv: []string{"sleep", "600"}, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"systemd-run", "--on-active=2", "systemctl", "restart", "warren-guest"}, Env: env}, ""); r.Status.Code != 0 {
		t.Fatalf("systemd-run: %+v", r)
	}
	waited := make(chan error, 1)
	go func() { _, err := long.Wait(); waited <- err }()
	select {
	case err := <-waited:
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("a process in flight when the agent went: %v, want unavailable", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a process in flight when the agent went never ended")
	}
	for _, h := range []backend.Sandbox{sb, sb2} {
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(2 * time.Second) {
			if pid := pidOf(h); pid != "" && pid != old {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a handle never reached the restarted agent (old pid %s)", old)
			}
		}
	}
	if n := sb.(*sandbox).AgentLosses(); n < 1 {
		t.Errorf("AgentLosses %d after the agent's restart", n)
	}
	if _, err := sb2.(backend.Pauser).Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	sb3, err := newBackend().Adopt(ctx, "fvs1", sb.State())
	if err != nil {
		t.Fatalf("adopt of a paused vsock VM: %v", err)
	}
	if err := sb3.(backend.Pauser).Resume(ctx, backend.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb3, backend.ProcSpec{Argv: []string{"echo", "resumed"}, Env: env}, ""); r.Stdout != "resumed\n" {
		t.Fatalf("exec after the resume: %+v", r)
	}
	if err := sb3.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "vms", "fvs1")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := microvm.QEMUPids(dir, 0)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU left after Destroy: %v", left)
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline")); err == nil && strings.Contains(string(b), dir) {
			t.Errorf("a process of the VM left: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("VM directory left: %v", err)
	}
	groups, _ := cgroups.List(testCgroupParent)
	for _, g := range groups {
		if strings.Contains(g, "fvs1") {
			t.Errorf("cgroup left: %s", g)
		}
	}
}

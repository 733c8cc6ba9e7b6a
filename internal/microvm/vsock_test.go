package microvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
)

// vsockConfig is testConfig with the node's vsock device, or a skip
// naming what the node lacks (.ci/run installs the vhost-user backend).
func vsockConfig(t *testing.T) (Config, Vsock) {
	cfg := testConfig(t)
	d, err := PickVsock("")
	if err != nil {
		t.Skipf("%v", err)
	}
	return cfg, d
}

// backendsUnder are the processes serving the vhost-user vsock of VMs
// under state.
func backendsUnder(state string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), state) && strings.Contains(string(b), "--uds-path") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestVsockTransport: with transport vsock the agent serves its sessions
// over AF_VSOCK and the VM has no virtio-serial port; commands, files and
// background processes work; a restarted daemon connects beside its
// predecessor's live session without hot-plugging anything, also to a VM
// paused when it went (its connection waits for the resume); a
// checkpoint is refused with the reason and the VM runs on; Destroy, a
// crash of QEMU and a sweep each leave no QEMU, no vsock backend, no
// cgroup and no directory.
func TestVsockTransport(t *testing.T) {
	cfg, dev := vsockConfig(t)
	state := t.TempDir()
	newBackend := func() *Backend {
		b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent, Transport: TransportVsock})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec := backend.Spec{ID: "vs1", Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}},
		MemoryBytes: 128 << 20, Env: []string{"PATH=/bin"}}
	t0 := time.Now()
	sb, err := newBackend().Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	t.Logf("create to agent ready over vsock (kernel device: %v): %v", dev.Kernel, time.Since(t0))
	v := sb.(*sandbox).vm
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(v.Pid()) + "/cmdline")
	if strings.Contains(string(cmdline), "virtserialport") || !strings.Contains(string(cmdline), "vsock-device") {
		t.Fatalf("QEMU's devices: %s", strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	if !dev.Kernel {
		// The backend serves this VM only, from the VM's cgroup.
		pids := backendsUnder(state)
		if len(pids) != 1 {
			t.Fatalf("vsock backends: %v, want one", pids)
		}
		cg, _ := os.ReadFile("/proc/" + pids[0] + "/cgroup")
		if !strings.Contains(string(cg), "vs1") {
			t.Fatalf("the vsock backend is not in the VM's cgroup:\n%s", cg)
		}
	}
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"sh", "-c", "ls /sys/class/virtio-ports | wc -l; cat /proc/net/protocols | grep -c AF_VSOCK"}}, ""); r.Stdout != "0\n1\n" {
		t.Fatalf("the guest's ports and vsock: %+v", r)
	}
	if err := sb.(*sandbox).Files().WriteFile(ctx, "/root/f", strings.NewReader("over vsock"), 0o644, false, false); err != nil {
		t.Fatal(err)
	}
	pid, err := sb.(backend.Background).StartBackground(ctx, backend.ProcSpec{Argv: []string{"sh", "-c", "cat /root/f; read x; echo got $x"}},
		backend.BackgroundOpts{OutputCap: 4096})
	if err != nil {
		t.Fatal(err)
	}

	// A second daemon, beside the live first: a connection of its own.
	sb2, err := newBackend().Adopt(ctx, "vs1", sb.State())
	if err != nil {
		t.Fatal(err)
	}
	w, err := sb2.(backend.Background).OpenStdin(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("y\n"))
	w.Close()
	out, _, _, ex := follow(t, sb.(backend.Background), pid, 0, 0)
	if out != "over vsockgot y\n" || ex.Code != 0 {
		t.Fatalf("the background process across handles: %q %+v", out, ex)
	}
	ports, _ := filepath.Glob(filepath.Join(state, "vms", "vs1", "a*.sock"))
	if len(ports) != 0 {
		t.Fatalf("an adoption over vsock hot-plugged ports: %v", ports)
	}

	// A checkpoint is refused, naming why; the VM runs on.
	if err := sb2.(backend.Checkpointer).Checkpoint(ctx, t.TempDir()); !errors.Is(err, errdefs.ErrUnsupported) || !strings.Contains(err.Error(), "vsock") {
		t.Fatalf("checkpoint of a vsock VM: %v, want unsupported naming vsock", err)
	}
	if r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"echo", "on"}}, ""); r.Stdout != "on\n" {
		t.Fatalf("exec after a refused checkpoint: %+v", r)
	}

	// Both daemons go while the VM is paused; the next one adopts it
	// without waiting for the guest, and connects after the resume.
	if _, err := sb2.(backend.Pauser).Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, s := range []backend.Sandbox{sb, sb2} {
		vm := s.(*sandbox).vm
		// Under the lock: the session watcher may be reconnecting.
		vm.smu.Lock()
		sess, conn := vm.sess, vm.conn
		vm.smu.Unlock()
		sess.Close()
		conn.Close()
	}
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	sb3, err := newBackend().Adopt(actx, "vs1", sb.State())
	acancel()
	if err != nil {
		t.Fatalf("adopt of a paused vsock VM: %v", err)
	}
	if err := sb3.(backend.Pauser).Resume(ctx, backend.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb3, backend.ProcSpec{Argv: []string{"cat", "/root/f"}}, ""); r.Stdout != "over vsock" {
		t.Fatalf("exec after adopting a paused VM: %+v", r)
	}

	qemu := sb3.(*sandbox).vm.Pid()
	if err := sb3.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Exited().Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("QEMU %d runs after Destroy", qemu)
	}
	assertNoVsockLeft(t, state, "vs1")

	// QEMU crashes: its backend and cgroup go with it.
	spec.ID = "vs2"
	sb4, err := newBackend().Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sb4.(*sandbox).vm.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb4.Exited().Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox did not see its QEMU die")
	}
	if !dev.Kernel {
		if pids := backendsUnder(state); len(pids) != 0 {
			t.Fatalf("vsock backends after QEMU died: %v", pids)
		}
	}
	_ = sb4.Destroy(ctx)
	assertNoVsockLeft(t, state, "vs2")

	// A daemon that died leaves a VM nobody keeps: the sweep takes QEMU
	// and its backend.
	spec.ID = "vs3"
	if _, err := newBackend().Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := newBackend().Sweep(ctx, nil); err != nil {
		t.Fatal(err)
	}
	assertNoVsockLeft(t, state, "vs3")
}

// assertNoVsockLeft fails if anything of VM id under state is left: its
// QEMU, a vsock backend, its directory, its cgroup.
func assertNoVsockLeft(t *testing.T, state, id string) {
	t.Helper()
	dir := filepath.Join(state, "vms", id)
	if pids := qemuPids(dir, 0); len(pids) != 0 {
		t.Errorf("%s: QEMU left: %v", id, pids)
	}
	if pids := backendsUnder(state); len(pids) != 0 {
		t.Errorf("%s: vsock backends left: %v", id, pids)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s: VM directory left: %v", id, err)
	}
	groups, _ := cgroups.List(defaultCgroupParent)
	for _, g := range groups {
		if strings.Contains(g, id) {
			t.Errorf("%s: cgroup left: %s", id, g)
		}
	}
}

// TestVsockArgs: a vsock VM's QEMU has the vsock device and no
// virtio-serial port, the guest is told to serve vsock, and with a
// vhost-user device every guest RAM block (one, or the pmem layout's)
// is a shared memfd the backend can map; a serial VM's RAM stays private.
func TestVsockArgs(t *testing.T) {
	dir := t.TempDir()
	layer := filepath.Join(dir, "l.erofs")
	if err := os.WriteFile(layer, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	base := Config{Dir: filepath.Join(dir, "vm"), Layers: []string{layer}, MemoryMB: 384, CPUs: 1, CacheDir: dir}
	for _, c := range []struct {
		name   string
		vsock  *Vsock
		pmem   bool
		want   []string
		unwant []string
	}{
		{"serial", nil, false, []string{"virtserialport", "-m 384M"}, []string{"vsock", "memfd"}},
		{"vhost-user", &Vsock{Backend: "/b"}, false,
			[]string{"vhost-user-vsock-device,id=vsock,chardev=vhu", "microvm,memory-backend=ram", "memory-backend-memfd,id=ram,size=384M,share=on", "warren.transport=vsock"},
			[]string{"virtserialport", "memory-backend-ram"}},
		{"vhost-user pmem", &Vsock{Backend: "/b"}, true,
			[]string{"memory-backend-memfd,id=ram0,", "memory-backend-memfd,id=tail,", "share=on"},
			[]string{"virtserialport", "memory-backend-ram", "memory-backend=ram"}},
		{"kernel", (Vsock{Kernel: true}).forVM("vm"), false,
			[]string{"vhost-vsock-device,id=vsock,guest-cid=", "warren.transport=vsock", "-m 384M"},
			[]string{"virtserialport", "memfd", "vhu"}},
	} {
		cfg := base
		cfg.Vsock, cfg.PMEM = c.vsock, c.pmem
		args, err := qemuArgs(cfg, "initrd", "agent.sock", "qmp.sock")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		line := strings.Join(args, " ")
		for _, w := range c.want {
			if !strings.Contains(line, w) {
				t.Errorf("%s: no %q in %s", c.name, w, line)
			}
		}
		for _, u := range c.unwant {
			if strings.Contains(line, u) {
				t.Errorf("%s: %q in %s", c.name, u, line)
			}
		}
	}
	if a, b := (Vsock{Kernel: true}).forVM("a").CID, (Vsock{Kernel: true}).forVM("b").CID; a < 3 || b < 3 || a == b {
		t.Errorf("kernel vsock CIDs %d and %d: want distinct, >= 3", a, b)
	}
}

// TestVsockBackendDeathEndsTheVM: a vhost-user backend that dies leaves
// its VM unreachable for good (QEMU 7.2 does not reconnect the device):
// the VM is stopped, saying why on its console, its sandbox ends, calls
// fail instead of hanging, and nothing is left after Destroy.
func TestVsockBackendDeathEndsTheVM(t *testing.T) {
	cfg, dev := vsockConfig(t)
	if dev.Kernel {
		t.Skip("the node's vsock is the kernel's: no backend process to lose")
	}
	state := t.TempDir()
	b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent, Transport: TransportVsock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := b.Create(ctx, backend.Spec{ID: "vsdead", Layers: []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}}, Env: []string{"PATH=/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	dir := filepath.Join(state, "vms", "vsdead")
	pids := vsockBackendPids(dir)
	if len(pids) != 1 {
		t.Fatalf("backends of the VM: %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Exited().Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the VM runs on without its vsock backend")
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	_, err = sb.Start(cctx, backend.ProcSpec{Argv: []string{"true"}})
	if err == nil || cctx.Err() != nil || !strings.Contains(err.Error(), "vsock backend") {
		t.Fatalf("a call to the VM after its backend died: %v (context: %v), want a prompt failure naming the backend", err, cctx.Err())
	}
	t.Logf("a call after the backend died: %v", err)
	console, _ := os.ReadFile(filepath.Join(dir, "console.log"))
	if !strings.Contains(string(console), "vsock backend (vhost-device-vsock) exited") {
		t.Fatalf("the console does not say why the VM stopped:\n%s", console)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoVsockLeft(t, state, "vsdead")
}

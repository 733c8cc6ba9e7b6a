package cgroups_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/initramfs"
	"github.com/warrenrl/warren/internal/microvm"
	"github.com/warrenrl/warren/internal/testutil"
)

// This package's tests run on the node's own layout (hybrid on the
// development machines), and again on cgroup v2, the layout of
// production nodes, in a QEMU microVM whose init is this package's test
// binary (TestCgroupV2InAVM): the v2 paths (one group per sandbox,
// cgroup.kill, cgroup.freeze, memory.reclaim, cpu.idle, the eBPF device
// filter) are otherwise never run here.

// vmEnv marks the test binary's run as the VM's init.
const vmEnv = "WARREN_CGROUPS_VM"

// v2Tests are the tests run in the VM: every test of the package but
// those of the other layouts (v1, hybrid) and the VM's own.
var v2Tests = []string{
	"TestNewLimitsAndLayout", "TestNewRollback", "TestProcsDevicesFreezeStats", "TestKillForkingChild",
	"TestPidsRefused", "TestFreezeReclaimThaw", "TestReclaimV2PushesToSwap", "TestMemoryLimitBoundsSwap",
	"TestDeleteReclaimsLeftovers", "TestReadKey",
	"TestSetLimitsReadBack", "TestSetLimitsAllOrNothing", "TestQoSClassesReadBack",
}

func TestMain(m *testing.M) {
	switch {
	case os.Getpid() == 1 && os.Getenv(vmEnv) == "1":
		vmInit()
	case os.Getenv(vmEnv) == "tests":
		// The VM's test run, the init's child; the processes its tests
		// start from this binary (anonHolder) are not. A test that hangs
		// panics with every goroutine's stack on the console before the
		// host gives up on the VM.
		run := os.Getenv(vmEnv + "_RUN")
		os.Unsetenv(vmEnv)
		os.Unsetenv(vmEnv + "_RUN")
		fmt.Printf("warren-vm: cgroups mode %s\n", cgroups.Mode())
		os.Args = []string{os.Args[0], "-test.v", "-test.timeout=4m", "-test.run=" + run}
	}
	os.Exit(m.Run())
}

// vmInit is the VM's init: it mounts what the tests need, runs them in a
// child (the init reaps every orphan, as a node's init does: a zombie
// still counts in pids.current), says how they ended on the console and
// powers the VM off.
func vmInit() {
	code := 1
	defer func() {
		fmt.Printf("warren-vm: exit %d\n", code)
		unix.Sync()
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		os.Exit(code) // a PID 1 that exits panics the kernel, which panic=-1 reboots: -no-reboot ends QEMU
	}()
	if err := vmSetup(); err != nil {
		fmt.Printf("warren-vm: setup: %v\n", err)
		return
	}
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, vmEnv+"=") {
			env = append(env, e)
		}
	}
	env = append(env, vmEnv+"=tests")
	pid, err := syscall.ForkExec("/init", []string{"/init"}, &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2}})
	if err != nil {
		fmt.Printf("warren-vm: start the tests: %v\n", err)
		return
	}
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			fmt.Printf("warren-vm: wait: %v\n", err)
			return
		}
		if got == pid {
			code = ws.ExitStatus()
			return
		}
	}
}

func vmSetup() error {
	os.Setenv("PATH", "/bin")
	// Test directories on the disk too: a swap file (withSwap) cannot be
	// on tmpfs.
	os.Setenv("TMPDIR", "/var/tmp")
	for _, mt := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2"}, {"tmpfs", "/tmp", "tmpfs"}, {"tmpfs", "/dev/shm", "tmpfs"},
	} {
		if err := os.MkdirAll(mt.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(mt.src, mt.dst, mt.fs, 0, ""); err != nil {
			return fmt.Errorf("mount %s: %w", mt.dst, err)
		}
	}
	if err := guest.LoadModules(guest.ModuleOrder); err != nil {
		return err
	}
	// /var/tmp on a disk: the tests' page cache must be reclaimable,
	// which tmpfs pages are not without swap.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat("/dev/vda"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("no /dev/vda")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.MkdirAll("/var/tmp", 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("/dev/vda", "/var/tmp", "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount /dev/vda: %w", err)
	}
	return os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpu +cpuset +memory +pids +io"), 0)
}

// TestCgroupV2InAVM runs v2Tests on cgroup v2 in a microVM (the Debian
// guest kernel, TCG here): the test binary, built static, is its init,
// with busybox beside it and an ext4 disk (sparse) at /var/tmp.
func TestCgroupV2InAVM(t *testing.T) {
	if os.Getpid() == 1 {
		t.Skip("in the VM")
	}
	testutil.RequireRoot(t)
	if cgroups.Mode() == "v2" {
		t.Skip("this node is cgroup v2: the package's tests ran on v2 already")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skipf("no qemu-system-x86_64 (scripts/vm.sh installs it): %v", err)
	}
	k, err := guestkernel.Find(guestkernel.Dir)
	if err != nil {
		t.Skipf("%v", err)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skipf("no mkfs.ext4: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "cgroups.test")
	build := exec.Command("go", "test", "-c", "-o", bin, "./internal/cgroups")
	build.Dir = testutil.ModuleRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the package's tests for the VM: %v\n%s", err, out)
	}
	mods, err := k.LoadOrder("virtio_mmio", "virtio_blk", "crc32c_generic", "ext4")
	if err != nil {
		t.Fatal(err)
	}
	w := initramfs.New()
	add := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	add(w.AddFile("init", bin, 0o755))
	busybox := filepath.Join(testutil.BusyboxRoot(t), "bin", "busybox")
	add(w.AddFile("bin/busybox", busybox, 0o755))
	applets, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" {
			add(w.Add(initramfs.Entry{Name: "bin/" + a, Mode: os.ModeSymlink | 0o777, Data: []byte("busybox")}))
		}
	}
	add(microvm.AddModules(w, mods))
	initrd := filepath.Join(dir, "initramfs.cpio")
	f, err := os.Create(initrd)
	if err != nil {
		t.Fatal(err)
	}
	add(w.Write(f))
	add(f.Close())
	disk := filepath.Join(dir, "disk.img")
	if out, err := exec.Command(mkfs, "-q", "-F", disk, "1G").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}

	run := "^(" + strings.Join(v2Tests, "|") + ")$"
	cmdline := "console=ttyS0 quiet panic=-1 tsc_early_khz=" + strconv.Itoa(microvm.HostTSCkHz()) +
		" " + vmEnv + "=1 " + vmEnv + "_RUN=" + run
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	vm := exec.CommandContext(ctx, qemu, "-M", "microvm", "-accel", "tcg,thread=multi", "-cpu", "max",
		"-smp", "2", "-m", "1024", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", k.Vmlinux, "-initrd", initrd, "-append", cmdline, "-serial", "stdio",
		"-drive", "file="+disk+",if=none,id=disk,format=raw,cache=unsafe",
		"-device", "virtio-blk-device,drive=disk")
	t0 := time.Now()
	out, err := vm.CombinedOutput()
	console := string(out)
	t.Logf("the VM ran %v; its console:\n%s", time.Since(t0).Round(time.Second), console)
	if err != nil {
		t.Fatalf("QEMU: %v", err)
	}
	if !strings.Contains(console, "warren-vm: cgroups mode v2") {
		t.Fatal("the VM's tests did not run on cgroup v2")
	}
	if !strings.Contains(console, "warren-vm: exit 0") {
		t.Error("the package's tests failed on cgroup v2 (the console above)")
	}
	for _, name := range v2Tests {
		if !regexp.MustCompile(`--- (PASS|SKIP): ` + name + ` `).MatchString(console) {
			t.Errorf("%s did not pass on cgroup v2", name)
		}
		if strings.Contains(console, "--- SKIP: "+name+" ") {
			t.Logf("%s skipped on cgroup v2", name)
		}
	}
}

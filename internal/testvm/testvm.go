// Package testvm runs some of a package's tests again on cgroup v2, the
// layout of production nodes, where the node itself has another (hybrid
// on the development machines): in a QEMU microVM (the node's guest
// kernel, TCG where there is no KVM) whose init is the package's test
// binary, built static. The init mounts what tests need (proc, sysfs,
// devtmpfs, cgroup2 with every controller enabled for children, tmpfs
// at /tmp, /run and /dev/shm, an ext4 disk at /var/tmp, which is
// TMPDIR), loads the modules the host put in its initramfs, runs the
// tests in a child while it reaps every orphan (as a node's init does: a
// zombie still counts in pids.current), prints how they ended on the
// console and powers off. The initramfs holds busybox too, as /bin.
//
// A package uses it from its TestMain (Main first) and one test (Run).
package testvm

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

// env on the kernel's command line marks the test binary's run as the
// VM's init ("init"); the init's child, the tests, gets "tests", and the
// -test.run and -test.skip patterns in env_RUN and env_SKIP.
const env = "WARREN_TESTVM"

// inVM is set in the VM's test run.
var inVM bool

// Main is the first call of the TestMain of a package that uses Run. In
// the VM's init it never returns; in the VM's test run it sets the test
// flags the host chose (before m.Run parses them). Elsewhere it does
// nothing.
func Main() {
	switch {
	case os.Getpid() == 1 && os.Getenv(env) == "init":
		vmInit()
	case os.Getenv(env) == "tests":
		inVM = true
		args := []string{os.Args[0], "-test.v", "-test.timeout=" + os.Getenv(env+"_TIMEOUT"), "-test.run=" + os.Getenv(env+"_RUN")}
		if s := os.Getenv(env + "_SKIP"); s != "" {
			args = append(args, "-test.skip="+s)
		}
		for _, k := range []string{env, env + "_RUN", env + "_SKIP", env + "_TIMEOUT"} {
			os.Unsetenv(k)
		}
		fmt.Printf("warren-vm: cgroups mode %s\n", cgroups.Mode())
		os.Args = args
	}
}

// vmInit is the VM's init.
func vmInit() {
	code := 1
	defer func() {
		fmt.Printf("warren-vm: exit %d\n", code)
		unix.Sync()
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		os.Exit(code) // a PID 1 that exits panics the kernel, which panic=-1 reboots: -no-reboot ends QEMU
	}()
	if err := setup(); err != nil {
		fmt.Printf("warren-vm: setup: %v\n", err)
		return
	}
	var envv []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, env+"=") {
			envv = append(envv, e)
		}
	}
	envv = append(envv, env+"=tests")
	pid, err := syscall.ForkExec("/init", []string{"/init"}, &syscall.ProcAttr{Env: envv, Files: []uintptr{0, 1, 2}})
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

func setup() error {
	// pivot_root refuses a root that is the initramfs itself (rootfs
	// has no parent mount), and the container backend pivots: the root
	// moves onto a bind mount of itself first, as switch_root would move
	// it onto a disk.
	if err := os.MkdirAll("/newroot", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/", "/newroot", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the root: %w", err)
	}
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	os.Setenv("PATH", "/bin")
	// Test directories on the disk: a swap file cannot be on tmpfs, and
	// tests' page cache must be reclaimable, which tmpfs pages are not
	// without swap.
	os.Setenv("TMPDIR", "/var/tmp")
	for _, mt := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2"}, {"tmpfs", "/tmp", "tmpfs"}, {"tmpfs", "/run", "tmpfs"},
		{"tmpfs", "/dev/shm", "tmpfs"},
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

// Config says what Run runs.
type Config struct {
	// Package is the package whose tests run, as go test names it
	// ("./internal/cgroups"), from the module's root.
	Package string
	// Tests are the top-level tests run (-test.run); each must pass
	// (or skip, which is logged).
	Tests []string
	// Skip is -test.skip's pattern in the VM (subtests left out).
	Skip string
	// Modules are kernel modules the guest loads besides the disk's
	// (virtio_mmio, virtio_blk, ext4), with their dependencies.
	Modules []string
	// MemoryMiB is the VM's memory; 1024 by default.
	MemoryMiB int
	// Timeout bounds the VM's run; 5 minutes by default. The tests get
	// a minute less, so that a hung one panics with every goroutine's
	// stack on the console first.
	Timeout time.Duration
}

// Run runs cfg's tests in a VM on cgroup v2 and fails t where they do
// not pass there. It skips in the VM itself, on a node that is cgroup v2
// already (the package's tests ran on v2), and where the node has no
// QEMU, guest kernel or mkfs.ext4, saying which.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if inVM {
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
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = 1024
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "pkg.test")
	build := exec.Command("go", "test", "-c", "-o", bin, cfg.Package)
	build.Dir = testutil.ModuleRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the package's tests for the VM: %v\n%s", err, out)
	}
	mods, err := k.LoadOrder(append([]string{"virtio_mmio", "virtio_blk", "crc32c_generic", "ext4"}, cfg.Modules...)...)
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
	// The kernel hands its command line's unknown key=value words to
	// init as its environment: no spaces in them.
	cmdline := "console=ttyS0 quiet panic=-1 cryptomgr.notests=1 tsc_early_khz=" + strconv.Itoa(microvm.HostTSCkHz()) +
		" " + env + "=init " + env + "_RUN=^(" + strings.Join(cfg.Tests, "|") + ")$ " +
		env + "_TIMEOUT=" + (cfg.Timeout - time.Minute).String()
	if cfg.Skip != "" {
		cmdline += " " + env + "_SKIP=" + cfg.Skip
	}
	var console string
	// A second boot only when the first VM's kernel locked up under TCG
	// (both vCPUs "stuck" for minutes, the tests' processes on them: seen
	// once in ~10 runs here, as microVM boots saw in cryptomgr_test).
	for try := 1; ; try++ {
		disk := filepath.Join(dir, "disk.img")
		if out, err := exec.Command(mkfs, "-q", "-F", disk, "1G").CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v\n%s", err, out)
		}
		ctx, cancel := context.WithTimeout(t.Context(), cfg.Timeout)
		vm := exec.CommandContext(ctx, qemu, "-M", "microvm", "-accel", "tcg,thread=multi", "-cpu", "max",
			"-smp", "2", "-m", strconv.Itoa(cfg.MemoryMiB), "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
			"-kernel", k.Vmlinux, "-initrd", initrd, "-append", cmdline, "-serial", "stdio",
			"-drive", "file="+disk+",if=none,id=disk,format=raw,cache=unsafe",
			"-device", "virtio-blk-device,drive=disk")
		t0 := time.Now()
		out, err := vm.CombinedOutput()
		cancel()
		console = string(out)
		t.Logf("the VM ran %v; its console:\n%s", time.Since(t0).Round(time.Second), console)
		if err != nil && try == 1 && strings.Contains(console, "soft lockup") {
			t.Logf("the guest kernel locked up (QEMU: %v): booting once more", err)
			continue
		}
		if err != nil {
			t.Fatalf("QEMU: %v", err)
		}
		break
	}
	if !strings.Contains(console, "warren-vm: cgroups mode v2") {
		t.Fatal("the VM's tests did not run on cgroup v2")
	}
	if !strings.Contains(console, "warren-vm: exit 0") {
		t.Error("the package's tests failed on cgroup v2 (the console above)")
	}
	for _, name := range cfg.Tests {
		if !regexp.MustCompile(`--- (PASS|SKIP): ` + regexp.QuoteMeta(name) + ` `).MatchString(console) {
			t.Errorf("%s did not pass on cgroup v2", name)
		}
		if strings.Contains(console, "--- SKIP: "+name+" ") {
			t.Logf("%s skipped on cgroup v2", name)
		}
	}
}

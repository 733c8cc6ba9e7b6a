package container

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The init stage runs in the re-executed warren binary, already inside the
// new mount, pid, uts, ipc and net namespaces, before the agent takes over
// as PID 1. It builds the sandbox's view of the world and then replaces
// itself with the agent (a C loop in the same binary) via execveat, so no Go
// runtime stays resident per sandbox.

const initArg0 = "warren-container-init"

// File descriptors handed to the init stage (ExtraFiles start at 3).
const (
	fdConfig   = 3 // read end of a pipe carrying initConfig as JSON
	fdListener = 4 // the agent's listening unix socket
	fdStatus   = 5 // write end of the status pipe; closed by a successful exec
)

// agentEnvFD names the env var that switches the binary into agent mode
// (see internal/agent).
const agentEnvFD = "_WARREN_AGENT_FD"

type initConfig struct {
	Rootfs   string `json:"rootfs"`
	Hostname string `json:"hostname"`
}

func init() {
	if len(os.Args) == 0 || os.Args[0] != initArg0 {
		return
	}
	// Namespaces such as cgroup are per thread; everything below, up to
	// execveat, must happen on this one thread.
	runtime.LockOSThread()
	err := initStage()
	status := os.NewFile(fdStatus, "status")
	fmt.Fprintf(status, "%v", err)
	os.Exit(1)
}

func initStage() error {
	unix.CloseOnExec(fdStatus)
	cfgFile := os.NewFile(fdConfig, "config")
	var cfg initConfig
	// Blocks until the daemon has placed us in our cgroup.
	if err := json.NewDecoder(cfgFile).Decode(&cfg); err != nil {
		return fmt.Errorf("read init config: %w", err)
	}
	cfgFile.Close()
	// The cgroup namespace is made only now so that its root is the
	// sandbox's own cgroup.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare cgroup namespace: %w", err)
	}
	exe, err := unix.Open("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open self: %w", err)
	}
	if err := setupRootfs(cfg.Rootfs); err != nil {
		return err
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	if err := dropBoundingCaps(); err != nil {
		return err
	}
	return execAgent(exe)
}

type mnt struct {
	src, target, fstype string
	flags               uintptr
	data                string
}

func setupRootfs(root string) error {
	// Nothing we mount may leak back to the host, and host mounts made
	// later must not appear here.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("mkdir /%s: %w", d, err)
		}
	}
	const nsd = unix.MS_NOSUID | unix.MS_NODEV
	mounts := []mnt{
		{"proc", "proc", "proc", nsd | unix.MS_NOEXEC, ""},
		{"tmpfs", "dev", "tmpfs", unix.MS_NOSUID | unix.MS_STRICTATIME, "mode=755,size=65536k"},
		{"sysfs", "sys", "sysfs", nsd | unix.MS_NOEXEC | unix.MS_RDONLY, ""},
	}
	for _, m := range mounts {
		if err := unix.Mount(m.src, filepath.Join(root, m.target), m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on /%s: %w", m.fstype, m.target, err)
		}
	}
	if err := setupDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	if err := maskPaths(root); err != nil {
		return err
	}
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir rootfs: %w", err)
	}
	// pivot_root(".", ".") stacks the old root on top of the new one;
	// detaching it leaves only the sandbox's own mounts in this namespace.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

// setupDev fills the minimal /dev: the usual character devices (made with
// mknod, cheaper than bind mounts), a private devpts, /dev/shm and links.
func setupDev(dev string) error {
	nodes := []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}
	old := unix.Umask(0)
	defer unix.Umask(old)
	for _, n := range nodes {
		if err := unix.Mknod(filepath.Join(dev, n.name), unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n.name, err)
		}
	}
	for _, d := range []string{"pts", "shm", "mqueue"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return fmt.Errorf("mkdir /dev/%s: %w", d, err)
		}
	}
	if err := unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts: %w", err)
	}
	if err := unix.Mount("shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	if err := unix.Mount("mqueue", filepath.Join(dev, "mqueue"), "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /dev/mqueue: %w", err)
	}
	links := [][2]string{{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}}
	for _, l := range links {
		if err := os.Symlink(l[0], filepath.Join(dev, l[1])); err != nil {
			return fmt.Errorf("symlink /dev/%s: %w", l[1], err)
		}
	}
	return nil
}

// Paths of /proc and /sys that leak host information or control the host.
var (
	maskedFiles = []string{"proc/kcore", "proc/keys", "proc/timer_list", "proc/sched_debug", "proc/latency_stats", "proc/sysrq-trigger"}
	maskedDirs  = []string{"proc/acpi", "proc/scsi", "sys/firmware", "sys/devices/virtual/powercap", "sys/kernel/security", "sys/fs/cgroup"}
	readonly    = []string{"proc/bus", "proc/fs", "proc/irq", "proc/sys"}
)

func maskPaths(root string) error {
	devnull := filepath.Join(root, "dev/null")
	for _, p := range maskedFiles {
		err := unix.Mount(devnull, filepath.Join(root, p), "", unix.MS_BIND, "")
		if err != nil && err != unix.ENOENT {
			return fmt.Errorf("mask /%s: %w", p, err)
		}
	}
	for _, p := range maskedDirs {
		err := unix.Mount("tmpfs", filepath.Join(root, p), "tmpfs", unix.MS_RDONLY, "size=0")
		if err != nil && err != unix.ENOENT {
			return fmt.Errorf("mask /%s: %w", p, err)
		}
	}
	for _, p := range readonly {
		t := filepath.Join(root, p)
		if err := unix.Mount(t, t, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			if err == unix.ENOENT {
				continue
			}
			return fmt.Errorf("bind /%s: %w", p, err)
		}
		if err := unix.Mount(t, t, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("remount /%s read-only: %w", p, err)
		}
	}
	return nil
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// keptCaps is the capability bounding set of every sandbox process: what a
// root user inside needs to manage files and users, nothing that reaches the
// kernel or devices (no CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_MKNOD, CAP_NET_RAW,
// CAP_SYS_PTRACE, CAP_SYS_MODULE ...).
var keptCaps = map[int]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FSETID: true, unix.CAP_FOWNER: true,
	unix.CAP_SETGID: true, unix.CAP_SETUID: true, unix.CAP_SETPCAP: true, unix.CAP_SETFCAP: true,
	unix.CAP_NET_BIND_SERVICE: true, unix.CAP_SYS_CHROOT: true, unix.CAP_KILL: true, unix.CAP_AUDIT_WRITE: true,
}

func dropBoundingCaps() error {
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if keptCaps[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	return nil
}

func execAgent(exe int) error {
	argv0, _ := unix.BytePtrFromString("warren-init")
	env0, _ := unix.BytePtrFromString(agentEnvFD + "=" + strconv.Itoa(fdListener))
	empty, _ := unix.BytePtrFromString("")
	argv := []*byte{argv0, nil}
	envv := []*byte{env0, nil}
	_, _, errno := unix.RawSyscall6(unix.SYS_EXECVEAT, uintptr(exe), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envv[0])), unix.AT_EMPTY_PATH, 0)
	return fmt.Errorf("execveat agent: %w", errno)
}

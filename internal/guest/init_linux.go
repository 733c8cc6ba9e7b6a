package guest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Main runs the agent as the VM's PID 1. It returns only on a failure to
// come up, which the caller reports before the kernel panics.
func Main() error {
	log.SetFlags(0)
	log.SetPrefix("warren-guest: ")
	if err := mountBase(); err != nil {
		return err
	}
	held, err := takeLimits()
	if err != nil {
		return err
	}
	// bench vm's floor: the boot to /init alone.
	if cmdlineInt("poweroff") == 1 {
		return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
	if err := LoadModules(ModuleOrder); err != nil {
		return err
	}
	if h := cmdlineString("hostname"); h != "" {
		if err := unix.Sethostname([]byte(h)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	if err := networkUp(); err != nil {
		return err
	}
	hasRoot := cmdlineInt("layers") > 0
	if err := mountRoot(cmdlineInt("layers")); err != nil {
		return err
	}
	if hasRoot {
		if err := writeResolvConf(); err != nil {
			return err
		}
	}
	var ns *sandboxNS
	var cg *os.File
	if hasRoot {
		var err error
		if ns, err = startSandboxInit(); err != nil {
			return err
		}
		if cg, err = sandboxCgroup(int64(cmdlineInt("memory")), int64(cmdlineInt("pids"))); err != nil {
			return err
		}
	}
	raiseLimits(held)
	if err := dropBoundingCaps(); err != nil {
		return err
	}
	srv := &server{r: newReaper(), ns: ns, bg: newBGTable(), held: held}
	if cg != nil {
		srv.cg, srv.cgDir = cg, sandboxCgroupDir
	} else {
		srv.cgErr = errors.New("no sandbox cgroup in a VM without layers")
	}
	if cmdlineString("transport") == TransportVsock {
		return srv.serveVsock("")
	}
	port, err := findPort(PortName, 10*time.Second)
	if err != nil {
		return err
	}
	go srv.watchPorts(port)
	return srv.servePort(port)
}

func mountBase() error {
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/tmp", "tmpfs"},
		{"tmpfs", "/run", "tmpfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fs, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	return nil
}

// LoadModules loads the modules listed in order (one path per line,
// dependencies first), as the host resolved them (microvm.AddModules).
// Also the init of the cgroups package's v2 VM (TestCgroupV2InAVM).
func LoadModules(order string) error {
	b, err := os.ReadFile(order)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, p := range strings.Fields(string(b)) {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", p, err)
		}
	}
	return nil
}

// findPort waits for the virtio-serial port named name to appear.
func findPort(name string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			if b, err := os.ReadFile(n); err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(n))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port %q after %v", name, wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reaper is PID 1's wait loop: it collects every child, the ones it
// started (whose status goes to their caller) and orphans.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan syscall.WaitStatus
	early   map[int]syscall.WaitStatus
}

func newReaper() *reaper {
	r := &reaper{waiting: map[int]chan syscall.WaitStatus{}, early: map[int]syscall.WaitStatus{}}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			r.reap()
		}
	}()
	return r
}

func (r *reaper) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		if c, ok := r.waiting[pid]; ok {
			delete(r.waiting, pid)
			c <- ws
		} else {
			r.early[pid] = ws
		}
		r.mu.Unlock()
	}
}

// start starts cmd and returns where its status will come. The lock is
// held across the start, so the reaper cannot see the exit first.
func (r *reaper) start(cmd *exec.Cmd) (<-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := make(chan syscall.WaitStatus, 1)
	if ws, ok := r.early[cmd.Process.Pid]; ok {
		delete(r.early, cmd.Process.Pid)
		c <- ws
	} else {
		r.waiting[cmd.Process.Pid] = c
	}
	return c, nil
}

// server is the agent's state: what every call shares.
type server struct {
	r  *reaper
	ns *sandboxNS // nil in a VM without layers: commands run in the guest's root
	bg *bgTable
	// held are the sandbox's limits the agent holds, which its commands
	// inherit (takeLimits).
	held map[int]Rlimit
	// whole: the agent is a service of a full OS (ServiceMain), whose
	// whole guest is the sandbox.
	whole bool
	// cg is the cgroup the commands start in (CLONE_INTO_CGROUP), whose
	// memory and pids limits are the sandbox's, and cgDir its directory;
	// nil and "" where there is none, cgErr saying why.
	cg    *os.File
	cgDir string
	cgErr error
}

func (s *server) serve(st net.Conn) {
	defer st.Close()
	br := bufio.NewReader(st)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		fail(st, errdefs.Invalid, fmt.Errorf("bad request: %w", err))
		return
	}
	switch req.Op {
	case "ping":
		var uts unix.Utsname
		_ = unix.Uname(&uts)
		var info unix.Sysinfo_t
		_ = unix.Sysinfo(&info)
		b, _ := os.ReadFile("/proc/uptime")
		var up float64
		fmt.Sscan(string(b), &up)
		out, _ := json.Marshal(Ping{Kernel: unix.ByteSliceToString(uts.Release[:]), UptimeMs: up * 1000})
		_ = WriteFrame(st, KindExit, out)
	case "exec":
		s.execOne(st, br, req)
	case "dial":
		dialPort(st, br, req.Port)
	case "cgroup":
		s.cgroupStats(st)
	case "reclaim":
		s.reclaim(st)
	case "bg_start":
		s.bgStart(st, req)
	case "bg_list":
		s.bgList(st)
	case "bg_attach":
		s.bgAttach(st, br, req)
	case "bg_stdin":
		s.bgStdin(st, br, req)
	case "bg_closein", "bg_signal", "bg_resize", "bg_forget":
		s.bgCall(st, req)
	case "limits":
		s.setLimits(st, req.Limits)
	case "restored":
		restored(st, req.Restored)
	case "network":
		root := "/"
		if s.ns != nil {
			root = RootDir
		}
		renetwork(st, req.Network, root)
	case "fs":
		if req.FS == nil {
			fail(st, errdefs.Invalid, errors.New("fs: no call"))
			return
		}
		root := "/"
		if s.ns != nil {
			root = RootDir
		}
		serveFS(st, br, req.FS, root)
	default:
		fail(st, errdefs.Unsupported, fmt.Errorf("unknown op %q", req.Op))
	}
}

// RootDir is where the guest composes the sandbox's root from its layers
// (read-only virtio block devices holding EROFS images, named by their
// serial "layerN", layer0 the bottom) and a writable tmpfs upper;
// commands run chrooted there.
const RootDir = "/sandbox"

// LayerSerial is the serial the host gives layer i's device.
func LayerSerial(i int) string { return fmt.Sprintf("layer%d", i) }

// mountRoot mounts n EROFS layers and an overlay over them at RootDir.
func mountRoot(n int) error {
	if n == 0 {
		return nil
	}
	var lowers []string
	pmem := pmemLayers()
	for i := 0; i < n; i++ {
		dev, opts, err := "", "", error(nil)
		if i < len(pmem) {
			dev, err = findPmem(pmem[i], 10*time.Second)
			opts = "dax=always"
		} else {
			dev, err = findBlock(LayerSerial(i), 10*time.Second)
		}
		if err != nil {
			return err
		}
		dst := fmt.Sprintf("/layers/%d", i)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(dev, dst, "erofs", unix.MS_RDONLY, opts); err != nil {
			return fmt.Errorf("mount layer %d (%s): %w", i, dev, err)
		}
		lowers = append([]string{dst}, lowers...) // overlayfs wants the top first
	}
	for _, d := range []string{"/rw", RootDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := mountUpper("/rw"); err != nil {
		return err
	}
	for _, d := range []string{"/rw/upper", "/rw/work"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=/rw/upper,workdir=/rw/work"
	if err := unix.Mount("overlay", RootDir, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount the sandbox root: %w", err)
	}
	for _, m := range []struct {
		src, dst, fs string
		flags        uintptr
	}{
		{"proc", RootDir + "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"tmpfs", RootDir + "/dev", "tmpfs", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"tmpfs", RootDir + "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV},
		{"sysfs", RootDir + "/sys", "sysfs", unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fs, m.flags, ""); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := makeDev(RootDir + "/dev"); err != nil {
		return err
	}
	return maskProc(RootDir + "/proc")
}

// maskProc empties what tells of the kernel's memory and timers, as in a
// container (kcore alone would feed a reader the guest's whole memory),
// and makes proc's sys read-only.
func maskProc(proc string) error {
	for _, f := range []string{"kcore", "timer_list", "sched_debug", "keys"} {
		p := proc + "/" + f
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := unix.Mount("/dev/null", p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mask /proc/%s: %w", f, err)
		}
	}
	sys := proc + "/sys"
	if err := unix.Mount(sys, sys, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind /proc/sys: %w", err)
	}
	if err := unix.Mount("", sys, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make /proc/sys read-only: %w", err)
	}
	return nil
}

// findBlock waits for the virtio block device whose serial is serial.
func findBlock(serial string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		ss, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, p := range ss {
			if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == serial {
				dev := "/dev/" + filepath.Base(filepath.Dir(p))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no block device with serial %s after %v", serial, wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cmdlineString reads warren.KEY=VALUE from the kernel command line.
func cmdlineString(key string) string {
	b, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, "warren."+key+"="); ok {
			return v
		}
	}
	return ""
}

// cmdlineInt reads warren.KEY=N from the kernel command line.
func cmdlineInt(key string) int {
	var n int
	fmt.Sscan(cmdlineString(key), &n)
	return n
}

// loopbackUp brings lo up, as a container's network namespace has it.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}

// fail sends an 'f' frame for err, with its category.
func fail(w io.Writer, cat errdefs.Category, err error) {
	b, _ := json.Marshal(Failure{Category: cat.String(), Error: err.Error()})
	_ = WriteFrame(w, KindFail, b)
}

// makeDev fills the sandbox's /dev (a tmpfs) with the standard nodes, a
// terminal filesystem and a /dev/shm, as a container's has: no disks, no
// memory devices.
func makeDev(dev string) error {
	for _, n := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		if err := unix.Mknod(dev+"/"+n.name, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("make /dev/%s: %w", n.name, err)
		}
		_ = os.Chmod(dev+"/"+n.name, 0o666)
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(dev+"/"+d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := os.Symlink("pts/ptmx", dev+"/ptmx"); err != nil {
		return err
	}
	if err := unix.Mount("shm", dev+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	for _, l := range [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}} {
		if err := os.Symlink(l[0], dev+"/"+l[1]); err != nil {
			return err
		}
	}
	return nil
}

// keptCaps bound what root in the sandbox may do, as in a container
// (internal/container's init): files and users, nothing that reaches the
// kernel or devices (no SYS_ADMIN, NET_ADMIN, MKNOD, NET_RAW, SYS_PTRACE).
// The VM is the boundary; this keeps the sandbox's processes from
// undoing what the agent set up (its mounts, its /dev).
var keptCaps = []int{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_FOWNER, unix.CAP_SETGID, unix.CAP_SETUID,
	unix.CAP_SETPCAP, unix.CAP_SETFCAP, unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT, unix.CAP_KILL, unix.CAP_AUDIT_WRITE}

// dropBoundingCaps drops the others from the bounding set: the agent keeps
// its own, and every process it starts gets at most these.
func dropBoundingCaps() error {
	for c := 0; c <= 63; c++ {
		keep := false
		for _, k := range keptCaps {
			keep = keep || k == c
		}
		if keep {
			continue
		}
		// Capabilities are a thread's: every thread of the agent (any
		// may fork a command) drops it.
		if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
			if e == unix.EINVAL { // past the kernel's last capability
				return nil
			}
			return fmt.Errorf("drop capability %d: %w", c, e)
		}
	}
	return nil
}

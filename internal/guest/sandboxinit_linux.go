package guest

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The sandbox's own pid and mount namespaces inside the VM, as a
// container has them: commands see their processes only (not the guest's
// kernel threads and agent), under PID 1 "warren-init", in a root that
// is the sandbox's (moved over the namespace's root). The agent
// starts warren-init (itself again, in the role below) before it drops
// capabilities; each command is started from a thread of the agent that
// joined both namespaces, so it is the agent's child (its exit status and
// streams are the agent's) and lives in the sandbox.

// roleEnv selects warren-init's role in the re-executed agent.
const roleEnv = "WARREN_GUEST_ROLE=sandbox-init"

// IsSandboxInit reports whether this process is warren-init.
func IsSandboxInit() bool {
	for _, e := range os.Environ() {
		if e == roleEnv {
			return true
		}
	}
	return false
}

// sandboxNS is warren-init's namespaces, opened once.
type sandboxNS struct {
	pid, mnt *os.File
}

// startSandboxInit starts warren-init in new pid and mount namespaces
// and returns them.
func startSandboxInit() (*sandboxNS, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{roleEnv}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Setsid: true}
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	cmd.ExtraFiles = []*os.File{wr}
	if err := cmd.Start(); err != nil {
		wr.Close()
		return nil, fmt.Errorf("start warren-init: %w", err)
	}
	wr.Close()
	// It says it is ready (its mounts made) by closing its end; a
	// message before that is why it failed.
	msg, _ := readAll(rd)
	if len(msg) > 0 {
		return nil, fmt.Errorf("warren-init: %s", msg)
	}
	pid := cmd.Process.Pid
	ns := &sandboxNS{}
	if ns.pid, err = os.Open(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil {
		return nil, err
	}
	if ns.mnt, err = os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err != nil {
		return nil, err
	}
	return ns, nil
}

func readAll(f *os.File) ([]byte, error) {
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out, nil
		}
	}
}

// SandboxInitMain is warren-init: PID 1 of the sandbox's pid namespace.
// It makes the sandbox's mounts in its own mount namespace, says it is
// ready (closes fd 3), drops its capabilities, and reaps orphans forever.
func SandboxInitMain() {
	ready := os.NewFile(3, "ready")
	if err := sandboxMounts(); err != nil {
		fmt.Fprint(ready, err.Error())
		os.Exit(1)
	}
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	// The name is a thread's: the leader's is what /proc/1/comm shows,
	// and this goroutine may run on another thread (PR_SET_NAME here
	// named one at random).
	_ = os.WriteFile(fmt.Sprintf("/proc/self/task/%d/comm", os.Getpid()), []byte("warren-init"), 0)
	ready.Close()
	runtime.GOMAXPROCS(1)
	// SIGCHLD through the runtime, not pause(2): a Go process takes a
	// signal on whichever thread the kernel picks, so a pause on another
	// one slept through orphans that arrived after an ECHILD, and their
	// zombies stayed (a killed command's background children, seen by ps).
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	for {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
		}
		<-chld
	}
}

// sandboxMounts moves into the sandbox root: proc of the new pid
// namespace (with the masks), then RootDir moved onto /.
func sandboxMounts() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	procDir := RootDir + "/proc"
	// The guest's proc (and the masks on it) go; this namespace's comes.
	for {
		if err := unix.Unmount(procDir, unix.MNT_DETACH); err != nil {
			break
		}
	}
	if err := unix.Mount("proc", procDir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	if err := maskProc(procDir); err != nil {
		return err
	}
	// The guest's root is the initramfs (rootfs), which pivot_root
	// refuses: the sandbox root is moved over it instead, as switch_root
	// does, in this namespace only. Climbing out of the chroot ends at
	// the namespace's root, under which the move put the sandbox's.
	if err := os.Chdir(RootDir); err != nil {
		return err
	}
	if err := unix.Mount(RootDir, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the sandbox root onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return os.Chdir("/")
}

// startIn starts cmd from a thread that joined the sandbox's namespaces.
// The thread is never given back (it ends with its goroutine).
func (ns *sandboxNS) startIn(start func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare fs: %w", err)
			return
		}
		if err := unix.Setns(int(ns.pid.Fd()), unix.CLONE_NEWPID); err != nil {
			errc <- fmt.Errorf("join the sandbox's pid namespace: %w", err)
			return
		}
		if err := unix.Setns(int(ns.mnt.Fd()), unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("join the sandbox's mount namespace: %w", err)
			return
		}
		errc <- start()
	}()
	return <-errc
}

// nsPid is pid's pid in its own (innermost) pid namespace.
func nsPid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return pid
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if n, err := strconv.Atoi(f[len(f)-1]); err == nil {
				return n
			}
		}
	}
	return pid
}

// sandboxCgroup makes the sandbox's cgroup (v2, in the guest) with its
// memory and pids limits (0: none) and returns its directory. The agent
// and warren-init stay out of it, so the OOM killer the limit wakes
// takes the sandbox's processes, never what serves the host; warren-init
// is also exempt from the guest's own OOM killer.
func sandboxCgroup(memory, pids int64) (*os.File, error) {
	const root = "/sys/fs/cgroup"
	if err := unix.Mount("cgroup2", root, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil && err != unix.EBUSY {
		return nil, fmt.Errorf("mount cgroup2: %w", err)
	}
	if err := os.WriteFile(root+"/cgroup.subtree_control", []byte("+memory +pids +cpu"), 0); err != nil {
		return nil, fmt.Errorf("enable cgroup controllers: %w", err)
	}
	dir := sandboxCgroupDir
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return nil, err
	}
	if memory > 0 {
		if err := os.WriteFile(dir+"/memory.max", []byte(strconv.FormatInt(memory, 10)), 0); err != nil {
			return nil, fmt.Errorf("memory limit: %w", err)
		}
		// No swap in the guest, but say it.
		_ = os.WriteFile(dir+"/memory.swap.max", []byte("0"), 0)
	}
	if pids > 0 {
		if err := os.WriteFile(dir+"/pids.max", []byte(strconv.FormatInt(pids, 10)), 0); err != nil {
			return nil, fmt.Errorf("pids limit: %w", err)
		}
	}
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	return os.Open(dir)
}

// Package microvm runs sandboxes as QEMU microVMs (`-M microvm`): a
// Debian kernel booted through its PVH entry point, an initramfs whose
// PID 1 is Warren's guest agent (internal/guest), the image's EROFS
// layers as read-only virtio block devices, or with Config.PMEM as
// persistent memory the guest mounts with DAX (pmem.go: every VM on the
// node then reads a layer from the host's one page cache of its file),
// a network device on a tap of the node and a disk for the writable
// layer where the sandbox has them (devices.go, disk.go), a balloon with
// free page reporting (balloon.go), and one virtio-serial port to the
// agent carrying yamux streams. KVM where the node has it, TCG where it
// does not (here).
package microvm

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/initramfs"
)

// guestModules are the drivers the guest loads (Debian builds them as
// modules): the virtio transport of -M microvm, the agent's port, the
// layers' block devices and filesystems (crc32c_generic: the algorithm
// libcrc32c asks the crypto API for, a soft dependency .modinfo does not
// make a load-order one), and the balloon whose free page reporting gives
// the node back what the guest frees (balloon.go).
var guestModules = []string{"virtio_mmio", "virtio_console", "virtio_blk", "crc32c_generic", "erofs", "overlay", "virtio_balloon"}

// Config is one VM.
type Config struct {
	QEMU       string // qemu-system-x86_64
	Kernel     guestkernel.Kernel
	GuestAgent string   // the static warren-guest binary
	Dir        string   // the VM's own directory: sockets, console log, initramfs
	Layers     []string // EROFS layer files, bottom first
	MemoryMB   int
	CPUs       int
	// KVM asks for hardware virtualization; TCG otherwise.
	KVM bool
	// Hostname is the guest's ([a-zA-Z0-9.-], the daemon checks it).
	Hostname string
	// CacheDir holds the initramfs images VMs share; default: Dir's
	// parent's parent.
	CacheDir string
	// SandboxMemory and SandboxPids limit the sandbox's processes in the
	// guest (its cgroup), 0 for none; the VM's memory must hold them and
	// the guest's kernel and agent.
	SandboxMemory, SandboxPids int64
	// Rlimits are the sandbox's processes' (the agent holds those it can
	// itself, for them to inherit: guest.FormatRlimits).
	Rlimits []guest.Rlimit
	// Net, if set, gives the VM a network device on a tap (devices.go).
	Net *Net
	// Disk, if set, is an ext4 image that holds the sandbox's writable
	// layer instead of a tmpfs (disk.go).
	Disk string
	// NoBalloon leaves out the virtio balloon and its free page
	// reporting (balloon.go): the guest's freed memory stays with QEMU.
	NoBalloon bool
	// PMEM maps the layers as persistent memory the guest mounts with DAX
	// (pmem.go) instead of virtio block devices.
	PMEM bool
	// Args, when set, are QEMU's whole command line (another machine:
	// internal/fullvm), which must give the agent's port on Dir's
	// AgentSocket and QMP on its QMPSocket; no initramfs is built.
	Args []string
	// Cgroup, if set, is the VM's host cgroup (NewHostGroup): QEMU joins
	// it before it runs (startQEMU), and it is removed once QEMU is gone.
	Cgroup cgroups.Group
	// Vsock, if set, carries the agent's sessions over vsock instead of
	// the virtio-serial port (vsock.go).
	Vsock *Vsock
}

// VM is a running microVM.
type VM struct {
	cfg Config
	cmd *exec.Cmd // nil for a VM an earlier daemon booted (Attach)
	pid int
	// pidfd holds an attached VM's QEMU, which is not this process's
	// child (-1 for one it booted).
	pidfd int
	// smu guards sess and conn, which a lost agent's reconnect replaces
	// (liveness.go); losses counts those.
	smu    sync.Mutex
	sess   *yamux.Session
	conn   io.Closer
	losses atomic.Int64
	// vsockUp is set once the guest agent listened on vsock
	// (vsockListening).
	vsockUp atomic.Bool
	done    chan struct{} // closed when QEMU exited
	closed  chan struct{} // closed by Close
	err     error         // its exit, once done
	once    sync.Once
	// cgDone is closed once QEMU is gone and its cgroup removed (cgErr
	// the removal's error); nil without a cgroup.
	cgDone chan struct{}
	cgErr  error
	// Ready is how long the boot took, to the agent's first answer.
	Ready time.Duration
	// GuestUptime is the guest kernel's uptime at its first answer.
	GuestUptime time.Duration
}

// BootWithin is Boot bounded by d: a guest whose agent has not answered
// by then (one stuck in a soft lockup in its kernel's boot under TCG held
// a CI run's create for 16 minutes) fails Unavailable, the error naming
// the bound, what (the backend) and the console's tail, and its QEMU
// goes. The VM outlives the bound once booted.
func BootWithin(ctx context.Context, cfg Config, d time.Duration, what string) (*VM, error) {
	bctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := Boot(bctx, cfg)
	if err != nil && ctx.Err() == nil && bctx.Err() != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, fmt.Sprintf("%s: the guest's agent did not answer within %v", what, d))
	}
	return v, err
}

// Boot starts a VM and waits until its agent answers.
func Boot(ctx context.Context, cfg Config) (_ *VM, err error) {
	t0 := time.Now()
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = 256
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = 1
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create VM directory")
	}
	port := filepath.Join(cfg.Dir, AgentSocket)
	_ = os.Remove(port)
	args := cfg.Args
	if args == nil {
		initrd, err := buildInitramfs(cfg)
		if err != nil {
			return nil, err
		}
		if args, err = qemuArgs(cfg, initrd, port, filepath.Join(cfg.Dir, qmpSocket)); err != nil {
			return nil, err
		}
	}
	var extra []*os.File
	if cfg.Net != nil {
		extra = []*os.File{cfg.Net.Tap} // fd 3: deviceArgs
	}
	if cfg.vhostUser() {
		if err := startVsockBackend(ctx, cfg); err != nil {
			return nil, err
		}
	}
	v, err := startQEMU(cfg, args, extra)
	if err != nil {
		if cfg.vhostUser() {
			killVsockBackend(cfg.Dir)
		}
		return nil, err
	}
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	ping, err := v.connect(ctx, port, BootPortID, "the guest agent")
	if err != nil {
		return nil, err
	}
	v.Ready = time.Since(t0)
	v.GuestUptime = time.Duration(ping.UptimeMs * float64(time.Millisecond))
	return v, nil
}

// startQEMU starts QEMU with args (extra files from its fd 3 on), its
// output to the VM's console log, in a session of its own: a signal to
// the daemon's group is not the VM's. No parent-death signal (it follows
// the thread that forked, which the Go runtime may end): a daemon that
// dies leaves the VM, and the next one stops it (Backend.Adopt, Sweep).
// With cfg.Cgroup, QEMU starts in it (cgroupShim).
func startQEMU(cfg Config, args []string, extra []*os.File) (*VM, error) {
	cmd, goAhead, err := groupCommand(cfg.Cgroup, "qemu", cfg.QEMU, args)
	if err != nil {
		return nil, err
	}
	defer goAhead.close()
	cmd.ExtraFiles = extra
	console, err := os.Create(filepath.Join(cfg.Dir, "console.log"))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create console log")
	}
	defer console.Close()
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "start qemu")
	}
	v := &VM{cfg: cfg, cmd: cmd, pid: cmd.Process.Pid, pidfd: -1, done: make(chan struct{}), closed: make(chan struct{})}
	if cfg.Cgroup != nil {
		v.cgDone = make(chan struct{})
	}
	go func() {
		v.err = cmd.Wait()
		v.ended()
		close(v.done)
	}()
	if err := goAhead.run(cmd); err != nil {
		<-v.done
		return nil, err
	}
	return v, nil
}

// shimPipe is the write end of a command's cgroupShim's standard input
// (nil for a command started without a cgroup: groupCommand).
type shimPipe struct {
	r, w *os.File
	grp  cgroups.Group
	name string
}

// groupCommand is bin with args, to be started in grp (nil: none): then
// it is cgroupShim running it, which waits for the go-ahead's run, so that
// the process is in grp before bin runs. name names it in errors and as
// the shim's $0. The caller closes the go-ahead once cmd started.
func groupCommand(grp cgroups.Group, name, bin string, args []string) (*exec.Cmd, *shimPipe, error) {
	if grp == nil {
		return exec.Command(bin, args...), nil, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "start "+name)
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", cgroupShim, name, bin}, args...)...)
	cmd.Stdin = r
	return cmd, &shimPipe{r: r, w: w, grp: grp, name: name}, nil
}

// run puts the started cmd in the group and lets bin run; on an error the
// command ends without running it (the caller waits for that).
func (p *shimPipe) run(cmd *exec.Cmd) error {
	if p == nil {
		return nil
	}
	if err := p.grp.AddProc(cmd.Process.Pid); err != nil {
		p.w.Close() // the shim exits without running bin
		return err
	}
	if _, err := p.w.Write([]byte("go\n")); err != nil {
		_ = cmd.Process.Kill()
		return errdefs.Wrap(errdefs.Internal, err, "start "+p.name+" in its cgroup")
	}
	return nil
}

// close closes the pipe's ends (twice is harmless).
func (p *shimPipe) close() {
	if p != nil {
		p.r.Close()
		p.w.Close()
	}
}

// cgroupShim is the shell that becomes QEMU once the host has put it in
// the VM's cgroup: it waits for "go" on its standard input, then execs
// QEMU in its place (the same pid), so that every page and thread QEMU
// makes is the VM's cgroup's from its first instruction (v1 moves no
// charge with a process, and the memory and cpu hierarchies are v1
// here). A pipe closed without it ends the shell before QEMU runs.
const cgroupShim = `read -r go && [ "$go" = go ] && exec "$@" </dev/null`

// ended releases what QEMU leaves once it is gone (a crash, or Close):
// the vsock backend that served it, and its cgroup. Either left behind
// would outlive its sandbox.
func (v *VM) ended() {
	if v.cfg.vhostUser() {
		killVsockBackend(v.cfg.Dir)
	}
	v.removeCgroup()
}

// removeCgroup removes the VM's cgroup.
func (v *VM) removeCgroup() {
	if v.cfg.Cgroup == nil {
		return
	}
	// QEMU forks nothing; Kill finds the group empty unless something
	// joined it meanwhile.
	v.cgErr = dropGroup(v.cfg.Cgroup)
	close(v.cgDone)
}

// connect reaches the agent on the port socket sock (of the port whose
// device id is portID) and waits for its first answer (what names it in
// the error); then it follows the port (watchAgent).
func (v *VM) connect(ctx context.Context, sock, portID, what string) (guest.Ping, error) {
	var ping guest.Ping
	conn, err := v.dialAgent(ctx, sock)
	if err != nil {
		return ping, err
	}
	v.conn = conn
	if v.sess, err = agentSession(conn); err != nil {
		return ping, err
	}
	if err := v.call(ctx, guest.Request{Op: "ping"}, nil, &ping); err != nil {
		return ping, fmt.Errorf("wait for %s: %w (console: %s)", what, err, v.consoleTail())
	}
	if v.cfg.Vsock != nil {
		v.watchVsock()
	} else {
		v.watchAgent(sock, portID)
	}
	return ping, nil
}

// dialAgent connects to the agent: over vsock, or to its port's socket
// sock.
func (v *VM) dialAgent(ctx context.Context, sock string) (io.ReadWriteCloser, error) {
	if v.cfg.Vsock != nil {
		return v.dialVsock(ctx)
	}
	return v.dial(ctx, sock)
}

// agentSession is the host's end of a session with the agent.
func agentSession(conn io.ReadWriteCloser) (*yamux.Session, error) {
	ycfg := yamux.DefaultConfig()
	ycfg.LogOutput = io.Discard
	ycfg.EnableKeepAlive = false
	// A boot under TCG takes seconds before the guest reads its port (and
	// a paused VM's guest none until it is resumed).
	ycfg.StreamOpenTimeout = 0
	sess, err := yamux.Client(conn, ycfg)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "agent session")
	}
	return sess, nil
}

// qmpSocket is the VM's QMP socket in its directory (internal/qmp).
const qmpSocket = "qmp.sock"

func qemuArgs(cfg Config, initrd, port, qmpPath string) ([]string, error) {
	accel := "tcg,thread=multi"
	if cfg.KVM {
		accel = "kvm"
	}
	// -M microvm has no HPET, and under TCG on a loaded node the guest
	// fails to calibrate its TSC against the PIT, then hangs calibrating
	// its timer: it is told the TSC's rate, which TCG takes from the
	// host's (HostTSCkHz).
	// cryptomgr.notests: the kernel's boot-time self-tests of its crypto
	// algorithms cost boot time a sandbox has no use for, and one hung in
	// a soft lockup under TCG on a loaded node (cryptomgr_test, 14 min).
	cmdline := "console=ttyS0 quiet panic=-1 cryptomgr.notests=1 tsc_early_khz=" + strconv.Itoa(HostTSCkHz()) + " warren.layers=" + strconv.Itoa(len(cfg.Layers))
	if cfg.SandboxMemory > 0 {
		cmdline += " warren.memory=" + strconv.FormatInt(cfg.SandboxMemory, 10)
	}
	if cfg.SandboxPids > 0 {
		cmdline += " warren.pids=" + strconv.FormatInt(cfg.SandboxPids, 10)
	}
	if len(cfg.Rlimits) > 0 {
		cmdline += " warren.rlimits=" + guest.FormatRlimits(cfg.Rlimits)
	}
	if cfg.Hostname != "" {
		if strings.ContainsFunc(cfg.Hostname, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
		}) {
			return nil, errdefs.Invalidf("hostname %q: letters, digits, '.', '-' and '_' only", cfg.Hostname)
		}
		cmdline += " warren.hostname=" + cfg.Hostname
	}
	machine := "microvm"
	var pmem []string
	if cfg.PMEM && len(cfg.Layers) > 0 {
		var extra string
		var err error
		if pmem, extra, err = pmemArgs(cfg); err != nil {
			return nil, err
		}
		cmdline += extra
		machine += ",pcie=on" // pmem.go says why
	}
	if cfg.vhostUser() && pmem == nil {
		machine += ",memory-backend=ram"
	}
	args := []string{
		"-M", machine, "-accel", accel, "-cpu", "max",
		"-smp", strconv.Itoa(cfg.CPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", cfg.Kernel.Vmlinux, "-initrd", initrd, "-append", cmdline,
		"-serial", "stdio",
	}
	if cfg.Vsock != nil {
		more, extra := vsockArgs(cfg)
		args = append(args, more...)
		args[slices.Index(args, "-append")+1] += extra
	} else {
		args = append(args,
			"-device", "virtio-serial-device",
			"-chardev", "socket,id=agent,path="+port+",server=on,wait=off",
			"-device", "virtserialport,id="+BootPortID+",chardev=agent,name="+guest.PortName)
	}
	args = append(args, "-qmp", "unix:"+qmpPath+",server=on,wait=off")
	args = append(args, EventArgs(cfg.Dir)...)
	for i, l := range cfg.Layers {
		if _, err := os.Stat(l); err != nil {
			return nil, errdefs.Wrap(errdefs.NotFound, err, "layer")
		}
		if strings.ContainsAny(l, ",=") {
			return nil, errdefs.Invalidf("layer path %q has a character QEMU's option syntax takes (, or =)", l)
		}
		// Read-only virtio block devices: the guest finds each by its
		// serial. QEMU reads the file through the host's page cache,
		// one copy for every VM of the node; the guest keeps its own
		// copy of what it read. virtio-pmem with DAX would spare that
		// copy, but -M microvm in QEMU 7.2 gives memory devices no
		// address (nd_pmem: "could not reserve region [mem
		// 0x00000000-...]"); it works on q35 (docs/MICROVM.md). Config.PMEM
		// maps them as legacy persistent memory instead (pmem.go).
		if pmem != nil {
			continue
		}
		id := guest.LayerSerial(i)
		args = append(args,
			"-drive", fmt.Sprintf("file=%s,if=none,id=%s,format=raw,readonly=on,cache=writeback", l, id),
			"-device", fmt.Sprintf("virtio-blk-device,drive=%s,serial=%s", id, id))
	}
	more, extra, err := deviceArgs(cfg)
	if err != nil {
		return nil, err
	}
	args = append(args, more...)
	args[slices.Index(args, "-append")+1] += extra
	args = append(args, balloonArgs(cfg)...)
	if pmem != nil {
		return append(args, pmem...), nil
	}
	if cfg.vhostUser() {
		args = append(args, "-object", ramObject(cfg, "ram", strconv.Itoa(cfg.MemoryMB)+"M"))
	}
	args = append(args, "-m", strconv.Itoa(cfg.MemoryMB)+"M")
	return args, nil
}

// dial connects to the agent's port socket, which QEMU makes as it
// starts.
func (v *VM) dial(ctx context.Context, port string) (net.Conn, error) {
	for {
		c, err := net.Dial("unix", port)
		if err == nil {
			return c, nil
		}
		select {
		case <-v.done:
			return nil, errdefs.Unavailablef("qemu exited before it listened: %v (console: %s)", v.err, v.consoleTail())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// open opens a stream to the agent, arms ctx's end as a deadline on it
// and sends req. stop disarms the deadline (false if ctx ended first);
// the caller closes the stream.
func (v *VM) open(ctx context.Context, req guest.Request) (st *yamux.Stream, stop func() bool, err error) {
	sess, err := v.agent(ctx)
	if err != nil {
		return nil, nil, err
	}
	if st, err = sess.OpenStream(); err != nil {
		select {
		case <-v.done:
			return nil, nil, errdefs.Unavailablef("the VM ended: %v (console: %s)", v.err, v.consoleTail())
		default:
		}
		return nil, nil, errdefs.Wrap(errdefs.Unavailable, err, "open a stream to the guest agent")
	}
	// A yamux Close ends only the writing half: a deadline is what
	// wakes a read when the call is cancelled.
	stop = context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Now()) })
	b, _ := json.Marshal(req)
	if _, err := st.Write(append(b, '\n')); err != nil {
		stop()
		st.Close()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, errdefs.Wrap(errdefs.Unavailable, err, "send to the guest agent")
	}
	return st, stop, nil
}

// call sends req on a new stream and reads its frames: output to out (if
// any), the final 'x' frame into res.
func (v *VM) call(ctx context.Context, req guest.Request, out func(kind byte, b []byte), res any) error {
	lost := v.losses.Load()
	st, stop, err := v.open(ctx, req)
	if err != nil {
		return err
	}
	defer st.Close()
	defer stop()
	// QEMU's end wakes a read too.
	ended := make(chan struct{})
	defer close(ended)
	go func() {
		select {
		case <-v.done:
			_ = st.SetDeadline(time.Now())
		case <-ended:
		}
	}()
	br := bufio.NewReader(st)
	for {
		kind, data, err := guest.ReadFrame(br)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			select {
			case <-v.done:
				return errdefs.Unavailablef("the VM ended: %v (console: %s)", v.err, v.consoleTail())
			default:
			}
			return v.lostErr(err, lost, "read from the guest agent")
		}
		switch kind {
		case guest.KindStdout, guest.KindStderr:
			if out != nil {
				out(kind, data)
			}
		case guest.KindExit:
			return json.Unmarshal(data, res)
		case guest.KindFail:
			return failure(data, "guest agent")
		}
	}
}

// Result is a finished command.
type Result struct {
	Stdout, Stderr []byte
	Exit           backend.ExitStatus
}

// Exec runs argv in the VM's root to its end.
func (v *VM) Exec(ctx context.Context, argv []string, env []string) (Result, error) {
	var r Result
	p, err := v.Start(ctx, backend.ProcSpec{Argv: argv, Env: env, Stdout: true, Stderr: true})
	if err != nil {
		return r, err
	}
	defer p.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.Stdout, _ = io.ReadAll(p.Stdout()) }()
	go func() { defer wg.Done(); r.Stderr, _ = io.ReadAll(p.Stderr()) }()
	wg.Wait()
	r.Exit, err = p.Wait()
	return r, err
}

// Pid is QEMU's.
func (v *VM) Pid() int { return v.pid }

// Close stops the VM (QEMU killed: the guest holds nothing worth a clean
// shutdown yet) and removes its directory.
func (v *VM) Close() error {
	v.once.Do(func() {
		close(v.closed)
		if v.cfg.vhostUser() && v.cfg.Cgroup != nil {
			// A frozen QEMU (a paused vsock VM: stop) would not die.
			_ = v.cfg.Cgroup.Thaw()
		}
		if s := v.session(); s != nil {
			s.Close()
		}
		if v.cmd != nil {
			_ = v.cmd.Process.Kill()
			<-v.done
		} else {
			killPidfd(v.pidfd)
		}
		if v.cfg.vhostUser() {
			killVsockBackend(v.cfg.Dir) // (an attached VM's watcher may not have yet)
		}
		if v.cgDone != nil {
			select {
			case <-v.cgDone:
			case <-time.After(20 * time.Second): // killPidfd's bound, twice
				v.cgErr = errors.New("QEMU did not exit")
			}
		}
		_ = os.RemoveAll(v.cfg.Dir)
	})
	if v.cgErr != nil {
		return errdefs.Wrap(errdefs.Internal, v.cgErr, "remove the VM's cgroup")
	}
	return nil
}

func (v *VM) consoleTail() string {
	b, _ := os.ReadFile(filepath.Join(v.cfg.Dir, "console.log"))
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return s
}

// AddModules puts module files mods (in load order: guestkernel's
// LoadOrder) in initramfs w under /lib/modules, with the list the guest
// loads them by (guest.ModuleOrder, guest.LoadModules).
func AddModules(w *initramfs.Writer, mods []string) error {
	var order []string
	for _, m := range mods {
		name := "lib/modules/" + filepath.Base(m)
		if err := w.AddFile(name, m, 0o644); err != nil {
			return err
		}
		order = append(order, "/"+name)
	}
	return w.Add(initramfs.Entry{Name: guest.ModuleOrder, Data: []byte(strings.Join(order, "\n") + "\n"), Mode: 0o644})
}

// buildInitramfs writes the VM's initramfs: the agent as /init and the
// modules it loads, with their order. Written once per content into the
// cache directory (every VM of a node boots the same one).
func buildInitramfs(cfg Config) (string, error) {
	mods, err := cfg.Kernel.LoadOrder(slices.Concat(modulesFor(cfg), deviceModules(cfg))...)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintln(h, cfg.Kernel.Release)
	for _, p := range append([]string{cfg.GuestAgent}, mods...) {
		fi, err := os.Stat(p)
		if err != nil {
			return "", errdefs.Wrap(errdefs.NotFound, err, "guest initramfs")
		}
		fmt.Fprintln(h, p, fi.Size(), fi.ModTime().UnixNano())
	}
	cache := cfg.CacheDir
	if cache == "" {
		cache = filepath.Dir(filepath.Dir(cfg.Dir))
	}
	out := filepath.Join(cache, "initramfs-"+hex.EncodeToString(h.Sum(nil))[:16]+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	w := initramfs.New()
	if err := w.AddFile("init", cfg.GuestAgent, 0o755); err != nil {
		return "", err
	}
	if err := AddModules(w, mods); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".initramfs-*")
	if err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "write initramfs")
	}
	defer os.Remove(tmp.Name())
	if err := w.Write(tmp); err != nil {
		tmp.Close()
		return "", errdefs.Wrap(errdefs.Internal, err, "write initramfs")
	}
	if err := tmp.Close(); err != nil {
		return "", errdefs.Wrap(errdefs.Internal, err, "write initramfs")
	}
	if err := os.Rename(tmp.Name(), out); err != nil && !errors.Is(err, os.ErrExist) {
		return "", errdefs.Wrap(errdefs.Internal, err, "write initramfs")
	}
	return out, nil
}

// HostTSCkHz is the node's TSC rate as /proc/cpuinfo gives it ("cpu
// MHz"; constant-rate TSCs tick at it), or 2 GHz where it says nothing.
func HostTSCkHz() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz > 0 {
				return int(mhz * 1000)
			}
		}
	}
	return 2000000
}

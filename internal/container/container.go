// Package container is the `container` backend: each sandbox is a set of
// Linux namespaces (mount, pid, uts, ipc, net, cgroup) around an OverlayFS
// root, with one cgroup for its limits and a tiny agent as PID 1. There is
// no helper process per sandbox on the host: the daemon watches each init
// through its cgroup's cgroup.events (or a pidfd: monitor.go), and
// sandboxes keep running when the daemon dies.
package container

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/agent"
	"github.com/warrenrl/warren/internal/agentbin"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/kfile"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/rlimit"
	"github.com/warrenrl/warren/internal/seccomp"
)

// Name is the backend's name in the API.
const Name = "container"

// Options configure the backend.
type Options struct {
	// StateDir holds per-sandbox writable layers: <StateDir>/sandboxes/<id>.
	StateDir string
	// RunDir holds per-sandbox mount points and agent sockets:
	// <RunDir>/sb/<id>. It should be on tmpfs (/run/warren).
	RunDir string
	// CgroupParent is the parent group of all sandboxes (default "warren").
	CgroupParent string
	// InitBinary, if set, is exec'd as each sandbox's init in place of
	// the embedded agent. Only tests set it, to stand in for an init stage
	// that misbehaves; it runs in the sandbox's namespaces with no libc.
	InitBinary string
	// Warn receives warnings about the host, such as the reason the
	// sandbox agent runs from a file under StateDir rather than a memfd
	// (default: dropped).
	Warn func(msg string, args ...any)
	// NoCPUAffinity leaves sandboxes with a CPU quota on all the node's
	// CPUs, seeing all of them (cpus.go): for nodes where the scheduler's
	// freedom to move threads matters more than nproc and os.cpu_count
	// telling the truth.
	NoCPUAffinity bool
	// NetworkSubnet is where sandboxes with a network (modes open and
	// allowlist) take their addresses, a /31 each (netpolicy); zero for
	// netpolicy.DefaultSubnet. Each daemon on a node needs its own.
	NetworkSubnet netip.Prefix
	// NoSeccomp starts sandboxes without the system-call filter
	// (internal/seccomp), still with no_new_privs: for measuring what the
	// filter costs, and for a node where a workload needs a call it
	// refuses.
	NoSeccomp bool
	// ObservePhase, if set, receives the time of each step of every
	// successful create (phases.go): the daemon's
	// warren_sandbox_create_phase_seconds.
	ObservePhase func(phase string, d time.Duration)
	// UserNSIDs is the host id range sandboxes in a user namespace take
	// theirs from (IDsPerSandbox each); zero for DefaultUserNSIDs. Each
	// daemon on a node needs its own.
	UserNSIDs IDRange
	// Devices are character devices the node gives some sandboxes
	// (Spec.Devices, SetDevices: the GPUs), which the devices cgroup then
	// allows (devices.go).
	Devices []backend.Device
}

// Backend is the container backend.
type Backend struct {
	opts  Options
	mon   *monitor
	agent *agentbin.Agent // every sandbox's init and PID 1
	// agentExe is the agent's file on the node's agent tmpfs (agentfs.go),
	// which every sandbox binds and runs from once its init is done.
	agentExe string
	trash    *reaper         // removes deleted sandboxes' state directories
	cpus     *cpuPool        // which CPUs sandboxes with a quota run on
	pool     *dirPool        // ready-made state directories
	netns    *nsPool         // ready-made network namespaces (netnspool.go)
	stage    *os.File        // the mount namespace sandboxes' roots go on (stage.go)
	net      *netpolicy.Node // sandboxes' interfaces and rules
	ids      *idPool         // user-namespace id ranges
	// seccomp and seccompAudit are the compiled filters every init stage
	// installs (hex of their sock_filter entries), compiled once: "" with
	// NoSeccomp. The audit one makes the kernel log deliberate refusals.
	seccomp, seccompAudit string

	sharedMu sync.Mutex // remounting the shared sysfs or devfs
}

var (
	_ backend.Committer  = (*sandbox)(nil)
	_ backend.OOMCounter = (*sandbox)(nil)
	_ backend.Backlogged = (*Backend)(nil)
)

// New checks the host and returns the backend.
func New(opts Options) (*Backend, error) {
	if opts.StateDir == "" || opts.RunDir == "" {
		return nil, errdefs.Invalidf("container backend: StateDir and RunDir are required")
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = "warren"
	}
	b := &Backend{opts: opts, cpus: newCPUPool(), ids: newIDPool(opts.UserNSIDs)}
	if len(opts.Devices) > 0 {
		devs := make([][2]uint32, len(opts.Devices))
		for i, d := range opts.Devices {
			devs[i] = [2]uint32{d.Major, d.Minor}
		}
		cgroups.AllowDevices(devs)
	}
	// The cgroup parent is the daemon's own name on the node; it names
	// its nftables table and interfaces too. Nothing is made before a
	// sandbox asks for a network.
	net, err := netpolicy.New(netpolicy.Options{Name: opts.CgroupParent, Subnet: opts.NetworkSubnet})
	if err != nil {
		return nil, err
	}
	b.net = net
	if !opts.NoSeccomp {
		f, err := seccomp.Default()
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "compile the sandbox system-call filter")
		}
		a, err := seccomp.Audit()
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "compile the sandbox system-call audit filter")
		}
		b.seccomp, b.seccompAudit = f, a
	}
	for _, d := range []string{filepath.Join(opts.StateDir, "sandboxes"), filepath.Join(opts.StateDir, "disks"), filepath.Join(opts.RunDir, "sb")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "create "+d)
		}
	}
	// The init stage and the agent are the embedded standalone binary
	// only: from a memfd, or where the kernel refuses to exec one, from a
	// verified file in the state (or run) directory.
	var ag *agentbin.Agent
	ag, err = agentbin.Open(agentbin.Options{Dirs: []string{opts.StateDir, opts.RunDir}, Warn: opts.Warn})
	if err != nil {
		return nil, err
	}
	b.agent = ag
	if b.agentExe, err = b.ensureAgentExe(agentbin.Binary()); err != nil {
		return nil, err
	}
	// Sandboxes hide host directories of /proc and /sys under read-only
	// binds of this one empty filesystem.
	if err := mountSharedEmpty(b.emptyDir()); err != nil {
		return nil, err
	}
	if b.stage, err = newStage(b.emptyDir()); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "stage")
	}
	if err := os.MkdirAll(b.rootMount(), 0o755); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create root mount point")
	}
	if err := mountSharedSysfs(b.sysfsDir()); err != nil {
		return nil, err
	}
	if err := mountSharedDevfs(b.devfsDir()); err != nil {
		return nil, err
	}
	if err := b.ensureViews(); err != nil {
		return nil, err
	}
	mon, err := newMonitor()
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	b.mon = mon
	if b.trash, err = newReaper(b.trashDir()); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create trash directory")
	}
	if b.pool, err = newDirPool(filepath.Join(opts.StateDir, "pool"), poolSize); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create directory pool")
	}
	b.netns = newNSPool(nsPoolSize)
	if dev, ok := journalless(b.stateDir("")); ok && opts.Warn != nil {
		opts.Warn("sandbox writable layers are on ext4 without a journal: under sandbox churn its inode allocator slows every create (docs/BENCHMARKS.md); a journal, or another filesystem for the state directory, avoids it", "device", dev, "dir", b.stateDir(""))
	}
	return b, nil
}

// Backlog is how many deleted sandboxes' writable layers the reaper has
// yet to remove (backend.Backlogged).
func (b *Backend) Backlog() int { return b.trash.backlog() }

// trashDir holds deleted sandboxes' state directories until the reaper
// has removed them.
func (b *Backend) trashDir() string { return filepath.Join(b.opts.StateDir, "trash") }

func (b *Backend) Name() string { return Name }

// state is what the daemon persists for Adopt.
type state struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // /proc/<pid>/stat field 22, guards against pid reuse
	// Net is the sandbox's network (nil: mode none): a restarted daemon
	// adopts its address and removes its interface and rules on delete.
	Net *netpolicy.Attachment `json:"net,omitempty"`
	// UserNS is the sandbox's id mapping (nil: no user namespace).
	UserNS *UserNS `json:"userns,omitempty"`
}

func (b *Backend) runDir(id string) string   { return filepath.Join(b.opts.RunDir, "sb", id) }
func (b *Backend) stateDir(id string) string { return filepath.Join(b.opts.StateDir, "sandboxes", id) }
func (b *Backend) rootfs(id string) string   { return filepath.Join(b.runDir(id), "rootfs") }

// rootMount is where every init stage mounts its sandbox's overlay before
// pivot_root: inside its own mount namespace, so one empty directory
// serves them all (a directory per sandbox was one more inode and dentry
// each). rootfs(id) is where daemons before this one mounted it; teardown
// still unmounts it there.
func (b *Backend) rootMount() string { return filepath.Join(b.opts.RunDir, "rootfs") }
func (b *Backend) diskImage(id string) string {
	return filepath.Join(b.opts.StateDir, "disks", id+".img")
}
func (b *Backend) socket(id string) string { return filepath.Join(b.runDir(id), "agent.sock") }

// Create builds the sandbox's root, cgroup and namespaces and starts its
// init. Every step pushes its undo onto one cleanup stack.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (_ backend.Sandbox, retErr error) {
	if !backend.ValidID(spec.ID) {
		return nil, errdefs.Invalidf("bad sandbox id %q", spec.ID)
	}
	if len(spec.Layers) == 0 {
		return nil, errdefs.Invalidf("sandbox %s: no image layers", spec.ID)
	}
	if err := checkDevices(spec.Devices); err != nil {
		return nil, err
	}
	if err := checkMounts(spec.Mounts); err != nil {
		return nil, err
	}
	if err := b.fdRoom(); err != nil {
		return nil, err
	}
	if spec.Restore != "" {
		if len(spec.Devices)+len(spec.Mounts) > 0 {
			return nil, errdefs.Unsupportedf("sandbox %s: a restore with extra devices or mounts", spec.ID)
		}
		return b.restore(ctx, spec)
	}
	if err := b.ensureShared(); err != nil {
		return nil, err
	}
	var cu cleanup.Cleanup
	defer func() {
		if retErr != nil {
			_ = cu.Clean()
		}
	}()
	ph := b.newPhases()
	var userns *UserNS
	if spec.UserNS {
		u, err := b.ids.take(spec.ID)
		if err != nil {
			return nil, err
		}
		userns = &u
		cu.Add(func() error { b.ids.release(spec.ID, u); return nil })
	}
	run, st := b.runDir(spec.ID), b.stateDir(spec.ID)
	// The run directory is the sandbox's claim on its id on this node.
	if err := mkdir(run); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, errdefs.AlreadyExistsf("sandbox %s already exists on this node", spec.ID)
		}
		return nil, fsErr(err, "create sandbox directories")
	}
	// A disk limit gets its directories on its own new filesystem;
	// others take ready-made ones from the pool where it has any.
	pooled := spec.DiskBytes == 0 && b.pool.claim(st)
	if !pooled {
		if err := mkdir(st); err != nil && !errors.Is(err, os.ErrExist) {
			_ = removeTree(run)
			return nil, fsErr(err, "create sandbox directories")
		}
	}
	// The init stage creates the /dev directory; one left by a crash
	// would make it fail.
	_ = removeTree(b.devDir(spec.ID))
	cu.Add(func() error { return b.removeDirs(spec.ID, -1) })
	grp := b.newGroup(spec)
	cu.Add(grp.remove)
	if spec.DiskBytes > 0 {
		if err := mountDisk(b.diskImage(spec.ID), st, spec.DiskBytes); err != nil {
			return nil, err
		}
		cu.Add(func() error { return unmountDisk(b.diskImage(spec.ID), st) })
	}
	for _, d := range []string{filepath.Join(st, "upper"), filepath.Join(st, "work")} {
		if pooled {
			break
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, fsErr(err, "create sandbox directories")
		}
	}
	// The upper directory's root is the sandbox's / (a merged directory
	// shows its upper's owner): root inside owns it.
	if err := shiftOwner(filepath.Join(st, "upper"), userns, 0, 0); err != nil {
		return nil, err
	}
	etc := spec.Etc
	if !spec.Network.IsNone() && len(etc) > 0 {
		// Its resolver is its gateway, known once its /31 is taken.
		gw, err := b.net.Reserve(spec.ID)
		if err != nil {
			return nil, err
		}
		cu.Add(func() error { b.net.Release(spec.ID); return nil })
		etc = etcfiles.WithNameserver(etc, gw)
	}
	if err := writeEtc(filepath.Join(st, "upper"), spec.Layers, etc, pooled, userns); err != nil {
		return nil, err
	}

	overlay, err := overlayConfig(spec.Layers, filepath.Join(st, "upper"), filepath.Join(st, "work"))
	if err != nil {
		return nil, err
	}

	ph.mark("dirs")

	pid, pidfd, net, err := b.startInit(ctx, spec, overlay, grp, ph, userns)
	if err != nil {
		return nil, err
	}
	if net != nil {
		cu.Add(func() error { return b.net.Detach(spec.ID, *net) })
	}
	cu.Add(func() error { b.cpus.release(spec.ID); return nil })
	// Until attach hands it to the monitor, the init is our unreaped
	// child: killed without a wait it stays a zombie for the daemon's life.
	cu.Add(func() error { killInit(pid); return nil })

	s, err := b.attach(spec.ID, pid, pidfd, 0, grp.grp, net)
	if err != nil {
		return nil, err
	}
	s.st.UserNS = userns
	ph.mark("attach")
	ph.flush()
	cu.Release()
	// From here the sandbox is whole: Destroy undoes it all.
	if err := s.extras(spec); err != nil {
		return nil, errors.Join(err, s.Destroy(context.Background()))
	}
	return s, nil
}

// ensureShared remounts the node's shared filesystems that sandboxes bind
// (sysfs, devfs, the empty directory, the views) where they went away.
func (b *Backend) ensureShared() error {
	for _, f := range []func() error{b.ensureSysfs, b.ensureDevfs, b.ensureEmpty, b.ensureViews} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// listenUnix returns a listening unix socket bound at path, as a file to
// hand to a child: what net.ListenUnix and File do, without registering
// the socket with the runtime poller only to take it out again.
func listenUnix(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "bind", Path: path, Err: err}
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// devNull is /dev/null, open once, as every init stage's stdio.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.OpenFile(os.DevNull, os.O_RDWR, 0) })

// pendingGroup is a sandbox's cgroup being made by a goroutine of its
// own (newGroup).
type pendingGroup struct {
	done chan struct{}
	grp  cgroups.Group // set, or err, once done is closed
	err  error
}

// newGroup starts making the sandbox's cgroup, which the init joins only
// after its clone: its mkdirs (~170 us here, most of it the memory
// cgroup's) then run on another CPU while Create makes the directories,
// /etc files and the clone, instead of after them, where the init waited
// for them.
func (b *Backend) newGroup(spec backend.Spec) *pendingGroup {
	p := &pendingGroup{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.grp, p.err = cgroups.New(b.opts.CgroupParent, spec.ID, cgroups.Resources{
			CPUMillis: spec.CPUMillis, MemoryBytes: spec.MemoryBytes, PidsMax: spec.PidsMax,
		})
	}()
	return p
}

// wait returns the group once it is made.
func (p *pendingGroup) wait() (cgroups.Group, error) {
	<-p.done
	return p.grp, p.err
}

// remove undoes newGroup for a failed create: it kills what joined the
// group and deletes it (or nothing, if making it failed).
func (p *pendingGroup) remove() error {
	grp, err := p.wait()
	if err != nil {
		return nil
	}
	// The cgroup empties once the init is gone; one stuck in a hung
	// mount may outlast the wait, and Sweep takes the cgroup at the
	// next start.
	_ = grp.Kill(5 * time.Second)
	return grp.Delete()
}

// startInit starts the init stage in new namespaces, places it in its
// cgroup (grp, made meanwhile), sends it its config and waits until it
// has become the agent. It returns the init's pid and the pidfd the clone
// made (-1 where the kernel made none: attach opens one then).
func (b *Backend) startInit(ctx context.Context, spec backend.Spec, overlay map[string]string, pending *pendingGroup, ph *phases, userns *UserNS) (_ int, _ int, _ *netpolicy.Attachment, retErr error) {
	null, err := devNull()
	if err != nil {
		return 0, -1, nil, errdefs.Wrap(errdefs.Internal, err, "open /dev/null")
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return 0, -1, nil, errdefs.Wrap(errdefs.Internal, err, "pipe")
	}
	defer cfgR.Close()
	defer cfgW.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		return 0, -1, nil, errdefs.Wrap(errdefs.Internal, err, "pipe")
	}
	defer stR.Close()
	defer stW.Close()

	// The standalone agent carries the init stage: the child execs it
	// through /proc/self/fd (its fd 6), and the init stage becomes the
	// agent without a second exec. Exec'ing the 24 MB warren binary
	// instead cost ~0.3 ms more per create.
	agentFile, err := b.agent.File()
	if err != nil {
		return 0, -1, nil, err
	}
	path := "/proc/self/fd/6"
	files := []*os.File{null, null, null, cfgR, nil, stW, agentFile}
	if b.opts.InitBinary != "" {
		path, files = b.opts.InitBinary, files[:6]
	}
	cloneflags := uintptr(syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC)
	if userns != nil {
		// The init makes its UTS and IPC namespaces (and a second mount
		// namespace) inside the user namespace, for CRIU
		// (init_linux.c, userns_namespaces).
		cloneflags &^= syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC
	}
	// A sandbox without a network joins a namespace of the pool (its fd
	// 7) first thing; the others, and an init that is not ours, get a
	// new one from the clone.
	var netns *os.File
	if spec.Network.IsNone() && b.opts.InitBinary == "" && b.netns != nil {
		netns = b.netns.take()
	}
	if netns != nil {
		defer netns.Close()
		files = append(files, netns)
	} else {
		cloneflags |= syscall.CLONE_NEWNET
	}
	// The stage (stage.go), last: an init that is not ours has none.
	stageFD := -1
	if b.opts.InitBinary == "" && b.stage != nil {
		stageFD = len(files)
		files = append(files, b.stage)
	}
	pidfd := -1
	// os.StartProcess rather than os/exec: no stdio goroutines or
	// /dev/null opens per create. The clone hands us a pidfd (PidFD).
	proc, err := os.StartProcess(path, []string{"warren-init"}, &os.ProcAttr{
		Env:   []string{initEnv + "=1"},
		Files: files,
		Sys: &syscall.SysProcAttr{
			Cloneflags: cloneflags,
			// Its own session: signals to the daemon's terminal or process
			// group never reach sandboxes.
			Setsid: true,
			PidFD:  &pidfd,
		},
	})
	if err != nil {
		return 0, -1, nil, errdefs.Wrap(errdefs.Internal, err, "start sandbox init")
	}
	pid := proc.Pid
	// We reap it through the monitor, not os.
	_ = proc.Release()
	ph.mark("clone")
	fail := func(err error) (int, int, *netpolicy.Attachment, error) {
		return 0, -1, nil, err
	}
	var cu cleanup.Cleanup
	defer func() {
		if retErr != nil {
			_ = cu.Clean()
		}
	}()
	cu.Add(func() error {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		killInit(pid)
		return nil
	})
	cfgR.Close()
	stW.Close()
	grp, err := pending.wait()
	if err != nil {
		return fail(err)
	}
	if err := grp.AddProc(pid); err != nil {
		return fail(err)
	}
	ph.mark("cgroup")
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	conf := map[string]string{"rootfs": b.rootMount(), "hostname": hostname,
		"empty": b.emptyDir(), "sysfs": b.sysfsDir(), "dev": b.devDir(spec.ID),
		"rlimits": rlimit.InitConfig(spec.Rlimits), "seccomp": b.seccomp,
		"seccomp_audit": b.seccompAudit, "auid": auditID(pid), "agent_exe": b.agentExe,
		"agent_socket": b.socket(spec.ID)}
	if spec.AllowSetuid {
		conf["no_new_privs"] = "0"
	}
	if stageFD >= 0 {
		conf["stage"] = strconv.Itoa(stageFD)
	}
	if netns != nil {
		conf["netns"] = "7"
	}
	if userns != nil {
		conf["userns"] = strconv.FormatUint(uint64(userns.Base), 10) + ":" + strconv.FormatUint(uint64(userns.Size), 10)
	}
	maps.Copy(conf, overlay)
	b.cgroupViewConfig(grp.Name(), conf)
	cu.Add(func() error { b.cpus.release(spec.ID); return nil })
	views, err := b.placeCPUs(spec, pid)
	if err != nil {
		return fail(err)
	}
	// The class before the init runs a line of its own: its processes
	// inherit the cpuset and core cookie.
	if err := applyQoS(grp, []int{pid}, spec.QoS); err != nil {
		return fail(err)
	}
	conf["views"] = views
	ph.mark("config")
	// The network is made from here, from the node's side, while the
	// init waits for its config: the sandbox starts with eth0 up.
	var net *netpolicy.Attachment
	if !spec.Network.IsNone() {
		a, err := b.net.Attach(spec.ID, hostname, pid, spec.Network)
		if err != nil {
			return fail(err)
		}
		net = &a
		cu.Add(func() error { return b.net.Detach(spec.ID, a) })
	}
	ph.mark("network")
	cfg := initConfig(conf)
	if _, err := cfgW.Write(cfg); err != nil {
		return fail(errdefs.Wrap(errdefs.Internal, err, "send init config"))
	}
	cfgW.Close()
	// EOF without a message means the init stage set the sandbox up and
	// closed the pipe on becoming the agent.
	msg, err := readStatus(ctx, stR, InitTimeout)
	if err != nil {
		return fail(err)
	}
	if len(msg) > 0 {
		return fail(errdefs.Internalf("sandbox init: %s", msg))
	}
	ph.mark("init")
	cu.Release()
	return pid, pidfd, net, nil
}

// InitTimeout bounds the init stage's setup (mounts, pivot_root): ~3 ms
// alone, longer queued behind a burst of creates on a busy node, but a
// layer on a hung shared store would otherwise hang Create for good. A
// variable for tests.
var InitTimeout = 60 * time.Second

// readStatus reads the init stage's status pipe to EOF, giving up when
// ctx ends or after timeout: the pipe is non-blocking (os.Pipe), so a
// read deadline interrupts the read.
func readStatus(ctx context.Context, r *os.File, timeout time.Duration) ([]byte, error) {
	_ = r.SetReadDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { _ = r.SetReadDeadline(time.Now()) })
	defer stop()
	msg, err := io.ReadAll(io.LimitReader(r, 64<<10))
	if err == nil {
		return msg, nil
	}
	if ctx.Err() != nil {
		cat := errdefs.Unknown // cancelled: the caller went away
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cat = errdefs.DeadlineExceeded
		}
		return nil, errdefs.New(cat, "sandbox init did not finish setting up: %w", ctx.Err())
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, errdefs.New(errdefs.DeadlineExceeded, "sandbox init did not finish setting up within %v (a layer on a hung mount?): %w", timeout, err)
	}
	return nil, errdefs.Wrap(errdefs.Internal, err, "read sandbox init status")
}

// killInit kills an init stage that will not become a sandbox and reaps
// it. It is this daemon's child (StartProcess's Release left the wait to
// us) and nothing else waits for it before attach hands it to the
// monitor, so waiting by pid cannot take another process's status. The
// wait runs in the background: an init in uninterruptible sleep (a hung
// mount) dies only when that sleep ends.
func killInit(pid int) {
	_ = unix.Kill(pid, unix.SIGKILL)
	go func() {
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(pid, &ws, 0, nil); err != unix.EINTR {
				return
			}
		}
	}()
}

// attach watches the init pid, through pidfd if it is >= 0 (it then
// names our own unreaped child, whose pid cannot have been reused) or a
// pidfd it opens. want is the init's recorded start time (Adopt), 0 for
// our own child. It owns pidfd from here on.
//
// The pidfd is opened before the start time is read: a start time equal
// to the recorded one then proves the pidfd names that same init (any
// process that held the pid when the pidfd was opened and then gave it up
// would have been replaced by one started later). One read of
// /proc/<pid>/stat does it; errors other than the process being gone
// (EMFILE, ENOMEM) are Unavailable, since the init may well be alive.
func (b *Backend) attach(id string, pid, pidfd int, want uint64, grp cgroups.Group, net *netpolicy.Attachment) (*sandbox, error) {
	pidfdIn := pidfd
	if pidfd < 0 {
		var err error
		if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
			if err != unix.ESRCH {
				return nil, errdefs.Wrap(errdefs.Unavailable, err, "pidfd_open sandbox init")
			}
			return nil, errdefs.Wrap(errdefs.NotFound, err, "pidfd_open sandbox init")
		}
	}
	st, err := attachStartTime(pid)
	if err != nil {
		unix.Close(pidfd)
		var pe *os.PathError
		if errors.As(err, &pe) && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ESRCH) {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox "+id+": read its init's start time")
		}
		return nil, errdefs.Wrap(errdefs.NotFound, err, "sandbox init is gone")
	}
	if want != 0 && st != want {
		unix.Close(pidfd)
		return nil, errdefs.NotFoundf("sandbox %s: init %d is gone", id, pid)
	}
	s := &sandbox{
		b: b, id: id, grp: grp, st: state{Pid: pid, StartTime: st, Net: net},
		agent: agent.NewClient(b.socket(id)),
		root:  -1, // pinned by Destroy: a descriptor per live sandbox counts at 10,000
		disk:  fileExists(b.diskImage(id)),
	}
	s.exited, s.exit = context.WithCancel(context.Background())
	// The clone's pidfd names our own child (a create); want names an
	// adopted init; a restore's init (neither) keeps its pidfd watch:
	// CRIU made it, and a lazy one shares its group with its server.
	byGroup, child := pidfdIn >= 0 || want != 0, pidfdIn >= 0
	if err := b.watchInit(s, pidfd, byGroup, child); err != nil {
		s.exit()
		return nil, errdefs.Wrap(errdefs.Internal, err, "watch sandbox init")
	}
	return s, nil
}

// watchInit has the monitor call s.exit once s's init is gone, through
// its group's cgroup.events where it has one and nothing but the init's
// pid namespace is in the group, so that a live sandbox holds no
// descriptor of the daemon's (monitor); through pidfd otherwise. child
// says the init is this daemon's own unreaped child (a create), not an
// adopted one. It owns pidfd, and closes it unless the
// watch keeps it.
func (b *Backend) watchInit(s *sandbox, pidfd int, byGroup, child bool) error {
	if events := cgroups.EventsFile(s.grp); byGroup && watchByGroup && events != "" && !b.lazyImagesOf(s.id) {
		err := b.mon.watchGroup(events, s.st.Pid, child, s.exit)
		if err == nil {
			unix.Close(pidfd)
			return nil
		}
		// Out of inotify watches (fs.inotify.max_user_watches, shared
		// by the node's root processes) or instances: a pidfd still
		// works.
		if b.opts.Warn != nil {
			b.opts.Warn("watching a sandbox's cgroup.events failed; watching its init's pidfd", "sandbox", s.id, "err", err)
		}
	}
	if err := b.mon.watch(pidfd, s.st.Pid, s.exit); err != nil {
		unix.Close(pidfd)
		return err
	}
	return nil
}

// watchByGroup is false in tests that take the path of hosts without a
// cgroup2 directory per sandbox (pure v1): a pidfd per sandbox.
var watchByGroup = true

// lazyImagesOf says whether sandbox id was restored lazily and its
// lazy-pages server may still run (lazy.go): the server is in the
// sandbox's group but not its pid namespace, so the group can outlive
// the init.
func (b *Backend) lazyImagesOf(id string) bool {
	_, err := os.Stat(filepath.Join(b.stateDir(id), lazyImagesDir))
	return err == nil
}

// attachStartTime is procStartTime; tests make it fail to check that a
// failed attach leaves no zombie.
var attachStartTime = procStartTime

// pinForDelete pins the root overlay of a sandbox about to be killed
// (pinRoot), so that its unmount's sync happens in the reaper, not in the
// exit the delete waits for. Taken at delete, not at create: a descriptor
// per live sandbox is half of what 10,000 sandboxes hold. Called with
// destroyMu held, while the init lives.
func (s *sandbox) pinForDelete() {
	if s.root < 0 {
		s.root = pinRoot(s.st.Pid)
	}
}

// fdReserve is what Create leaves of the daemon's open-file limit to
// everything but the sandboxes' own descriptors (a pidfd each where the
// monitor cannot watch their cgroup, watchInit): API
// connections, exec pipes, files being served, a delete's pinned root.
const fdReserve = 1024

// fdRoom refuses a create, Exhausted, when one more sandbox would leave
// the daemon fewer than fdReserve descriptors: past its limit, a create
// fails deep inside with "too many open files", and so does everything
// else the daemon does, deletes included. Counted, not read from
// /proc/self/fd, which costs milliseconds at 10,000 sandboxes.
func (b *Backend) fdRoom() error {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return nil
	}
	// One more pidfd is an upper bound: most sandboxes take none.
	if n := uint64(b.mon.count()); n+1+fdReserve > rl.Cur {
		return errdefs.New(errdefs.Exhausted, "the daemon's open-file limit (%d) is taken by its %d sandboxes (a descriptor each) and the %d it keeps for calls: raise warren serve's LimitNOFILE", rl.Cur, n, fdReserve)
	}
	return nil
}

// pinRoot opens the sandbox's root overlay (O_PATH), or returns -1. The
// open file keeps the overlay mounted after the sandbox's mount namespace
// is gone, until the reaper closes it: the unmount of an overlay syncs its
// upper directory's filesystem (the one every sandbox's writable layer is
// on), which waits for whatever any sandbox has written and not yet
// flushed, and it would otherwise happen in the exit of the sandbox's
// init, which delete waits for.
func pinRoot(pid int) int {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

// Adopt reattaches to a sandbox of an earlier daemon.
func (b *Backend) Adopt(ctx context.Context, id string, blob []byte) (backend.Sandbox, error) {
	if !backend.ValidID(id) {
		return nil, errdefs.Invalidf("bad sandbox id %q", id)
	}
	var st state
	if err := json.Unmarshal(blob, &st); err != nil {
		_ = b.teardown(id)
		return nil, errdefs.Wrap(errdefs.NotFound, err, "sandbox state unreadable")
	}
	if st.Pid <= 0 || st.StartTime == 0 {
		_ = b.teardown(id)
		return nil, errdefs.NotFoundf("sandbox %s: no init recorded", id)
	}
	if st.UserNS != nil {
		if err := b.ids.claim(id, *st.UserNS); err != nil {
			return nil, err
		}
	}
	if st.Net != nil {
		// Taken before anything can fail, so that a teardown below
		// frees it and no create meanwhile takes it.
		if err := b.net.Adopt(id, *st.Net); err != nil {
			return nil, err
		}
	}
	// Only a sandbox proven gone (NotFound) is torn down: any other
	// failure (fds, memory, the monitor) may pass, and the daemon keeps
	// the sandbox LOST and adopts it again later.
	grp, err := cgroups.Load(b.opts.CgroupParent, id)
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.NotFound {
			_ = b.teardownGroup(id, nil, -1, st.Net)
			if st.UserNS != nil {
				b.ids.release(id, *st.UserNS)
			}
		}
		return nil, err
	}
	s, err := b.attach(id, st.Pid, -1, st.StartTime, grp, st.Net)
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.NotFound {
			_ = b.teardownGroup(id, grp, -1, st.Net)
			if st.UserNS != nil {
				b.ids.release(id, *st.UserNS)
			}
		}
		return nil, err
	}
	s.st.UserNS = st.UserNS
	b.cpus.adopt(id, st.Pid)
	s.adoptLazy()
	return s, nil
}

// Sweep removes sandboxes whose ids are not in keep.
func (b *Backend) Sweep(ctx context.Context, keep map[string]bool) error {
	ids := map[string]bool{}
	for _, dir := range []string{filepath.Join(b.opts.RunDir, "sb"), filepath.Join(b.opts.StateDir, "sandboxes"), b.devfsDir()} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			ids[e.Name()] = true
		}
	}
	disks, _ := os.ReadDir(filepath.Join(b.opts.StateDir, "disks"))
	for _, e := range disks {
		if id, ok := strings.CutSuffix(e.Name(), ".img"); ok {
			ids[id] = true
		}
	}
	groups, err := cgroups.List(b.opts.CgroupParent)
	if err != nil {
		return err
	}
	for _, g := range groups {
		// Not a sandbox id: a VM's QEMU group ("microvm:<id>"), which
		// its own backend sweeps.
		if backend.ValidID(g) {
			ids[g] = true
		}
	}
	var errs []error
	for id := range ids {
		if !keep[id] {
			errs = append(errs, b.teardown(id))
		}
	}
	// Interfaces and rules of sandboxes gone while no daemon ran, and
	// of creates a crash interrupted: known by name only.
	errs = append(errs, b.net.Sweep(keep))
	return errors.Join(errs...)
}

// teardown removes everything a sandbox id may own, whatever state it is
// in: processes (via its cgroup), the root mount, the cgroup, directories.
func (b *Backend) teardown(id string) error { return b.teardownGroup(id, nil, -1, nil) }

// teardownGroup is teardown with the sandbox's cgroup already at hand (nil
// to look it up), its pinned root, which it hands to the reaper, and its
// network (nil: none known; Sweep finds interfaces by name).
func (b *Backend) teardownGroup(id string, grp cgroups.Group, root int, net *netpolicy.Attachment) error {
	b.cpus.release(id)
	var errs []error
	if net != nil {
		errs = append(errs, b.net.Detach(id, *net))
	}
	if grp == nil {
		grp, _ = cgroups.Load(b.opts.CgroupParent, id)
	}
	if grp != nil {
		events := cgroups.EventsFile(grp)
		errs = append(errs, grp.Kill(10*time.Second), grp.Delete())
		groupRemoved(events)
	}
	errs = append(errs, unmount(b.rootfs(id)))
	if root >= 0 && fileExists(b.diskImage(id)) {
		// A disk image is the upper's filesystem: its unmount below must
		// not find the overlay still holding it.
		unix.Close(root)
		root = -1
	}
	errs = append(errs, unmountDisk(b.diskImage(id), b.stateDir(id)))
	errs = append(errs, b.removeDirs(id, root))
	return errors.Join(errs...)
}

func fileExists(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil
}

// removeDirs removes sandbox id's run and /dev directories, and hands its
// state directory and pinned root (-1 for none) to the reaper. It first
// removes what they hold when the sandbox wrote nothing (the agent socket,
// the device nodes, an empty upper and work directory) by name, and walks
// a tree only when that leaves a directory not empty.
func (b *Backend) removeDirs(id string, root int) error {
	return errors.Join(
		// Links beside the checkpoints (linkBeside) are not in the tree.
		removeLinksBeside(filepath.Join(b.stateDir(id), lazyImagesDir)),
		removeKnown(b.runDir(id), "agent.sock"),
		b.trash.discard(b.stateDir(id), root),
		removeKnown(b.devDir(id), devEntries...))
}

// stateEntries is what a sandbox's state directory holds when the sandbox
// wrote nothing: its /etc files (writeEtc) and empty directories.
var stateEntries = []string{"upper/etc/hosts", "upper/etc/hostname", "upper/etc/resolv.conf", "upper/etc/",
	"upper/", "work/work/", "work/"}

// devEntries is what the init stage puts in a sandbox's /dev directory
// (init_linux.c, setup_dev),
// and the daemon's API socket of a harness (backend.SocketDirs), which the
// daemon normally removed already.
var devEntries = []string{"null", "zero", "full", "random", "urandom", "tty", "ptmx",
	"fd", "stdin", "stdout", "stderr", "pts/", "shm/", "warren.sock"}

type sandbox struct {
	b      *Backend
	id     string
	grp    cgroups.Group
	st     state
	agent  *agent.Client
	root   int  // pinRoot's fd, -1 if none or handed to the reaper
	disk   bool // its writable layer is on a disk of its own (a disk limit)
	exited context.Context
	exit   context.CancelFunc // cancels exited: the init died

	// lazy is the lazy-pages server of a lazy restore, nil otherwise
	// (lazy.go).
	lazyMu sync.Mutex
	lazy   *lazyServer
	// How a restore brought the memory back (MemoryRestore); set before
	// the sandbox is handed out, then read only.
	restoredLazy bool
	eagerWhy     string

	destroyMu sync.Mutex
	destroyed bool

	netMu sync.Mutex // st.Net, which Update changes

	jobMu  sync.Mutex // one job at a time (RunJob)
	jobMem int64      // the memory limit RunJob last set; 0: the spec's
	// jobOOM is the cgroup's OOM kill count after the last job.
	jobOOM      uint64
	jobOOMKnown bool
	jobMq       *os.File // the mqueue filesystem's root (mqueue.go), from the first job on

	devMu sync.Mutex
	devs  []string // names of the device nodes SetDevices made (devices.go)
}

func (s *sandbox) ID() string { return s.id }

// Root reaches the sandbox's root through its init: the overlay is mounted
// only inside the sandbox's mount namespace.
func (s *sandbox) Root() string            { return "/proc/" + strconv.Itoa(s.st.Pid) + "/root" }
func (s *sandbox) Exited() context.Context { return s.exited }
func (s *sandbox) State() []byte {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	b, _ := json.Marshal(s.st)
	return b
}

// network is the sandbox's network attachment (nil: mode none).
func (s *sandbox) network() *netpolicy.Attachment {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	return s.st.Net
}

var _ backend.IDMapped = (*sandbox)(nil)

// IDMap is the sandbox's user-namespace mapping (backend.IDMapped).
func (s *sandbox) IDMap() (base, size uint32, ok bool) {
	if u := s.st.UserNS; u != nil {
		return u.Base, u.Size, true
	}
	return 0, 0, false
}

var _ backend.SocketDirs = (*Backend)(nil)

// SocketDir is the sandbox's /dev on the node's shared devfs tmpfs
// (backend.SocketDirs): its own directory, bound at /dev by the init
// stage, which no other sandbox sees.
func (b *Backend) SocketDir(id string) (host, inside string) { return b.devDir(id), "/dev" }

// UpperDir is the overlayfs upper directory (backend.Committer).
func (s *sandbox) UpperDir() string { return filepath.Join(s.b.stateDir(s.id), "upper") }

// Freeze freezes the sandbox's cgroup (backend.Committer).
func (s *sandbox) Freeze(ctx context.Context) (func() error, error) {
	select {
	case <-s.exited.Done():
		return nil, errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.grp.Freeze(); err != nil {
		// A partial freeze must not leave processes stopped.
		_ = s.grp.Thaw()
		return nil, err
	}
	var once sync.Once
	var terr error
	return func() error {
		once.Do(func() { terr = s.grp.Thaw() })
		return terr
	}, nil
}

func (s *sandbox) Start(ctx context.Context, p backend.ProcSpec) (backend.Process, error) {
	select {
	case <-s.exited.Done():
		return nil, errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	return s.agent.Start(ctx, p)
}

func (s *sandbox) Stats() (backend.Stats, error) {
	st, err := s.grp.Stats()
	return backend.Stats{MemoryBytes: st.MemoryBytes, MemoryCache: st.MemoryCache, MemoryAnon: st.MemoryAnon,
		MemoryKernel: st.MemoryKernel, MemorySwap: st.MemorySwap, OOMKills: st.OOMKills, CPUUsage: st.CPUUsage, Pids: st.Pids}, err
}

func (s *sandbox) OOMKills() (uint64, error) { return s.grp.OOMKills() }

var _ backend.Containment = (*sandbox)(nil)

// Contained reads the OOM and refused-fork counters and, with a disk
// limit, the disk's use (backend.Containment): two small cgroup files
// and a statfs, polled by the daemon for every running sandbox.
func (s *sandbox) Contained() (backend.Contained, error) {
	var c backend.Contained
	var err error
	if c.OOMKills, err = s.grp.OOMKills(); err != nil {
		return c, err
	}
	if c.PidsRefused, err = s.grp.PidsRefused(); err != nil {
		return c, err
	}
	c.CPUUsage, _ = s.grp.CPUUsage()
	if s.disk {
		var fs unix.Statfs_t
		if err := unix.Statfs(s.b.stateDir(s.id), &fs); err != nil {
			return c, fsErr(err, "statfs sandbox disk")
		}
		bs := uint64(fs.Bsize)
		c.Disk = &backend.DiskUse{Bytes: fs.Blocks * bs, FreeBytes: fs.Bavail * bs, Inodes: fs.Files, FreeInodes: fs.Ffree}
	}
	return c, nil
}

var _ backend.CPUReader = (*sandbox)(nil)

// CPUUsage reads the group's CPU time alone (backend.CPUReader).
func (s *sandbox) CPUUsage() (time.Duration, error) { return s.grp.CPUUsage() }

var _ backend.NodeMemory = (*Backend)(nil)

// SandboxesMemory reads all the sandboxes' memory from their cgroup
// parent (backend.NodeMemory).
func (b *Backend) SandboxesMemory() (backend.Stats, error) {
	st, err := cgroups.ParentMemory(b.opts.CgroupParent)
	return backend.Stats(st), err
}

// Destroy kills the sandbox's init (which takes its whole pid namespace
// with it), waits for it, and releases every resource.
func (s *sandbox) Destroy(ctx context.Context) error {
	s.destroyMu.Lock()
	defer s.destroyMu.Unlock()
	if s.destroyed {
		return nil
	}
	select {
	case <-s.exited.Done():
	default:
		if cur, err := procStartTime(s.st.Pid); err == nil && cur == s.st.StartTime {
			s.pinForDelete()
			_ = unix.Kill(s.st.Pid, unix.SIGKILL)
		} else if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
			return errdefs.Wrap(errdefs.Exhausted, err, "sandbox "+s.id+": read its init's state")
		}
		// A paused sandbox: its init dies only once thawed.
		s.thawForKill()
		select {
		case <-s.exited.Done():
		case <-time.After(10 * time.Second):
			return errdefs.Internalf("sandbox %s: init did not exit after SIGKILL", s.id)
		}
	}
	// A lazy-pages server outside the group (its move failed) goes too.
	s.lazyMu.Lock()
	if s.lazy != nil {
		s.lazy.stop()
	}
	s.lazyMu.Unlock()
	root := s.root
	s.root = -1
	s.jobMu.Lock()
	if s.jobMq != nil {
		s.jobMq.Close()
		s.jobMq = nil
	}
	s.jobMu.Unlock()
	if err := s.b.teardownGroup(s.id, s.grp, root, s.network()); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "release sandbox "+s.id)
	}
	if u := s.st.UserNS; u != nil {
		s.b.ids.release(s.id, *u)
	}
	s.destroyed = true
	return nil
}

// overlayConfig is the init stage's config of a sandbox's root overlay
// (init_linux.c, mount_overlay): the directories, which the init stage
// opens and names in the mount data by descriptor only, so that the
// sandbox's mountinfo shows no host path, and the other options.
// The container backend stacks the layers' mounted directories (Dir); it
// leaves their blobs to the node's mount cache.
func overlayConfig(refs []backend.Layer, upper, work string) (map[string]string, error) {
	layers := make([]string, len(refs))
	for i, r := range refs {
		if r.Dir == "" {
			return nil, errdefs.Invalidf("layer %s has no mounted directory: the container backend stacks directories", r.Digest)
		}
		layers[i] = r.Dir
	}
	for _, l := range layers {
		if strings.ContainsAny(l, ":\x00") {
			return nil, errdefs.Invalidf("layer path %q contains ':'", l)
		}
		if _, err := os.Stat(l); err != nil {
			return nil, fsErr(err, "image layer")
		}
	}
	// Each layer takes ~20 bytes of the page of mount data
	// ("/proc/self/fd/NN:"); the init stage checks the exact length.
	if len(layers) > maxOverlayLayers {
		return nil, errdefs.Invalidf("too many image layers (%d, at most %d) for one overlay mount", len(layers), maxOverlayLayers)
	}
	// redirect_dir and metacopy off (the defaults of most kernels, made
	// explicit): the upper directory then holds whole files and real
	// directories, which CommitSandbox relies on to turn it into a layer.
	//
	// xino=on: the layers are separate filesystems (one EROFS each), and
	// without it readdir's d_ino is the layer's own inode number while
	// stat's is overlayfs's, and a file's st_dev changes when it is copied
	// up (CPython's test_os, find, tar and rsync hardlink detection all
	// compare them). With it overlayfs puts the layer's index in the high
	// bits of every inode number, so the two agree and st_dev is the
	// overlay's for every file, before and after copy-up.
	return map[string]string{"lower": strings.Join(layers, ":"), "upper": upper, "work": work,
		"overlay_options": "redirect_dir=off,metacopy=off,xino=on"}, nil
}

// maxOverlayLayers is what the init stage takes (its descriptor table for
// the mount has 128 entries, two for upper and work).
const maxOverlayLayers = 126

func unmount(target string) error {
	err := unix.Unmount(target, unix.MNT_DETACH)
	if err == nil || err == unix.EINVAL || err == unix.ENOENT {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}

func fsErr(err error, what string) error {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return errdefs.Wrap(errdefs.Exhausted, err, what)
	case errors.Is(err, unix.ENOENT):
		return errdefs.Wrap(errdefs.NotFound, err, what)
	}
	return errdefs.Wrap(errdefs.Internal, err, what)
}

// procStartTime returns field 22 of /proc/<pid>/stat (start time in clock
// ticks since boot), which together with the pid names a process uniquely.
func procStartTime(pid int) (uint64, error) {
	b, err := kfile.Read("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	line := string(b)
	// The command name may contain spaces and parens: parse after the last ')'.
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	fields := strings.Fields(line[i+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, fmt.Errorf("process %d is a zombie", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// auditID is the audit login uid of every process of the sandbox whose
// init has host pid pid: the kernel's audit records (a seccomp refusal)
// carry it, and no live sandbox shares it. "" where the kernel has no
// loginuid (no CONFIG_AUDIT): the init then sets none.
func auditID(pid int) string {
	if !hasLoginUID() {
		return ""
	}
	return strconv.Itoa(pid)
}

var hasLoginUID = sync.OnceValue(func() bool { return fileExists("/proc/self/loginuid") })

// AuditSandbox returns the id of the live sandbox whose processes carry
// audit login uid auid: its init's host pid, whose cgroup names it.
func (b *Backend) AuditSandbox(auid uint32) (string, bool) {
	id, _, ok := b.SandboxOfPid(int(auid))
	return id, ok
}

// initEnv switches the standalone agent (internal/agentbin) into the
// container init stage (init_linux.c), which builds the sandbox's root and
// becomes its agent.
const initEnv = "_WARREN_CONTAINER_INIT"

// initConfig encodes the init stage's config: NUL-separated key=value.
func initConfig(kv map[string]string) []byte {
	var b bytes.Buffer
	for k, v := range kv {
		if v == "" {
			continue
		}
		b.WriteString(k + "=" + v)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// Background processes are the agent's (backend.Background).
var (
	_ backend.Background = (*sandbox)(nil)
	_ backend.Forgetter  = (*sandbox)(nil)
)

func (s *sandbox) ForgetBackground(ctx context.Context, pid int) error {
	return s.agent.ForgetBackground(ctx, pid)
}

func (s *sandbox) StartBackground(ctx context.Context, p backend.ProcSpec, o backend.BackgroundOpts) (int, error) {
	select {
	case <-s.exited.Done():
		return 0, errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	return s.agent.StartBackground(ctx, p, o)
}

func (s *sandbox) ListBackground(ctx context.Context) ([]backend.BackgroundInfo, error) {
	return s.agent.ListBackground(ctx)
}

func (s *sandbox) AttachBackground(ctx context.Context, pid int, stdoutOff, stderrOff int64) (backend.Attachment, error) {
	return s.agent.AttachBackground(ctx, pid, stdoutOff, stderrOff)
}

func (s *sandbox) OpenStdin(ctx context.Context, pid int) (backend.StdinWriter, error) {
	return s.agent.OpenStdin(ctx, pid)
}

func (s *sandbox) CloseStdin(ctx context.Context, pid int) error { return s.agent.CloseStdin(ctx, pid) }

func (s *sandbox) SignalBackground(ctx context.Context, pid int, sig syscall.Signal, group bool) error {
	return s.agent.SignalBackground(ctx, pid, sig, group)
}

func (s *sandbox) ResizeBackground(ctx context.Context, pid int, rows, cols uint16) error {
	return s.agent.ResizeBackground(ctx, pid, rows, cols)
}

// Network is the backend's sandbox networking (the daemon's resolver
// asks it who a query's source is and what it may resolve).
func (b *Backend) Network() *netpolicy.Node { return b.net }

// Package fullvm runs sandboxes as full QEMU VMs (q35): a Debian disk
// image that scripts/fullvm-image.sh builds (systemd, its own kernel and
// boot loader), one copy-on-write qcow2 overlay per sandbox, Warren's
// guest agent as a systemd service on a virtio-serial port, a network
// device on a tap of the node where the sandbox has a network policy
// (netpolicy, as a microVM's), and a virtual screen (VGA, with a VNC
// socket), keyboard and pointer that the API reaches through QMP
// (backend.Display). The agent's host side, the VM's lifecycle and the
// sandbox's calls are internal/microvm's; this package gives them
// another machine. docs/FULLVM.md.
package fullvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/microvm"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/qos"
)

// Name is the backend's name in CreateRequest.backend.
const Name = "fullvm"

// DefaultImageDir is the image scripts/fullvm-image.sh names newest.
const DefaultImageDir = "/opt/warren/vm/images/bookworm"

// ImageScript builds the image; errors name it.
const ImageScript = "scripts/fullvm-image.sh"

// defaultMemoryMB is a VM's memory without a limit; guestOverheadMB is
// added to a limit: Debian with systemd uses ~150 MiB of its own.
const (
	defaultMemoryMB = 1024
	guestOverheadMB = 256
)

// bootTimeout bounds a boot to the agent's first answer (microvm's
// BootWithin): a full OS under TCG on a loaded node takes a minute or
// more.
const bootTimeout = 5 * time.Minute

// Options configure the backend.
type Options struct {
	StateDir string // the backend's directory: vms/<id>/
	QEMU     string // default: qemu-system-x86_64 on $PATH
	QEMUImg  string // default: qemu-img on $PATH
	// ImageDir holds disk.qcow2 (and vmlinuz, initrd.img, cmdline for
	// DirectKernel); default DefaultImageDir. Resolved at each create,
	// so a rebuilt image serves the next sandbox while the running ones
	// keep theirs.
	ImageDir string
	KVM      bool
	// DirectKernel boots the image's kernel with -kernel (skipping the
	// firmware's and the boot loader's part of the boot) instead of by
	// the image's own boot loader.
	DirectKernel bool
	// CgroupParent is the parent of the VMs' QEMU cgroups (the container
	// backend's: microvm.NewHostGroup); default "warren".
	CgroupParent string
	// Network gives VMs with a network policy their taps and rules (the
	// container backend's node, as the microvm backend's); nil: mode
	// none only.
	Network *netpolicy.Node
	// Transport is how the host reaches the guest agent, as microvm's
	// (microvm.Options.Transport): microvm.TransportSerial (default) or
	// microvm.TransportVsock, whose device microvm.PickVsock picks
	// (VsockBackend: the vhost-user backend's executable).
	Transport    string
	VsockBackend string
}

// Backend runs sandboxes as full VMs (backend.Backend).
type Backend struct {
	opts Options
	// vsock is the node's vsock device for the VMs, nil for
	// virtio-serial.
	vsock *microvm.Vsock
}

var (
	_ backend.Backend     = (*Backend)(nil)
	_ backend.LayerMounts = (*Backend)(nil)
	_ backend.Sandbox     = (*sandbox)(nil)
	_ backend.Display     = (*sandbox)(nil)
	_ backend.Pauser      = (*sandbox)(nil)
	_ backend.Files       = (*sandbox)(nil)
)

// New checks the node has QEMU and qemu-img; Unsupported otherwise. The
// image is looked for at each create (Create says how to build it).
func New(opts Options) (*Backend, error) {
	for _, t := range []struct {
		p    *string
		name string
	}{{&opts.QEMU, "qemu-system-x86_64"}, {&opts.QEMUImg, "qemu-img"}} {
		if *t.p != "" {
			continue
		}
		p, err := exec.LookPath(t.name)
		if err != nil {
			return nil, errdefs.Unsupportedf("fullvm: no %s (scripts/vm.sh installs QEMU, apt-get install qemu-utils)", t.name)
		}
		*t.p = p
	}
	if opts.ImageDir == "" {
		opts.ImageDir = DefaultImageDir
	}
	b := &Backend{opts: opts}
	switch opts.Transport {
	case "", microvm.TransportSerial:
	case microvm.TransportVsock:
		d, err := microvm.PickVsock(opts.VsockBackend)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Unsupported, err, "fullvm")
		}
		b.vsock = &d
	default:
		return nil, errdefs.Invalidf("fullvm: transport %q: want %s or %s", opts.Transport, microvm.TransportSerial, microvm.TransportVsock)
	}
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "vms"), 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "fullvm state directory")
	}
	return b, nil
}

func (b *Backend) Name() string { return Name }

// MountLayers: the sandbox's root is the disk image, not the layers.
func (b *Backend) MountLayers() bool { return false }

func (b *Backend) vmDir(id string) string { return filepath.Join(b.opts.StateDir, "vms", id) }

// Image is the resolved image directory, Unsupported naming the script
// that builds it when there is none.
func (b *Backend) Image() (string, error) {
	dir, err := filepath.EvalSymlinks(b.opts.ImageDir)
	if err == nil {
		if _, err = os.Stat(filepath.Join(dir, "disk.qcow2")); err == nil {
			return dir, nil
		}
	}
	return "", errdefs.Unsupportedf("fullvm: no disk image at %s (%s builds it): %v", b.opts.ImageDir, ImageScript, err)
}

// GCLock is the file in the images' directory (the parent of
// Options.ImageDir) that ImageScript takes exclusively while it removes
// old images.
const GCLock = ".gc-lock"

// holdImages takes GCLock shared until the func it returns is called: a
// create holds it from resolving the image until its QEMU has the image's
// disk open (the script spares images with open files), so an image a
// rebuild has just replaced is not removed under a VM about to boot it.
// Without the lock (a read-only directory) the create goes on: the script
// is then not the one that manages these images.
func (b *Backend) holdImages() (release func()) {
	f, err := os.OpenFile(filepath.Join(filepath.Dir(b.opts.ImageDir), GCLock), os.O_RDONLY|os.O_CREATE|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return func() {}
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return func() {}
	}
	return func() { f.Close() }
}

// Create boots a VM for spec from a new overlay of the image.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (_ backend.Sandbox, err error) {
	switch {
	case !backend.ValidID(spec.ID):
		return nil, errdefs.Invalidf("bad sandbox id %q", spec.ID)
	case spec.Restore != "":
		return nil, errdefs.Unsupportedf("fullvm: restoring a checkpoint is not implemented")
	case spec.DiskBytes > 0 && spec.DiskBytes < microvm.MinDiskBytes:
		return nil, errdefs.Invalidf("fullvm: disk limit %d bytes is below the minimum of %d", spec.DiskBytes, microvm.MinDiskBytes)
	case len(spec.Devices) > 0 || len(spec.Mounts) > 0:
		return nil, errdefs.Unsupportedf("fullvm: devices and host mounts are not passed into VMs")
	case !spec.Network.IsNone() && b.opts.Network == nil:
		return nil, errdefs.Unsupportedf("fullvm: network policy %s: this backend has no sandbox networking (mode none only)", spec.Network)
	case qos.Check(spec.QoS) != nil:
		return nil, qos.Check(spec.QoS)
	case len(spec.Layers) == 0:
		// The root is the fullvm disk image, not the layers; a create
		// without an image's layers is refused all the same, as on every
		// backend (the daemon always passes them).
		return nil, errdefs.Invalidf("fullvm: no layers")
	}
	if err := layersExist(spec.Layers); err != nil {
		return nil, err
	}
	// Each command's resource limits ride on its call to the agent,
	// which sets them in its trampoline before the command's exec (the
	// agent, a systemd service, holds none of them itself); the memory
	// and pids limits are a cgroup's in the guest (guestLimits).
	rl, err := microvm.GuestRlimits(spec.Rlimits)
	if err != nil {
		return nil, err
	}
	defer b.holdImages()()
	image, err := b.Image()
	if err != nil {
		return nil, err
	}
	if spec.DiskBytes > 0 && !hasFeature(image, "disk-limit") {
		return nil, errdefs.Unsupportedf("fullvm: the image at %s predates disk limits (%s builds a new one)", image, ImageScript)
	}
	if !spec.Network.IsNone() && !hasFeature(image, "network") {
		return nil, errdefs.Unsupportedf("fullvm: the image at %s predates sandbox networking (%s builds a new one)", image, ImageScript)
	}
	var vs *microvm.Vsock
	if b.vsock != nil {
		if !hasFeature(image, "vsock") {
			return nil, errdefs.Unsupportedf("fullvm: the image at %s predates the agent on vsock (%s builds a new one)", image, ImageScript)
		}
		vs = b.vsock.ForVM(spec.ID)
	}
	mem := defaultMemoryMB
	if spec.MemoryBytes > 0 {
		mem = int(spec.MemoryBytes>>20) + guestOverheadMB
	}
	cpus := runtime.NumCPU()
	if spec.CPUMillis > 0 {
		cpus = int((spec.CPUMillis + 999) / 1000)
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID // as a container's
	}
	dir := b.vmDir(spec.ID)
	if strings.ContainsAny(dir+image, ",=") {
		return nil, errdefs.Invalidf("fullvm: path %q or %q has a character QEMU's option syntax takes (, or =)", dir, image)
	}
	// The directory is the claim on the id.
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return nil, errdefs.AlreadyExistsf("fullvm: sandbox %s exists", spec.ID)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "fullvm: VM directory")
	}
	var cu cleanup.Cleanup
	defer func() { _ = cu.Clean() }()
	cu.Add(func() error { return os.RemoveAll(dir) })
	// The sandbox's disk: its writes in an overlay of its own, the image
	// its read-only backing file (named by its resolved path, so a later
	// build does not change it under the VM).
	disk := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.CommandContext(ctx, b.opts.QEMUImg, "create", "-q", "-f", "qcow2", "-F", "qcow2",
		"-b", filepath.Join(image, "disk.qcow2"), disk).CombinedOutput(); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out))), "fullvm: disk overlay")
	}
	args, err := b.qemuArgs(dir, image, disk, mem, cpus, vs)
	if err != nil {
		return nil, err
	}
	if spec.DiskBytes > 0 {
		// The writable layer's disk: the image's warren-root makes the
		// root an overlay with its upper on it (scripts/fullvm-image.sh).
		upper := microvm.DiskImage(dir)
		if err := microvm.MakeDisk(upper, spec.DiskBytes); err != nil {
			return nil, err
		}
		args = append(args, "-drive", "file="+upper+",if=none,id=upper,format=raw,cache=writeback,discard=unmap",
			"-device", "virtio-blk-pci,drive=upper,serial="+guest.DiskSerial)
	}
	cfg := microvm.Config{QEMU: b.opts.QEMU, Dir: dir, Vsock: vs}
	var att *netpolicy.Attachment
	if !spec.Network.IsNone() {
		a, n, err := b.attach(spec.ID, hostname, spec.Network, &cu)
		if err != nil {
			return nil, err
		}
		// QEMU holds the tap once started: ours goes after the boot
		// either way.
		defer n.Tap.Close()
		cfg.Net, att = n, &a
		args = append(args, netArgs(n)...)
	}
	cfg.Args = args
	grp, err := microvm.NewHostGroup(microvm.HostGroup{Parent: b.opts.CgroupParent, Backend: Name, ID: spec.ID,
		GuestMB: mem, CPUs: cpus, KVM: b.opts.KVM, CPUMillis: spec.CPUMillis, QoS: spec.QoS})
	if err != nil {
		return nil, err
	}
	cu.Add(grp.Delete) // gone already if QEMU ran
	cfg.Cgroup = grp
	v, err := microvm.BootWithin(ctx, cfg, bootTimeout, "fullvm (a loaded node boots a full OS slowly under TCG)")
	if err != nil {
		return nil, err
	}
	cu.Add(v.Close)
	// The guest's setup after the boot: hostname, network, limits.
	bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := setHostname(bctx, v, hostname); err != nil {
		return nil, err
	}
	if err := microvm.Isolate(v.Pid(), spec.QoS); err != nil {
		return nil, err
	}
	sb := &sandbox{Sandbox: microvm.NewSandbox(spec.ID, v, microvm.SandboxOpts{Kind: Name, Env: spec.Env, Cwd: spec.Workdir,
		Rlimits: rl, CPUMillis: spec.CPUMillis, MemoryMB: mem, OverheadMB: guestOverheadMB, Disk: spec.DiskBytes > 0,
		Network: b.opts.Network, Net: att}), dir: dir}
	if cfg.Net != nil {
		if err := guestNetwork(bctx, sb, cfg.Net, len(spec.Etc) > 0); err != nil {
			return nil, err
		}
	}
	if err := guestLimits(bctx, sb, spec); err != nil {
		return nil, err
	}
	cu.Release()
	return sb, nil
}

// attach gives sandbox id a tap on the node's sandbox subnet with policy
// p's rules (netpolicy.Node.AttachTap), detached again by cu's rollback.
func (b *Backend) attach(id, hostname string, p netpolicy.Policy, cu *cleanup.Cleanup) (netpolicy.Attachment, *microvm.Net, error) {
	a, tap, err := b.opts.Network.AttachTap(Name, id, hostname, p)
	if err != nil {
		return a, nil, err
	}
	cu.Add(func() error { return b.opts.Network.Detach(id, a) })
	gw, addr := b.opts.Network.Addrs(a.Index)
	return a, &microvm.Net{Tap: tap, Addr: addr, Gateway: gw}, nil
}

// netArgs are QEMU's arguments for n: a virtio-net PCI device on the tap
// (fd 3: microvm.Boot passes it), with a MAC address of its own the
// agent finds the interface by (guestMAC).
func netArgs(n *microvm.Net) []string {
	return []string{"-netdev", "tap,id=net0,fd=3", "-device", "virtio-net-pci,netdev=net0,mac=" + guestMAC(n.Addr)}
}

// guestMAC is the VM's interface's hardware address: QEMU's prefix
// (52:54:00) and the low three bytes of its address, unique on the node's
// subnet (a /16 at most, so two bytes would do).
func guestMAC(addr netip.Addr) string {
	a := addr.As4()
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", a[1], a[2], a[3])
}

// guestNetwork gives the guest its address and route (and with resolv
// its resolv.conf naming Warren's resolver, as a container's /etc files
// are written), after the boot: the boot loader's kernel command line is
// the image's, so the agent cannot read them from it as microvm's does.
// The guest kernel keeps them: a restarted agent or an adopting daemon
// needs to send nothing. (An image whose agent cannot is refused before
// the boot: its features file does not say "network".)
func guestNetwork(ctx context.Context, sb *sandbox, n *microvm.Net, resolv bool) error {
	return sb.SetGuestNetwork(ctx, guestMAC(n.Addr), resolv)
}

// guestLimits gives the guest's cgroup of the sandbox's commands its
// memory and pids limits, before the sandbox's first command. After the boot, not
// with it: the boot loader's kernel command line is the image's, and a
// running guest keeps them (the agent keeps them across its own restart,
// an adopting daemon needs to send nothing).
func guestLimits(ctx context.Context, sb *sandbox, spec backend.Spec) error {
	if spec.MemoryBytes <= 0 && spec.PidsMax <= 0 {
		return nil
	}
	err := sb.SetGuestLimits(ctx, spec.MemoryBytes, spec.PidsMax)
	if errors.Is(err, errdefs.ErrUnsupported) {
		return errdefs.Wrap(errdefs.Unsupported, err, "fullvm: the image's agent cannot hold the sandbox's limits (an image from before they were: "+ImageScript+" builds a new one)")
	}
	return err
}

// setHostname sets the guest's, as a container's is set.
func setHostname(ctx context.Context, v *microvm.VM, h string) error {
	if strings.ContainsFunc(h, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	}) {
		return errdefs.Invalidf("hostname %q: letters, digits, '.', '-' and '_' only", h)
	}
	r, err := v.Exec(ctx, []string{"/usr/bin/hostname", h}, nil)
	if err != nil {
		return err
	}
	if r.Exit.Code != 0 {
		return errdefs.Internalf("fullvm: set hostname: %s", strings.TrimSpace(string(r.Stderr)))
	}
	return nil
}

// qemuArgs are a VM's command line: q35, the overlay as a virtio disk
// the firmware boots, a VGA screen behind a VNC unix socket, a USB-less
// absolute pointer (virtio-tablet) beside the PS/2 keyboard, the agent's
// virtio-serial port (or with vs its vsock device) and QMP.
func (b *Backend) qemuArgs(dir, image, disk string, mem, cpus int, vs *microvm.Vsock) ([]string, error) {
	accel := "tcg,thread=multi"
	if b.opts.KVM {
		accel = "kvm"
	}
	// The firmware boots the disk, unless QEMU loads the kernel itself
	// (its loader takes boot index 0).
	bootIndex := ",bootindex=0"
	if b.opts.DirectKernel {
		bootIndex = ""
	}
	machine := "q35"
	if vs.VhostUser() {
		// The backend maps the guest's memory (microvm's vsock.go).
		machine += ",memory-backend=ram"
	}
	args := []string{
		"-M", machine, "-accel", accel, "-cpu", "max",
		"-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem) + "M",
		"-nodefaults", "-no-user-config", "-no-reboot",
		"-device", "VGA",
		// A unix socket, not a TCP port: reachable only by who may
		// read the VM's directory (root), no port to allocate, no
		// password to hand out; a client on another host tunnels it.
		"-vnc", "unix:" + filepath.Join(dir, VNCSocket),
		"-serial", "stdio",
		"-drive", "file=" + disk + ",if=none,id=disk,format=qcow2,cache=writeback,discard=unmap",
		"-device", "virtio-blk-pci,drive=disk" + bootIndex,
		"-device", "virtio-tablet-pci",
		"-qmp", "unix:" + filepath.Join(dir, microvm.QMPSocket) + ",server=on,wait=off",
	}
	if vs != nil {
		args = append(args, microvm.VsockDeviceArgs(dir, vs, true)...)
		if vs.VhostUser() {
			args = append(args, "-object", microvm.MemfdRAM("ram", strconv.Itoa(mem)+"M"))
		}
	} else {
		args = append(args,
			"-device", "virtio-serial-pci",
			"-chardev", "socket,id=agent,path="+filepath.Join(dir, microvm.AgentSocket)+",server=on,wait=off",
			"-device", "virtserialport,id="+microvm.BootPortID+",chardev=agent,name="+guest.PortName)
	}
	// QEMU says on it when the agent's port closes (systemd restarts the
	// agent): the backend's session then follows the next agent.
	args = append(args, microvm.EventArgs(dir)...)
	if b.opts.DirectKernel {
		cmdline, err := os.ReadFile(filepath.Join(image, "cmdline"))
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Unsupported, err, "fullvm: the image's kernel command line ("+ImageScript+")")
		}
		args = append(args, "-kernel", filepath.Join(image, "vmlinuz"), "-initrd", filepath.Join(image, "initrd.img"),
			"-append", strings.TrimSpace(string(cmdline)))
	}
	return args, nil
}

// VNCSocket is the VM's VNC server in its directory.
const VNCSocket = "vnc.sock"

// vmState is what microvm.Sandbox.State records (its JSON keys).
type vmState struct {
	Pid     int            `json:"pid"`
	Env     []string       `json:"env,omitempty"`
	Cwd     string         `json:"cwd,omitempty"`
	Rlimits []guest.Rlimit `json:"rlimits,omitempty"`
	// Group: QEMU runs in a host cgroup of its own with this CPU quota.
	Group     bool  `json:"group,omitempty"`
	CPUMillis int64 `json:"cpu_millis,omitempty"`
	// MemoryMB is the guest's (0 from an earlier version: its memory
	// limit cannot change).
	MemoryMB int `json:"memory_mb,omitempty"`
	// Net is the VM's network (its tap and rules), nil for none.
	Net *netpolicy.Attachment `json:"net,omitempty"`
	// Disk: its writable layer is on a disk image of the limit's size.
	Disk bool `json:"disk,omitempty"`
	// Vsock is the agent's vsock device, nil for the virtio-serial port.
	Vsock *microvm.Vsock `json:"vsock,omitempty"`
}

// Adopt reaches a VM an earlier daemon booted, through an agent port of
// its own (microvm.Attach); a VM whose QEMU is gone is cleaned up and
// NotFound.
func (b *Backend) Adopt(ctx context.Context, id string, state []byte) (backend.Sandbox, error) {
	if !backend.ValidID(id) {
		return nil, errdefs.Invalidf("bad sandbox id %q", id)
	}
	var st vmState
	if err := json.Unmarshal(state, &st); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "fullvm: sandbox state")
	}
	dir := b.vmDir(id)
	if st.Net != nil {
		if b.opts.Network == nil {
			return nil, errdefs.Unavailablef("fullvm: sandbox %s has a network and this backend no sandbox networking", id)
		}
		// Taken before anything can fail, so that a cleanup below frees
		// it and no create meanwhile takes it.
		if err := b.opts.Network.Adopt(id, *st.Net); err != nil {
			return nil, err
		}
	}
	gone := func() {
		if st.Net != nil {
			_ = b.opts.Network.Detach(id, *st.Net)
		}
	}
	pids := microvm.QEMUPids(dir, st.Pid)
	if len(pids) == 0 {
		_ = os.RemoveAll(dir)
		_ = microvm.RemoveHostGroup(b.opts.CgroupParent, Name, id)
		gone()
		return nil, errdefs.NotFoundf("fullvm: sandbox %s: its VM is gone", id)
	}
	cfg := microvm.Config{QEMU: b.opts.QEMU, Dir: dir, Vsock: st.Vsock}
	if st.Group {
		cfg.Cgroup = microvm.LoadHostGroup(b.opts.CgroupParent, Name, id)
	}
	v, err := microvm.Attach(ctx, cfg, pids[0])
	if errors.Is(err, errdefs.ErrNotFound) {
		b.stopOrphan(id)
		gone()
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	sb := &sandbox{Sandbox: microvm.NewSandbox(id, v, microvm.SandboxOpts{Kind: Name, Env: st.Env, Cwd: st.Cwd,
		Rlimits: st.Rlimits, CPUMillis: st.CPUMillis, MemoryMB: st.MemoryMB, OverheadMB: guestOverheadMB, Disk: st.Disk,
		Network: b.opts.Network, Net: st.Net}), dir: dir}
	// (A paused vsock VM is frozen and its QMP silent: Running reads
	// the freezer.)
	running, err := v.Running(ctx)
	if err != nil {
		v.Close()
		return nil, err
	}
	if !running {
		// Paused by the earlier daemon: the sandbox says so.
		sb.MarkPaused()
	}
	return sb, nil
}

// Sweep stops the VMs of ids not in keep and removes their directories.
func (b *Backend) Sweep(ctx context.Context, keep map[string]bool) error {
	ents, err := os.ReadDir(filepath.Join(b.opts.StateDir, "vms"))
	if err != nil && !os.IsNotExist(err) {
		return errdefs.Wrap(errdefs.Internal, err, "fullvm sweep")
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			b.stopOrphan(e.Name())
		}
	}
	// The cgroups of QEMUs gone while no daemon ran.
	if err := microvm.SweepHostGroups(b.opts.CgroupParent, Name, keep); err != nil {
		return err
	}
	// The orphans' taps went with their QEMU; their rules, and the taps
	// of creates a crash interrupted, go here.
	if b.opts.Network != nil {
		if err := b.opts.Network.SweepTaps(Name, keep); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "fullvm sweep")
		}
	}
	return nil
}

// stopOrphan kills VM id's QEMU and removes its directory.
func (b *Backend) stopOrphan(id string) {
	microvm.StopVM(b.vmDir(id), 0, microvm.LoadHostGroup(b.opts.CgroupParent, Name, id), 5*time.Second)
	_ = microvm.RemoveHostGroup(b.opts.CgroupParent, Name, id)
}

// sandbox is one full VM: microvm's sandbox (exec, files, background
// processes, ports, pause, stats through the agent and QEMU) and the
// screen.
type sandbox struct {
	*microvm.Sandbox
	dir string
}

// hasFeature reports whether the image in dir says it can do f (its
// features file: scripts/fullvm-image.sh).
func hasFeature(dir, f string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "features"))
	return err == nil && slices.Contains(strings.Fields(string(b)), f)
}

// layersExist refuses layers that are not there: unused by the VM, they
// still name the image the sandbox was asked for, and a missing one means
// the caller's image is broken, as on every backend.
func layersExist(layers []backend.Layer) error {
	for _, l := range layers {
		p := l.Blob
		if p == "" {
			p = l.Dir
		}
		if _, err := os.Stat(p); err != nil {
			return errdefs.Wrap(errdefs.Invalid, err, "fullvm: layer "+l.Digest)
		}
	}
	return nil
}

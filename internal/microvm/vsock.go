package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
)

// The agent's transport. By default the host and the agent talk over a
// virtio-serial port (vm.go). With Config.Vsock they talk over AF_VSOCK
// instead: the guest agent listens on guest.VsockPort and every host
// connection is a session (a restarted daemon connects beside its
// predecessor's; no port is hot-plugged). The device is the node's
// kernel vhost-vsock where /dev/vhost-vsock is there, else a vhost-user
// device served by a user-space backend process per VM (rust-vmm's
// vhost-device-vsock), whose "hybrid vsock" unix socket the host
// connects to with a "CONNECT <port>" line. A vhost-user backend maps
// the guest's memory, which is then a shared memfd (ramObject).
//
// Checkpoints of vsock VMs are refused (Checkpoint): QEMU 7.2 does not
// migrate a vhost-user-vsock device, and the kernel device's migration is
// untested here.

// Transport names, as the daemon's --vm-transport takes them.
const (
	TransportSerial = "serial"
	TransportVsock  = "vsock"
)

// Vsock is a VM's vsock device.
type Vsock struct {
	// Kernel says the device is the node's vhost-vsock, and CID is the
	// guest's address there (unique on the node).
	Kernel bool   `json:"kernel,omitempty"`
	CID    uint32 `json:"cid,omitempty"`
	// Backend is the vhost-user backend's executable (not Kernel).
	Backend string `json:"backend,omitempty"`
}

// The vhost-user backend's sockets in the VM's directory: QEMU's control
// path, and the host's end of the guest's connections.
const (
	vhostUserSocket = "vhu.sock"
	hybridSocket    = "vsock.sock"
)

// VhostVsockDevice is the node's kernel vsock device for VMs.
const VhostVsockDevice = "/dev/vhost-vsock"

// KernelVsock reports whether the node has the kernel's vhost-vsock.
func KernelVsock() bool {
	f, err := os.OpenFile(VhostVsockDevice, os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// VsockPrefix is where scripts/vsock.sh installs vhost-device-vsock (and
// VsockPrefix.error says why it could not).
const VsockPrefix = "/opt/warren/vsock"

// PickVsock is the vsock device for the VMs of a node asked for transport
// vsock: the kernel's where the node has it, else the vhost-user backend
// (backend; default vhost-device-vsock on $PATH, else scripts/vsock.sh's);
// Unsupported naming both when it has neither.
func PickVsock(backendPath string) (Vsock, error) {
	if KernelVsock() {
		return Vsock{Kernel: true}, nil
	}
	if backendPath == "" {
		backendPath = "vhost-device-vsock"
		if _, err := exec.LookPath(backendPath); err != nil {
			backendPath = filepath.Join(VsockPrefix, "bin", "vhost-device-vsock")
		}
	}
	p, err := exec.LookPath(backendPath)
	if err != nil {
		why := "scripts/vsock.sh installs it"
		if b, err := os.ReadFile(VsockPrefix + ".error"); err == nil {
			why = "scripts/vsock.sh: " + strings.TrimSpace(string(b))
		}
		return Vsock{}, errdefs.Unsupportedf("microvm: transport vsock: this node has no %s (the kernel's CONFIG_VHOST_VSOCK) and no vhost-user backend %s (%s)", VhostVsockDevice, backendPath, why)
	}
	return Vsock{Backend: p}, nil
}

// forVM is the device of the VM id: the kernel's needs a CID of its own
// on the node, taken from the id (a collision fails QEMU's start, naming
// it).
func (d Vsock) forVM(id string) *Vsock {
	if d.Kernel {
		h := sha256.Sum256([]byte(id))
		d.CID = 3 + binary.LittleEndian.Uint32(h[:4])%(1<<31-3)
	}
	return &d
}

// vsockArgs are QEMU's options for the device, and the kernel's.
func vsockArgs(cfg Config) (args []string, cmdline string) {
	return VsockDeviceArgs(cfg.Dir, cfg.Vsock, false), " warren.transport=" + guest.TransportVsock
}

// VsockDeviceArgs are QEMU's options for the vsock device d of the VM in
// dir: on virtio-mmio (-M microvm), or with pci on the PCI bus (q35:
// internal/fullvm).
func VsockDeviceArgs(dir string, d *Vsock, pci bool) []string {
	bus := "device"
	if pci {
		bus = "pci"
	}
	if d.Kernel {
		return []string{"-device", fmt.Sprintf("vhost-vsock-%s,id=vsock,guest-cid=%d", bus, d.CID)}
	}
	return []string{
		"-chardev", "socket,id=vhu,path=" + filepath.Join(dir, vhostUserSocket),
		"-device", "vhost-user-vsock-" + bus + ",id=vsock,chardev=vhu",
	}
}

// VhostUser says d is a vhost-user device (a backend process, the
// guest's RAM a shared memfd: MemfdRAM).
func (d *Vsock) VhostUser() bool { return d != nil && !d.Kernel }

// MemfdRAM is the QEMU object of a guest memory block id of size that a
// vhost-user backend can map (a shared memfd).
func MemfdRAM(id, size string) string {
	return fmt.Sprintf("memory-backend-memfd,id=%s,size=%s,share=on", id, size)
}

// vhostUser says the VM's vsock is a vhost-user device, whose backend
// maps the guest's memory.
func (cfg Config) vhostUser() bool { return cfg.Vsock.VhostUser() }

// ramObject is the QEMU object of the guest memory block id of size (a
// QEMU size: "256M"): private, or a shared memfd that a vhost-user
// backend can map.
func ramObject(cfg Config, id, size string) string {
	if cfg.vhostUser() {
		return MemfdRAM(id, size)
	}
	return fmt.Sprintf("memory-backend-ram,id=%s,size=%s", id, size)
}

// vsockModules are the guest's drivers for the device.
var vsockModules = []string{"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport"}

// startVsockBackend starts the VM's vhost-user backend, in the VM's
// cgroup when it has one (the backend's memory is the VM's), and waits
// until it listens for QEMU. It runs until killVsockBackend.
func startVsockBackend(ctx context.Context, cfg Config) error {
	sock := filepath.Join(cfg.Dir, vhostUserSocket)
	_ = os.Remove(sock)
	_ = os.Remove(filepath.Join(cfg.Dir, hybridSocket))
	args := []string{"--guest-cid", "3", "--socket", sock, "--uds-path", filepath.Join(cfg.Dir, hybridSocket)}
	cmd, goAhead, err := groupCommand(cfg.Cgroup, "vsock", cfg.Vsock.Backend, args)
	if err != nil {
		return err
	}
	defer goAhead.close()
	logf, err := os.Create(filepath.Join(cfg.Dir, "vsock.log"))
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "create the vsock backend's log")
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session, as QEMU's: a daemon that goes leaves the VM whole.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "start the vsock backend")
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := goAhead.run(cmd); err != nil {
		<-exited
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(cfg.Dir, "vsock.log"))
			return errdefs.Unavailablef("the vsock backend exited before it listened: %s", strings.TrimSpace(string(b)))
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return errdefs.Unavailablef("the vsock backend did not listen on %s within 10 s", sock)
		}
	}
}

// vsockBackendPids are the vhost-user backends of the VM in dir, found by
// their socket in their command line (a VM booted by an earlier daemon's
// has no handle here).
func vsockBackendPids(dir string) []int {
	// (QEMU names the socket too, in its own syntax.)
	arg := "--socket\x00" + filepath.Join(dir, vhostUserSocket) + "\x00"
	return pidsWhose(func(cmdline string) bool { return strings.Contains(cmdline, arg) })
}

// killVsockBackend kills the vhost-user backend of the VM in dir and
// waits for it to go.
func killVsockBackend(dir string) {
	for _, pid := range vsockBackendPids(dir) {
		killAndWait(pid, 2*time.Second)
	}
}

// vsockConnRetry is how often a connection the guest refused (no agent
// listening yet: a boot) is tried again.
const vsockConnRetry = 20 * time.Millisecond

// dialVsock connects to the agent's vsock port, trying again until the
// guest takes it (its agent listens once it booted), QEMU exits or ctx
// ends.
func (v *VM) dialVsock(ctx context.Context) (io.ReadWriteCloser, error) {
	if err := v.vsockListening(ctx); err != nil {
		return nil, err
	}
	var last error
	for {
		var c io.ReadWriteCloser
		var err error
		if v.cfg.Vsock.Kernel {
			c, err = dialKernelVsock(v.cfg.Vsock.CID, guest.VsockPort)
		} else {
			c, err = dialHybrid(ctx, filepath.Join(v.cfg.Dir, hybridSocket), guest.VsockPort)
		}
		if err == nil {
			return c, nil
		}
		last = err
		if !v.cfg.Vsock.Kernel && len(vsockBackendPids(v.cfg.Dir)) == 0 {
			return nil, fmt.Errorf("%w (last try: %v)", errBackendGone, err)
		}
		select {
		case <-v.done:
			return nil, errdefs.Unavailablef("qemu exited before the agent listened on vsock: %v (last try: %v; console: %s)", v.err, last, v.consoleTail())
		case <-v.closed:
			return nil, errdefs.Unavailablef("the VM was closed")
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last vsock connection: %v)", ctx.Err(), last)
		case <-time.After(vsockConnRetry):
		}
	}
}

// vsockListening waits until the guest agent said on the console that it
// listens (guest.VsockReady). vhost-device-vsock 0.3.0 takes a host
// connection that comes before the guest's driver has set the device up
// ("Received a backend event before vring initialization"), and in some
// such races (5 of 16 concurrent boots here) then never reaches the
// guest again, for that or any later connection.
func (v *VM) vsockListening(ctx context.Context) error {
	if v.vsockUp.Load() {
		return nil
	}
	path := filepath.Join(v.cfg.Dir, "console.log")
	for {
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), guest.VsockReady) {
			v.vsockUp.Store(true)
			return nil
		}
		select {
		case <-v.done:
			return errdefs.Unavailablef("qemu exited before the agent listened on vsock: %v (console: %s)", v.err, v.consoleTail())
		case <-v.closed:
			return errdefs.Unavailablef("the VM was closed")
		case <-ctx.Done():
			return fmt.Errorf("%w (waiting for the guest agent to listen on vsock; console: %s)", ctx.Err(), v.consoleTail())
		case <-time.After(vsockConnRetry):
		}
	}
}

// dialHybrid connects to port in the guest through a vhost-user
// backend's unix socket: "CONNECT <port>\n", answered "OK <host port>\n"
// once the guest accepted (the backend closes the socket if it refused).
func dialHybrid(ctx context.Context, sock string, port uint32) (io.ReadWriteCloser, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	// The answer is read byte by byte: what follows it is the session's.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		c.Close()
		return nil, err
	}
	line, err := readLine(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("vsock CONNECT %d: %w", port, err)
	}
	if !strings.HasPrefix(line, "OK ") {
		c.Close()
		return nil, fmt.Errorf("vsock CONNECT %d: the backend answered %q", port, line)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// readLine reads up to a newline, one byte at a time (no read-ahead).
func readLine(r io.Reader) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for len(b) < 64 {
		if _, err := io.ReadFull(r, one); err != nil {
			return "", err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
	return "", errors.New("no newline in 64 bytes")
}

// dialKernelVsock connects to cid:port through the node's vsock.
func dialKernelVsock(cid, port uint32) (io.ReadWriteCloser, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(fd, &unix.SockaddrVM{CID: cid, Port: port}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// Non-blocking for the runtime's poller (os.NewFile sees the flag):
	// deadlines then work on it.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "vsock"), nil
}

// agent is the session calls open streams on, connected first where the
// VM has none yet (a vsock VM adopted while paused: Attach).
func (v *VM) agent(ctx context.Context) (*yamux.Session, error) {
	v.smu.Lock()
	defer v.smu.Unlock()
	if v.sess != nil {
		return v.sess, nil
	}
	if v.cfg.Vsock == nil {
		return nil, errdefs.Unavailablef("microvm: no session with the guest agent")
	}
	conn, err := v.dialVsock(ctx)
	if err != nil {
		return nil, err
	}
	sess, err := agentSession(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	v.conn, v.sess = conn, sess
	v.watchVsock()
	return sess, nil
}

// watchVsock reconnects a vsock VM's session when it ends while QEMU
// runs (the guest agent restarted: the guest reset its connections). The
// dial is made outside smu: it waits for the guest, and calls meanwhile
// fail at once on the ended session instead of waiting behind it. A VM
// whose vhost-user backend died is unreachable for good (QEMU 7.2's
// vhost-user-vsock does not reconnect): it is stopped, saying why on its
// console, so that its sandbox ends instead of hanging every call.
func (v *VM) watchVsock() {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-v.done:
		case <-v.closed:
		}
		cancel()
	}()
	go func() {
		for {
			s := v.session()
			select {
			case <-s.CloseChan():
			case <-ctx.Done():
				return
			}
			if ctx.Err() != nil {
				return
			}
			v.losses.Add(1)
			conn, err := v.dialVsock(ctx)
			if errors.Is(err, errBackendGone) {
				v.stopUnreachable("the vsock backend (vhost-device-vsock) exited: the guest agent cannot be reached")
				return
			}
			if err != nil {
				return // QEMU is gone, or the VM closed
			}
			sess, err := agentSession(conn)
			if err != nil {
				conn.Close()
				return
			}
			v.smu.Lock()
			v.conn, v.sess = conn, sess
			v.smu.Unlock()
		}
	}()
}

// errBackendGone: the VM's vhost-user backend is not running.
var errBackendGone = errors.New("the vsock backend is gone")

// stopUnreachable kills the VM's QEMU, first writing why to its console
// (errors about the VM's end quote the console's tail).
func (v *VM) stopUnreachable(why string) {
	if f, err := os.OpenFile(filepath.Join(v.cfg.Dir, "console.log"), os.O_WRONLY|os.O_APPEND, 0); err == nil {
		fmt.Fprintf(f, "\nwarren: %s; the VM is stopped\n", why)
		f.Close()
	}
	if v.cmd != nil {
		_ = v.cmd.Process.Kill()
	} else {
		_ = unix.PidfdSendSignal(v.pidfd, unix.SIGKILL, nil, 0)
	}
}

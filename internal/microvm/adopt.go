package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/qmp"
)

// Attach reaches the agent of a VM that an earlier daemon booted: QEMU
// pid, whose command line names cfg.Dir's agent socket. QEMU's chardev
// socket takes one client, which may still be the earlier daemon's (or a
// handle of this one: the conformance suite adopts beside a live
// handle), so this daemon hot-plugs a port of its own through QMP: a
// chardev socket and a virtio-serial port named PortName.N, which the
// agent serves as it serves the boot's. The guest is not asked anything:
// a paused VM's agent answers once it is resumed.
//
// NotFound if pid is not that QEMU; any other error leaves the VM alone.
func Attach(ctx context.Context, cfg Config, pid int) (_ *VM, err error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.NotFound, err, "microvm: the VM's QEMU")
	}
	// Checked again through the pidfd's process: the pid may have been
	// reused since it was found.
	if !isQEMUOf(pid, cfg.Dir) {
		unix.Close(pidfd)
		return nil, errdefs.NotFoundf("microvm: process %d is not the VM's QEMU", pid)
	}
	v := &VM{cfg: cfg, pid: pid, pidfd: pidfd, done: make(chan struct{}), closed: make(chan struct{})}
	defer func() {
		if err != nil {
			if v.sess != nil {
				v.sess.Close()
			}
			unix.Close(pidfd)
		}
	}()
	if cfg.Vsock != nil {
		// A vsock agent takes any number of connections: no port to add.
		// A connection needs the guest to run, though: a paused VM's is
		// made by the first call after its resume (VM.agent).
		if err := v.watchQEMU(); err != nil {
			return nil, err
		}
		running, err := v.running(ctx)
		if err != nil {
			return nil, err
		}
		if running {
			if _, err := v.agent(ctx); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	sock, portID, err := v.hotplugPort(ctx)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "connect to the VM's new agent port")
	}
	v.conn = conn
	if v.sess, err = agentSession(conn); err != nil {
		conn.Close()
		return nil, err
	}
	// The VM is done when its QEMU is (a session may end and be made
	// again: watchAgent).
	if err := v.watchQEMU(); err != nil {
		return nil, err
	}
	v.watchAgent(sock, portID)
	return v, nil
}

// hotplugPort adds a chardev socket and a virtio-serial port on it, named
// by the first free N, and returns the socket's path and the port's
// device id.
func (v *VM) hotplugPort(ctx context.Context) (sock, portID string, err error) {
	c, err := qmp.Dial(ctx, filepath.Join(v.cfg.Dir, qmpSocket))
	if err != nil {
		return "", "", errdefs.Wrap(errdefs.Unavailable, err, "connect to QEMU's QMP socket")
	}
	defer c.Close()
	unplugStale(ctx, c, v.cfg.Dir)
	for n := 1; n <= 64; n++ {
		// Short: a unix socket's path is at most 107 bytes.
		sock := filepath.Join(v.cfg.Dir, fmt.Sprintf("a%d.sock", n))
		if _, err := os.Stat(sock); err == nil {
			continue // an earlier daemon's port
		}
		id := fmt.Sprintf("agent%d", n)
		err := c.Run(ctx, "chardev-add", map[string]any{"id": id, "backend": map[string]any{
			"type": "socket", "data": map[string]any{
				"addr":   map[string]any{"type": "unix", "data": map[string]any{"path": sock}},
				"server": true, "wait": false,
			}}}, nil)
		var qerr *qmp.Error
		if errors.As(err, &qerr) && strings.Contains(qerr.Desc, "already exists") {
			continue
		}
		if err != nil {
			return "", "", errdefs.Wrap(errdefs.Unavailable, err, "add an agent socket to the VM")
		}
		portID := "port" + fmt.Sprint(n)
		if err := c.Run(ctx, "device_add", map[string]any{"driver": "virtserialport", "id": portID,
			"chardev": id, "name": fmt.Sprintf("%s.%d", guest.PortName, n)}, nil); err != nil {
			_ = c.Run(ctx, "chardev-remove", map[string]any{"id": id}, nil)
			return "", "", errdefs.Wrap(errdefs.Unavailable, err, "add an agent port to the VM")
		}
		return sock, portID, nil
	}
	return "", "", errdefs.Exhaustedf("microvm: the VM has 64 agent ports: too many daemon restarts")
}

// staleAfter is how old a port without a host must be to be unplugged.
const staleAfter = 10 * time.Second

// unplugStale removes the ports of earlier adoptions whose host is gone:
// QEMU names a socket chardev without a client "disconnected:...". (The
// boot's port stays: QEMU's command line made it.) Best effort: a port
// left costs one of virtio-serial's 31.
func unplugStale(ctx context.Context, c *qmp.Client, dir string) {
	var chardevs []struct {
		Label    string `json:"label"`
		Filename string `json:"filename"`
	}
	if c.Run(ctx, "query-chardev", nil, &chardevs) != nil {
		return
	}
	for _, cd := range chardevs {
		var n int
		if _, err := fmt.Sscanf(cd.Label, "agent%d", &n); err != nil || !strings.HasPrefix(cd.Filename, "disconnected:") {
			continue
		}
		// A port another adoption just added has no client for the
		// moment it takes to connect.
		sock := filepath.Join(dir, fmt.Sprintf("a%d.sock", n))
		if fi, err := os.Stat(sock); err == nil && time.Since(fi.ModTime()) < staleAfter {
			continue
		}
		// (Already gone: an earlier adoption's unplug that did not finish
		// removing the chardev.)
		var qerr *qmp.Error
		if err := c.Run(ctx, "device_del", map[string]any{"id": fmt.Sprintf("port%d", n)}, nil); err != nil &&
			!(errors.As(err, &qerr) && qerr.Class == "DeviceNotFound") {
			continue
		}
		// The port goes once the guest let go of it: until then its
		// chardev is busy.
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if c.Run(ctx, "chardev-remove", map[string]any{"id": cd.Label}, nil) == nil {
				_ = os.Remove(sock)
				break
			}
		}
	}
}

// isQEMUOf reports whether process pid is the QEMU of the VM in dir (its
// command line names the QMP socket there: every VM has one, whatever
// its agent's transport).
func isQEMUOf(pid int, dir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && qemuOf(dir)(string(b))
}

// qemuOf says whether a command line is the QEMU of the VM in dir.
func qemuOf(dir string) func(cmdline string) bool {
	qmp := "unix:" + filepath.Join(dir, qmpSocket) + ","
	return func(cmdline string) bool { return strings.Contains(cmdline, qmp) }
}

// killPidfd kills the process of pidfd and waits (bounded) until it is
// gone, then closes pidfd.
func killPidfd(pidfd int) {
	if pidfd < 0 {
		return
	}
	defer unix.Close(pidfd)
	_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
	// A pidfd reads as ready once its process exited.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 1000); n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return
		}
	}
}

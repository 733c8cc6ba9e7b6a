package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/qmp"
)

// The guest agent can go while its VM stays: a full VM's agent is a
// systemd service, which systemd restarts. Its port then closes in the
// guest, and only QEMU's events say so (VSERPORT_CHANGE): the host's
// socket stays connected, so the calls in flight would wait forever, and
// bytes of theirs would reach the next agent as garbage. On that event
// the VM ends its session, which fails the calls in flight
// (Unavailable, saying the agent went), and connects again at once: the
// next agent serves the new session. The events come on a monitor of
// their own (QEMU serves one client per monitor, and the QMP socket is
// dialled per use).

// EventsSocket is the VM's events monitor in its directory (EventArgs).
const EventsSocket = "ev.sock"

// BootPortID is the device id of the agent's port the VM boots with
// (VSERPORT_CHANGE names a port by it).
const BootPortID = "agentport"

// EventArgs are QEMU's options for the VM's events monitor in dir.
func EventArgs(dir string) []string {
	return []string{"-chardev", "socket,id=qmpev,path=" + filepath.Join(dir, EventsSocket) + ",server=on,wait=off",
		"-mon", "chardev=qmpev,mode=control"}
}

// session is the agent session calls open streams on.
func (v *VM) session() *yamux.Session {
	v.smu.Lock()
	defer v.smu.Unlock()
	return v.sess
}

// AgentLosses is how many times the VM's agent closed its port while the
// VM ran (each ended the session of that moment).
func (v *VM) AgentLosses() int64 { return v.losses.Load() }

// watchAgent follows the VM's events monitor until QEMU exits and
// reconnects the session on sock when the guest closes the port portID.
// A VM started without the monitor (by an earlier version) is not
// watched.
func (v *VM) watchAgent(sock, portID string) {
	path := filepath.Join(v.cfg.Dir, EventsSocket)
	if _, err := os.Stat(path); err != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		// The monitor takes one client: a second handle of the same VM
		// (an adoption beside a live one) waits here until the first is
		// gone.
		c, err := qmp.Dial(ctx, path)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			ev, err := c.NextEvent(ctx)
			if err != nil {
				return
			}
			if ev.Event != "VSERPORT_CHANGE" {
				continue
			}
			var d struct {
				ID   string `json:"id"`
				Open bool   `json:"open"`
			}
			if json.Unmarshal(ev.Data, &d) != nil || d.ID != portID || d.Open {
				continue
			}
			v.reconnect(ctx, sock)
		}
	}()
	go func() {
		select {
		case <-v.done:
		case <-v.closed:
		}
		cancel()
	}()
}

// reconnect ends the session and connects a new one on sock. Until the
// next agent opens the port, QEMU holds what the new session sends, as
// during a boot.
func (v *VM) reconnect(ctx context.Context, sock string) {
	v.smu.Lock()
	defer v.smu.Unlock()
	v.losses.Add(1)
	// QEMU takes the next client once this one is gone.
	v.conn.Close()
	v.sess.Close()
	conn, err := v.dialAgent(ctx, sock)
	if err != nil {
		return // QEMU is gone, or the VM closed: calls fail as they do then
	}
	sess, err := agentSession(conn)
	if err != nil {
		conn.Close()
		return
	}
	v.conn, v.sess = conn, sess
}

// lostErr is err of a call or a process whose session ended, saying why
// where the agent went during it (losses was n at its start).
func (v *VM) lostErr(err error, n int64, what string) error {
	if v.losses.Load() != n {
		return errdefs.Wrap(errdefs.Unavailable, err, what+": the guest agent exited meanwhile (its connection closed); what it ran for the call is lost")
	}
	return errdefs.Wrap(errdefs.Unavailable, err, what)
}

// watchQEMU closes done when an attached VM's QEMU (not this process's
// child: its pidfd says) exits, and removes its cgroup if it has one, as
// startQEMU's waiter does for a VM this daemon booted.
func (v *VM) watchQEMU() error {
	fd, err := unix.Dup(v.pidfd)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: watch the VM's QEMU")
	}
	if v.cfg.Cgroup != nil {
		v.cgDone = make(chan struct{})
	}
	go func() {
		defer unix.Close(fd)
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, -1); n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
				break
			}
		}
		v.err = errors.New("QEMU exited")
		v.ended()
		close(v.done)
	}()
	return nil
}

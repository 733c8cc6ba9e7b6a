package guest

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"
)

// The host's sessions. The VM boots with the port PortName, which the
// daemon that started it holds. A daemon that restarts has the node add
// a port of its own (PortName + ".N", hot-plugged through QMP:
// microvm.Backend.Adopt), so that it reaches the agent whether or not
// the earlier daemon's connection is gone; the agent serves every such
// port. A port whose host goes (its socket's client closed) is served
// again when a host connects anew.

// hostPoll is how often a port without a host is tried.
const hostPoll = 50 * time.Millisecond

// isAgentPort reports whether a virtio-serial port's name is one the
// agent serves.
func isAgentPort(name string) bool {
	return name == PortName || strings.HasPrefix(name, PortName+".")
}

// watchPorts serves the agent's ports that appear after the boot's. It
// looks again on each kernel uevent (a hot-plugged port's "add"), so an
// idle guest is not woken; without a uevent socket, every 200 ms.
func (s *server) watchPorts(boot string) {
	served := map[string]bool{boot: true}
	gone := make(chan string)
	events := ueventsOrTicks()
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			b, err := os.ReadFile(n)
			dev := "/dev/" + filepath.Base(filepath.Dir(n))
			if err != nil || !isAgentPort(strings.TrimSpace(string(b))) || served[dev] {
				continue
			}
			if _, err := os.Stat(dev); err != nil {
				continue // devtmpfs has not made it yet
			}
			served[dev] = true
			go func() {
				err := s.servePort(dev)
				log.Printf("port %s: %v", dev, err)
				gone <- dev
			}()
		}
		select {
		case dev := <-gone:
			delete(served, dev)
		case <-events:
			// The device node may come a moment after the event.
			time.Sleep(hostPoll)
		}
	}
}

// ueventsOrTicks is a channel that gets a value on each kernel uevent,
// or every 4 hostPolls where the guest has no uevent socket.
func ueventsOrTicks() <-chan struct{} {
	ch := make(chan struct{}, 1)
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_KOBJECT_UEVENT)
	if err == nil {
		if err = unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
			unix.Close(fd)
		}
	}
	go func() {
		buf := make([]byte, 8192)
		for {
			if err != nil {
				time.Sleep(4 * hostPoll)
			} else if _, _, rerr := unix.Recvfrom(fd, buf, 0); rerr != nil && !errors.Is(rerr, unix.EINTR) && !errors.Is(rerr, unix.ENOBUFS) {
				log.Printf("uevents: %v", rerr)
				unix.Close(fd)
				err = rerr
			}
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	return ch
}

// servePort serves the host's sessions on one port, one after another,
// until the port goes (hot-unplugged).
func (s *server) servePort(dev string) error {
	for {
		conn, err := waitHost(dev)
		if err != nil {
			return err
		}
		if err := s.serveSession(conn); err != nil {
			return err
		}
	}
}

// serveSession serves one host's session on conn until the host goes:
// its streams end (their processes are killed, background ones stay),
// and so does conn, which wakes writes stuck without a host.
func (s *server) serveSession(conn io.ReadWriteCloser) error {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = false // the host sees the VM go by its process
	sess, err := yamux.Server(conn, cfg)
	if err != nil {
		conn.Close()
		return err
	}
	for {
		st, err := sess.Accept()
		if err != nil {
			break
		}
		go s.serve(st)
	}
	sess.Close()
	return nil
}

// waitHost opens a port and waits until a host is connected and has sent
// its first byte (a port without a host reads as at its end).
func waitHost(dev string) (io.ReadWriteCloser, error) {
	var f *os.File
	for {
		var err error
		f, err = os.OpenFile(dev, os.O_RDWR, 0)
		if err == nil {
			break
		}
		// EBUSY: the last session's file is still closing.
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("open %s: %w", dev, err)
		}
		time.Sleep(hostPoll)
	}
	first := make([]byte, 1)
	for {
		n, err := f.Read(first)
		if n == 1 {
			return &primed{first: first, f: f}, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			f.Close()
			return nil, fmt.Errorf("read %s: %w", dev, err)
		}
		time.Sleep(hostPoll)
	}
}

// primed is a port whose first byte was read already.
type primed struct {
	first []byte
	f     *os.File
}

func (p *primed) Read(b []byte) (int, error) {
	if len(p.first) > 0 && len(b) > 0 {
		n := copy(b, p.first)
		p.first = p.first[n:]
		return n, nil
	}
	return p.f.Read(b)
}

func (p *primed) Write(b []byte) (int, error) { return p.f.Write(b) }
func (p *primed) Close() error                { return p.f.Close() }

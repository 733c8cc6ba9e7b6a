package guest

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// serveVsock serves the host's sessions over AF_VSOCK (a microVM booted
// with warren.transport=vsock, a full VM with a vsock device): each
// connection to VsockPort is a session, as a virtio-serial port's host
// is, and any number may be open at once (a restarted daemon connects
// beside its predecessor's: no port to hot-plug). It says VsockReady on
// console once the guest's vsock device is up and it listens: the host
// connects only then (a vhost-user backend asked to connect before the
// guest's driver set the device up can lose the device).
func (s *server) serveVsock(console string) error {
	if err := waitVsockDevice(5 * time.Minute); err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("vsock: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: VsockPort}); err != nil {
		return fmt.Errorf("vsock: bind port %d: %w", VsockPort, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		return fmt.Errorf("vsock: listen: %w", err)
	}
	sayReady(console)
	for {
		// Non-blocking, so that the file's reads and writes go through
		// the runtime's poller (os.NewFile sees the flag).
		nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			continue
		}
		if err != nil {
			return fmt.Errorf("vsock: accept: %w", err)
		}
		go func() {
			if err := s.serveSession(os.NewFile(uintptr(nfd), "vsock")); err != nil {
				log.Printf("vsock session: %v", err)
			}
		}()
	}
}

// sayReady writes VsockReady where the host reads the guest's console:
// the agent's own log when it is init (its stderr is the console), else
// the serial console's device.
func sayReady(console string) {
	if console == "" {
		log.Print(VsockReady)
		return
	}
	f, err := os.OpenFile(console, os.O_WRONLY|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		log.Printf("%s (and %s: %v)", VsockReady, console, err)
		return
	}
	fmt.Fprintf(f, "\r\nwarren-guest: %s\r\n", VsockReady)
	f.Close()
	log.Print(VsockReady)
}

// hasVsockDevice reports whether the VM has a virtio vsock device
// (virtio device id 19), bound to its driver or not.
func hasVsockDevice() bool {
	ids, _ := filepath.Glob("/sys/bus/virtio/devices/*/device")
	for _, p := range ids {
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == "0x0013" {
			return true
		}
	}
	return false
}

// waitVsockDevice waits until the guest's vsock transport has its device
// (the local CID is known: the driver set the device up), which udev
// loads the driver for late in a full OS's boot.
func waitVsockDevice(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		// Opening an AF_VSOCK socket has the kernel load vsock (and its
		// /dev/vsock) if nothing did yet.
		if fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
			unix.Close(fd)
		}
		if f, err := os.Open("/dev/vsock"); err == nil {
			cid, err := unix.IoctlGetUint32(int(f.Fd()), unix.IOCTL_VM_SOCKETS_GET_LOCAL_CID)
			f.Close()
			if err == nil && cid != unix.VMADDR_CID_ANY {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vsock: no device after %v", wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

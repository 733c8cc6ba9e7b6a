package guest

import (
	"errors"
	"fmt"
	"log"
	"os"

	"golang.org/x/sys/unix"
)

// serveVsock serves the host's sessions over AF_VSOCK (the VM booted with
// warren.transport=vsock): each connection to VsockPort is a session, as
// a virtio-serial port's host is, and any number may be open at once (a
// restarted daemon connects beside its predecessor's: no port to
// hot-plug).
func (s *server) serveVsock() error {
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
	// To the console: the host connects only once it reads this (a
	// vhost-user backend asked to connect before the guest's driver set
	// the device up can lose the device).
	log.Print(VsockReady)
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

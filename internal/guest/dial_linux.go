package guest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

// dialTimeout bounds a connection to a port in the sandbox (its own
// loopback: a refusal comes at once, a timeout only from a stuck guest).
const dialTimeout = 10 * time.Second

// dialPort connects to a port on the guest's loopback, which is the
// sandbox's (its processes share the guest's network), and carries the
// connection over the stream: the host's ingress to a server in the
// sandbox (backend.PortDialer).
func dialPort(st net.Conn, br *bufio.Reader, port int) {
	if port <= 0 || port > 65535 {
		fail(st, errdefs.Invalid, fmt.Errorf("port %d: want 1 to 65535", port))
		return
	}
	// IPv4's loopback first (servers on 0.0.0.0, 127.0.0.1 or a
	// dual-stack ::), then IPv6's, for a server bound to ::1 only.
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if errors.Is(err, syscall.ECONNREFUSED) {
		if c6, err6 := d.Dial("tcp6", net.JoinHostPort("::1", strconv.Itoa(port))); err6 == nil {
			c, err = c6, nil
		}
	}
	if err != nil {
		fail(st, errdefs.Unavailable, err)
		return
	}
	defer c.Close()
	if WriteFrame(st, KindStarted, []byte("{}")) != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, br)
		// The host's end of writing: the server reads its end.
		_ = c.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(st, c)
	// The server's end: the host reads its end; the stream's close (by
	// serve) ends the copy above once the host closes too.
	_ = st.Close()
	<-done
}

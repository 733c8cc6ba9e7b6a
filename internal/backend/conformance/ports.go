package conformance

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// ports: a backend.PortDialer reaches a server listening in a sandbox
// without a network, both ways, on IPv4's loopback or IPv6's; a port nothing listens on is
// Unavailable, a bad port Invalid, and a destroyed sandbox an error.
func ports(t *testing.T, b backend.Backend, h Harness) {
	sb := create(t, b, h, nil)
	d, ok := sb.(backend.PortDialer)
	if !ok {
		t.Skip("the backend cannot connect to sandboxes' ports (backend.PortDialer)")
	}
	ctx := context.Background()
	proc, err := sb.Start(ctx, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", "exec nc -ll -p 8080 -e /bin/cat"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Close()
	var c net.Conn
	waitFor(t, func() bool {
		c, err = d.DialPort(ctx, 8080)
		return err == nil
	})
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "through\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "through\n" {
		t.Fatalf("echo from the sandbox's server: %q %v", line, err)
	}
	c.Close()
	// A server on IPv6's loopback only is reached too.
	proc6, err := sb.Start(ctx, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", "exec httpd -f -p '[::1]:8081' -h /"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer proc6.Close()
	waitFor(t, func() bool {
		c, err = d.DialPort(ctx, 8081)
		return err == nil
	})
	c.Close()
	if _, err := d.DialPort(ctx, 8099); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Errorf("dial a port nothing listens on: %v, want unavailable", err)
	}
	if _, err := d.DialPort(ctx, 0); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Errorf("dial port 0: %v, want invalid", err)
	}
	_ = proc.Close()
	_ = proc6.Close()
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := d.DialPort(ctx, 8080); err == nil {
		c.Close()
		t.Errorf("dial into a destroyed sandbox succeeded")
	}
}

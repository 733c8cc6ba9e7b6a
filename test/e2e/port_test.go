package e2e

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// addrCGI answers the address the request came from, as the server in
// the sandbox sees it.
const addrCGI = "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\necho \"from=$REMOTE_ADDR\"\n"

// TestPortTunnelIsIngressInsideTheSandbox: Warren's port tunnel
// (client.DialPort, which the E2B door's get_host proxy rides on) reaches
// a server in a sandbox whatever its network mode (none, open,
// allowlist), and the server sees the connection come from the sandbox's
// own loopback: it is made inside the sandbox's network namespace, so it
// passes neither the host's network nor the sandbox's egress filter. A
// port nothing listens on is Unavailable, an unknown sandbox NotFound, a
// paused one Conflict.
func TestPortTunnelIsIngressInsideTheSandbox(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	for _, mode := range []string{"none", "open", "allowlist"} {
		pol := policy(mode)
		if mode == "allowlist" {
			pol = policy(mode, &warrenv1.NetworkRule{Cidr: "10.9.9.9/32"})
		}
		sb := e.create(&warrenv1.CreateRequest{Network: pol})
		id := sb.GetId()
		if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/tmp/www/cgi-bin/addr", Content: []byte(addrCGI),
			Mode: 0o755, MakeParents: true}); err != nil {
			t.Fatal(err)
		}
		e.shOK(id, "busybox httpd -p 8080 -h /tmp/www")
		var conn net.Conn
		deadline := time.Now().Add(30 * time.Second)
		for {
			var err error
			if conn, err = e.c.DialPort(ctx, id, 8080); err == nil {
				break
			}
			if client.CategoryOf(err) != client.CategoryUnavailable || time.Now().After(deadline) {
				t.Fatalf("mode %s: dial port 8080: %v", mode, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(conn, "GET /cgi-bin/addr HTTP/1.0\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(conn)
		conn.Close()
		// busybox httpd listens on IPv6 and prints an IPv4 peer mapped.
		loopback := strings.Contains(string(out), "from=127.0.0.1\n") || strings.Contains(string(out), "from=[::ffff:127.0.0.1]\n")
		if err != nil || !strings.HasPrefix(string(out), "HTTP/1.") || !loopback {
			t.Fatalf("mode %s: answer through the tunnel: %q %v", mode, out, err)
		}

		_, err = e.c.DialPort(ctx, id, 8099)
		wantCategory(t, err, client.CategoryUnavailable, "mode "+mode+": a port nothing listens on")
		if err != nil && !strings.Contains(err.Error(), "nothing listens on port 8099") {
			t.Errorf("closed port: %v", err)
		}
	}
	_, err := e.c.DialPort(ctx, "nosuchsandbox", 8080)
	wantCategory(t, err, client.CategoryNotFound, "an unknown sandbox")

	sb := e.create(&warrenv1.CreateRequest{})
	if _, err := e.c.Pause(ctx, sb.GetId(), false); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = e.c.DialPort(pctx, sb.GetId(), 8080)
	wantCategory(t, err, client.CategoryConflict, "a paused sandbox")
}

package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/client"
	"github.com/warrenrl/warren/internal/errdefs"
)

// echoDialer is a fake whose sandbox "sb" echoes on port 7 and has
// nothing on other ports.
type echoDialer struct{ *fakeManager }

func (echoDialer) DialPort(_ context.Context, id string, port int) (net.Conn, error) {
	if id != "sb" {
		return nil, errdefs.NotFoundf("sandbox %s not found", id)
	}
	if port != 7 {
		return nil, errdefs.Unavailablef("nothing listens on port %d in sandbox %s", port, id)
	}
	a, b := net.Pipe()
	go func() { _, _ = io.Copy(b, b); b.Close() }()
	return a, nil
}

// TestPortTunnel: GET /v1/sandboxes/{id}/ports/{port} upgraded to
// warren-port carries a connection to the sandbox's port both ways, with
// the token; errors before the switch keep their categories; a Manager
// that cannot dial answers Unsupported.
func TestPortTunnel(t *testing.T) {
	srv := httptest.NewServer(NewHandler(echoDialer{newFake()}, HandlerOptions{Token: "tok"}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.New(srv.URL, client.WithToken("tok"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.DialPort(ctx, "sb", 7)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "ping\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo through the tunnel: %q %v", line, err)
	}
	conn.Close()

	for _, tc := range []struct {
		id   string
		port int
		want client.Category
	}{{"sb", 8, client.CategoryUnavailable}, {"nosuch", 7, client.CategoryNotFound}} {
		if _, err := c.DialPort(ctx, tc.id, tc.port); client.CategoryOf(err) != tc.want {
			t.Errorf("dial %s:%d: %v, want %s", tc.id, tc.port, err, tc.want)
		}
	}
	bad, _ := client.New(srv.URL, client.WithToken("wrong"))
	if _, err := bad.DialPort(ctx, "sb", 7); client.CategoryOf(err) != client.CategoryUnauthenticated {
		t.Errorf("dial with a wrong token: %v", err)
	}

	plain := httptest.NewServer(NewHandler(newFake(), HandlerOptions{}))
	defer plain.Close()
	pc, _ := client.New(plain.URL)
	if _, err := pc.DialPort(ctx, "sb", 7); client.CategoryOf(err) != client.CategoryUnsupported {
		t.Errorf("dial through a Manager without DialPort: %v", err)
	}
}

// TestCategoryOfNodeErrors: a gateway's errors are the nodes' connect
// errors; their category is read from the header, else the code.
func TestCategoryOfNodeErrors(t *testing.T) {
	ce := connect.NewError(connect.CodeFailedPrecondition, io.EOF)
	ce.Meta().Set(CategoryHeader, errdefs.Unsupported.String())
	if got := CategoryOf(ce); got != errdefs.Unsupported {
		t.Errorf("with the header: %v", got)
	}
	if got := CategoryOf(connect.NewError(connect.CodeNotFound, io.EOF)); got != errdefs.NotFound {
		t.Errorf("by code: %v", got)
	}
	if got := CategoryOf(errdefs.Conflictf("x")); got != errdefs.Conflict {
		t.Errorf("errdefs: %v", got)
	}
	if got := CategoryOf(io.EOF); got != errdefs.Unknown {
		t.Errorf("plain: %v", got)
	}
}

package e2b

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/server"
)

// portManager answers DialPort only: sandbox "up" has a server on port
// 8080 (the test's), "gone" does not exist, and any other port of "up"
// has nothing listening; a node's answer through a gateway is a connect
// error carrying its category (as "far" shows).
type portManager struct {
	Manager
	srv   string
	mu    sync.Mutex
	dials []string
}

func (m *portManager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	m.mu.Lock()
	m.dials = append(m.dials, id)
	m.mu.Unlock()
	switch {
	case id == "gone":
		return nil, errdefs.NotFoundf("sandbox %s not found", id)
	case id == "far":
		ce := connect.NewError(connect.CodeNotFound, io.EOF)
		ce.Meta().Set(server.CategoryHeader, errdefs.NotFound.String())
		return nil, ce
	case port != 8080:
		return nil, errdefs.Unavailablef("nothing listens on port %d in sandbox %s", port, id)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", m.srv)
}

// TestPortRouting: a request for a port other than envd's, by a
// PORT-ID.DOMAIN host or by E2b-Sandbox-Id with E2b-Sandbox-Port (on any
// path, REST's included), goes to that port of the sandbox with its Host
// kept and no key asked for; envd's port and the header without a port
// stay envd or REST traffic; an unknown sandbox is 404 (also when a
// gateway's node says so), a port nothing listens on 502 with the reason.
func TestPortRouting(t *testing.T) {
	inside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "inside "+r.Host+" "+r.URL.Path)
	}))
	defer inside.Close()
	m := &portManager{srv: inside.Listener.Addr().String()}
	s, err := New(Config{Addr: "127.0.0.1:0", Keys: []string{"e2b_0123456789abcdef"}, Manager: m})
	if err != nil {
		t.Fatal(err)
	}
	door := httptest.NewServer(s)
	defer door.Close()
	get := func(path string, h map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", door.URL+path, nil)
		for k, v := range h {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		path string
		h    map[string]string
		code int
		body string
	}{
		{"/x", map[string]string{"Host": "8080-up.example"}, 200, "inside 8080-up.example /x"},
		{"/sandboxes", map[string]string{"E2b-Sandbox-Id": "up", "E2b-Sandbox-Port": "8080"}, 200, "/sandboxes"},
		{"/", map[string]string{"Host": "8081-up.example"}, 502, "nothing listens on port 8081 in sandbox up"},
		{"/", map[string]string{"Host": "8080-gone.example"}, 404, "sandbox gone not found"},
		{"/", map[string]string{"Host": "8080-far.example"}, 404, "sandbox far not found"},
		{"/", map[string]string{"E2b-Sandbox-Id": "up", "E2b-Sandbox-Port": "99999"}, 400, "want 1 to 65535"},
		// envd's port, and the id without a port, stay REST off envd's
		// paths (older SDKs send the id on REST calls).
		{"/sandboxes", map[string]string{"E2b-Sandbox-Id": "up", "E2b-Sandbox-Port": EnvdPort}, 401, "X-API-Key"},
		{"/sandboxes", map[string]string{"E2b-Sandbox-Id": "up"}, 401, "X-API-Key"},
		{"/health", map[string]string{"Host": EnvdPort + "-up.example"}, 401, "X-Access-Token"},
	} {
		code, body := get(c.path, c.h)
		if code != c.code || !strings.Contains(body, c.body) {
			t.Errorf("GET %s %v: %d %q, want %d with %q", c.path, c.h, code, body, c.code, c.body)
		}
	}
}

package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestUIMountedWithItsOwnAuth: with a UI factory the dashboard is
// served under /ui on the socket (told no token is needed) and on TCP
// (told the listener's token) without a bearer header, since it
// authenticates itself; nothing else skips the token, however the path
// is spelled; and the dashboard's API client reaches the API in process
// without a token.
func TestUIMountedWithItsOwnAuth(t *testing.T) {
	const token = "ui-s3cret"
	var apiOK = make(chan error, 4)
	factory := func(api *http.Client, _ http.Handler, tok string, _ <-chan struct{}) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := client.New("http://in-process", client.WithHTTPClient(api), client.WithToken(""))
			if err == nil {
				_, err = c.Get(r.Context(), "sb1")
			}
			apiOK <- err
			fmt.Fprintf(w, "ui token=%q path=%s", tok, r.URL.Path)
		})
	}
	ts := startServer(t, Config{ListenAddr: "127.0.0.1:0", Token: token, UI: factory})
	if _, err := ts.m.Create(context.Background(), &warrenv1.CreateRequest{Id: "sb1", Image: "img"}); err != nil {
		t.Fatal(err)
	}
	unix := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", ts.sock)
	}}}
	get := func(c *http.Client, url string) (int, string) {
		t.Helper()
		res, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, tc := range []struct {
		c        *http.Client
		url, out string
	}{
		{unix, "http://x/ui/sandboxes", `ui token="" path=/ui/sandboxes`},
		{http.DefaultClient, "http://" + ts.tcp + "/ui/sandboxes", `ui token="ui-s3cret" path=/ui/sandboxes`},
		{http.DefaultClient, "http://" + ts.tcp + "/ui", `ui token="ui-s3cret" path=/ui`},
	} {
		if code, body := get(tc.c, tc.url); code != 200 || body != tc.out {
			t.Errorf("GET %s: %d %q, want %q", tc.url, code, body, tc.out)
		}
		if err := <-apiOK; err != nil {
			t.Errorf("the UI's in-process API call: %v", err)
		}
	}
	// Paths that only look like the dashboard's still need the token.
	for _, p := range []string{"/ui/../metrics", "/ui/..%2fmetrics", "/uix", "/ui/%2e%2e/v1/sandboxes/sb1/archive?path=/"} {
		conn, err := net.Dial("tcp", ts.tcp)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", p)
		b, _ := io.ReadAll(conn)
		conn.Close()
		status, _, _ := strings.Cut(string(b), "\r\n")
		if !strings.Contains(status, " 401 ") && !strings.Contains(string(b), "ui token=") {
			t.Errorf("GET %s without a token: %s, want 401 or the dashboard", p, status)
		}
	}
}

// TestUIStreamsEndAtShutdown: the dashboard is told when shutdown
// begins, so its event streams end then instead of holding the graceful
// shutdown for its whole grace and being cut.
func TestUIStreamsEndAtShutdown(t *testing.T) {
	started := make(chan struct{})
	endedBy := make(chan string, 1)
	factory := func(_ *http.Client, _ http.Handler, _ string, stopping <-chan struct{}) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			close(started)
			select {
			case <-stopping:
				endedBy <- "stopping"
			case <-r.Context().Done():
				endedBy <- "request cancelled"
			}
		})
	}
	ts := startServer(t, Config{UI: factory})
	unix := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", ts.sock)
	}}}
	go func() {
		if res, err := unix.Get("http://x/ui/live"); err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}()
	<-started
	if err := ts.stop(); err != nil {
		t.Fatal(err)
	}
	if got := <-endedBy; got != "stopping" {
		t.Errorf("the stream ended by %s, want by the shutdown's notice", got)
	}
}

package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"
)

// UIFactory builds the handler of the web dashboard (/ui/) for one
// listener. api reaches the API in-process with the operator's full
// rights, so the dashboard is a client of the same API as every other
// (a node's or a gateway's alike); metrics is the /metrics handler (nil
// when disabled); token is the listener's bearer token, "" on the unix
// socket, whose file mode is the access control; stopping closes when
// the server begins to shut down, when long-lived responses (event
// streams) must end, or the graceful shutdown would wait for them. The
// dashboard does its own authentication (a cookie set from a login
// form), so requireToken lets /ui through.
type UIFactory func(api *http.Client, metrics http.Handler, token string, stopping <-chan struct{}) http.Handler

// uiPrefix is where the dashboard is mounted.
const uiPrefix = "/ui"

// isUIPath reports whether p is the dashboard's, after cleaning: the
// mux would route "/ui/../metrics" to /metrics (by a redirect), which
// must not skip the token check.
func isUIPath(p string) bool {
	p = path.Clean(p)
	return p == uiPrefix || strings.HasPrefix(p, uiPrefix+"/")
}

// pipeListener is an in-memory listener: the dashboard's calls reach the
// API through it without a socket, a token or a TCP port.
type pipeListener struct {
	conns  chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, srv := net.Pipe()
	select {
	case l.conns <- srv:
		return client, nil
	case <-l.done:
		client.Close()
		srv.Close()
		return nil, errors.New("api pipe closed")
	case <-ctx.Done():
		client.Close()
		srv.Close()
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "in-process" }

// client returns an HTTP/1.1 client whose connections are pipes to l.
// The Connect protocol needs no trailers, so HTTP/1.1 carries its
// streams too.
func (l *pipeListener) client() *http.Client {
	var protos http.Protocols
	protos.SetHTTP1(true)
	return &http.Client{Transport: &http.Transport{
		DialContext:         l.dial,
		Protocols:           &protos,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     time.Minute,
	}}
}

package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

// PortDialer is a Manager that can connect to a TCP port inside a
// sandbox (the daemon: backend.PortDialer; a gateway: through the
// sandbox's node). The server then serves the port tunnel:
//
//	GET /v1/sandboxes/{id}/ports/{port}
//	Connection: Upgrade
//	Upgrade: warren-port
//
// answered "101 Switching Protocols", after which the connection carries
// the bytes of a TCP connection to that port, both ways, until either
// side closes. Errors before the switch are the usual JSON errors (404
// for an unknown sandbox, 503 when nothing listens on the port). The
// gateway reaches a sandbox's servers on its node this way, with the
// node's token; client.DialPort is the client side.
type PortDialer interface {
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// PortUpgrade is the Upgrade token of the port tunnel.
const PortUpgrade = "warren-port"

func (h *httpAPI) portTunnel(w http.ResponseWriter, r *http.Request) {
	d, ok := h.m.(PortDialer)
	if !ok {
		writeHTTPError(w, errdefs.Unsupportedf("this server cannot connect to sandboxes' ports"))
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), PortUpgrade) || r.ProtoMajor != 1 {
		writeHTTPError(w, errdefs.Invalidf("the port tunnel is an HTTP/1.1 upgrade to %q", PortUpgrade))
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		writeHTTPError(w, errdefs.Invalidf("port %q: want a number", r.PathValue("port")))
		return
	}
	up, err := d.DialPort(r.Context(), r.PathValue("id"), port)
	if err != nil {
		writeHTTPError(w, err)
		return
	}
	defer up.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeHTTPError(w, errdefs.Wrap(errdefs.Internal, err, "take over the connection"))
		return
	}
	defer conn.Close()
	// The tunnel lives as long as its two ends do: no deadline of the
	// server's (header reading) carries over.
	_ = conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+PortUpgrade+"\r\n\r\n"); err != nil {
		return
	}
	if err := brw.Flush(); err != nil {
		return
	}
	// Bytes the client sent after its request may already be buffered.
	Splice(readerConn{conn, brw.Reader}, up)
}

// readerConn is a conn whose reads come from r (which holds what was
// buffered of it first).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c readerConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// Splice copies a to b and b to a until both directions end: the end of
// one direction is passed on as a half-close where the connection has
// one (TCP), so that a request-then-EOF protocol works through it. It
// closes neither.
func Splice(a, b net.Conn) {
	var wg sync.WaitGroup
	one := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
			_ = cw.CloseWrite()
		} else {
			// An error (a reset) ends both directions.
			_ = dst.Close()
			_ = src.Close()
		}
	}
	wg.Add(2)
	go one(b, a)
	go one(a, b)
	wg.Wait()
}

package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// portUpgrade is the Upgrade token of the daemon's port tunnel
// (internal/server.PortUpgrade).
const portUpgrade = "warren-port"

// DialPort connects to TCP port inside a sandbox through the daemon (or
// a gateway, which passes it to the sandbox's node): the returned
// connection carries the bytes of a TCP connection to that port on the
// sandbox's loopback. It works for a sandbox without a network, and
// whatever the sandbox's egress policy: it is a connection into the
// sandbox, made by the node. Nothing listening is CategoryUnavailable;
// an unknown sandbox CategoryNotFound.
func (c *Client) DialPort(ctx context.Context, sandboxID string, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	network, target := "tcp", c.target
	if c.network == "unix" {
		network = "unix"
	}
	conn, err := d.DialContext(ctx, network, target)
	if err != nil {
		return nil, transportError(err)
	}
	if c.network == "https" {
		cfg := &tls.Config{}
		if c.tlsConfig != nil {
			cfg = c.tlsConfig.Clone()
		}
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(target)
			cfg.ServerName = host
		}
		// The tunnel is an HTTP/1.1 upgrade.
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, transportError(err)
		}
		conn = tc
	}
	// The context bounds the dial and the answer, not the connection's
	// life after.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	nc, err := c.upgradePort(conn, sandboxID, port)
	if !stop() && err == nil {
		nc.Close()
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, transportErrorUnlessAPI(err)
	}
	return nc, nil
}

func (c *Client) upgradePort(conn net.Conn, id string, port int) (net.Conn, error) {
	u := c.baseURL + "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port)
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", portUpgrade)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", c.ua)
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return nil, fmt.Errorf("the server answered %s to a port tunnel: it does not serve one", resp.Status)
		}
		return nil, httpError(resp)
	}
	if !strings.EqualFold(resp.Header.Get("Upgrade"), portUpgrade) {
		return nil, fmt.Errorf("the server switched to %q, not %q", resp.Header.Get("Upgrade"), portUpgrade)
	}
	return &bufConn{Conn: conn, r: br}, nil
}

// bufConn reads what the response's reader buffered first.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection where it can (TCP, TLS).
func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

func transportErrorUnlessAPI(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return transportError(err)
}

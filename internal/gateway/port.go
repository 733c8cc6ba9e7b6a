package gateway

import (
	"context"
	"errors"
	"io"
	"net"

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/client"
	"github.com/warrenrl/warren/internal/e2b"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/server"
)

var (
	_ server.PortDialer = (*Gateway)(nil)
	// The E2B door mounts on a gateway as on a node.
	_ e2b.Manager = (*Gateway)(nil)
)

// DialPort connects to TCP port inside sandbox id through its node's
// port tunnel (server.PortDialer), with the nodes' token: the E2B door's
// proxy and the gateway's own tunnel reach a sandbox's servers so.
func (g *Gateway) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	n, err := g.owner(ctx, id)
	if err != nil {
		return nil, err
	}
	c, err := n.c.DialPort(ctx, id, port)
	if err == nil {
		return c, nil
	}
	err = n.clientErr(err)
	if errdefs.CategoryOf(err) == errdefs.NotFound {
		if m := g.moved(ctx, id, n, connect.NewError(connect.CodeNotFound, err)); m != nil {
			c, err := m.c.DialPort(ctx, id, port)
			if err != nil {
				return nil, m.clientErr(err)
			}
			return c, nil
		}
	}
	return nil, err
}

// clientErr is the error of a failed client call to n (DialPort) with its
// category: the node's answer, or Unavailable naming n when the call did
// not reach it.
func (n *node) clientErr(err error) error {
	var ce *client.Error
	var oe *net.OpError
	if !errors.As(err, &ce) || errors.As(err, &oe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		// No answer: the connection failed (refused, reset, cut).
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return errdefs.Wrap(errdefs.Unavailable, err, "node "+n.name+" unreachable")
	}
	for _, c := range errdefs.Categories() {
		if c.String() == string(ce.Category) {
			return errdefs.New(c, "%s", ce.Message)
		}
	}
	return errdefs.New(errdefs.Internal, "node %s: %s", n.name, ce.Message)
}

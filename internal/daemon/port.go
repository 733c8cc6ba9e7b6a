package daemon

import (
	"context"
	"net"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// DialPort connects to TCP port of a running sandbox, for a proxy to a
// server in it (the E2B door's get_host(port), Warren's port tunnel). The
// backend connects inside the sandbox's network (backend.PortDialer):
// ingress to the sandbox only, whatever its network policy. The
// connection is kept in m.ports until it is closed: hibernation closes
// the sandbox's (a checkpoint cannot take a socket whose peer is the
// daemon's, and whoever opened it, a gateway's door say, may not be the
// one who hibernates), and so does its deletion (the daemon's socket
// would keep the sandbox's network namespace alive).
func (m *Manager) DialPort(ctx context.Context, id string, port int) (_ net.Conn, err error) {
	defer m.observe("DialPort", &err)
	if port <= 0 || port > 65535 {
		return nil, errdefs.Invalidf("port %d: want 1 to 65535", port)
	}
	s, v, err := m.live(ctx, opPort, id)
	if err != nil {
		return nil, err
	}
	d, ok := v.sb.(backend.PortDialer)
	if !ok {
		return nil, errdefs.Unsupportedf("backend %s cannot connect to a sandbox's ports", v.backend)
	}
	c, err := d.DialPort(ctx, port)
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.Unavailable {
			return nil, err // nothing listens: not the sandbox's state
		}
		return nil, m.explain(opPort, s, err, "connect to a port of sandbox "+id)
	}
	return m.ports.Track(id, c), nil
}

package microvm

import (
	"context"
	"net"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
)

var _ backend.PortDialer = (*sandbox)(nil)

// DialPort connects to a TCP port on the sandbox's loopback: the agent
// dials it in the guest and the stream carries the bytes (ingress only:
// the VM gets no path out of it).
func (s *sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, errdefs.Invalidf("port %d: want 1 to 65535", port)
	}
	st, stop, err := s.vm.open(ctx, guest.Request{Op: "dial", Port: port})
	if err != nil {
		return nil, err
	}
	defer stop()
	// Unbuffered: the connection's bytes follow the answer on the stream.
	kind, data, err := guest.ReadFrame(st)
	switch {
	case err != nil:
		st.Close()
		return nil, s.vm.streamErr(ctx, err, "connect to a port in the VM")
	case kind == guest.KindFail:
		st.Close()
		return nil, failure(data, "connect to port in the VM")
	case kind != guest.KindStarted:
		st.Close()
		return nil, errdefs.Internalf("guest agent: unexpected frame %q to a dial", kind)
	}
	if !stop() {
		st.Close()
		return nil, ctx.Err()
	}
	return st, nil
}

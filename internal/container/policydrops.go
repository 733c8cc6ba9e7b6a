package container

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/warrenrl/warren/internal/events"
	"github.com/warrenrl/warren/internal/nflog"
)

// PolicyDrops is the source of policy_drop events: the packets the
// network policy's rules log before refusing them (internal/netpolicy),
// attributed to a sandbox by the interface they came in on.
type PolicyDrops struct {
	b *Backend
	r *nflog.Reader
	// Unattributed counts packets of no live sandbox of this backend;
	// Lost counts those the kernel dropped from a full socket.
	Unattributed, Lost atomic.Uint64
}

var _ events.Source = (*PolicyDrops)(nil)

// PolicyDrops binds the NFLOG group of this backend's rules. It fails
// where the kernel has no nfnetlink_log or the group is taken; sandboxes
// are still refused what their policy refuses, without events.
func (b *Backend) PolicyDrops() (*PolicyDrops, error) {
	r, err := nflog.Open(b.net.LogGroup(), 64)
	if err != nil {
		return nil, err
	}
	return &PolicyDrops{b: b, r: r}, nil
}

// Run records every logged packet of a sandbox into rec until ctx ends.
func (p *PolicyDrops) Run(ctx context.Context, rec events.Recorder) error {
	stop := context.AfterFunc(ctx, func() { p.r.Close() })
	defer stop()
	for {
		pkts, err := p.r.Read()
		switch {
		case errors.Is(err, syscall.ENOBUFS):
			p.Lost.Add(1)
			continue
		case err != nil:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read refused packets: %w", err)
		}
		for _, pkt := range pkts {
			if e, ok := p.event(pkt); ok {
				rec.Record(e)
			} else {
				p.Unattributed.Add(1)
			}
		}
	}
}

func (p *PolicyDrops) event(pkt nflog.Packet) (events.Event, bool) {
	id, ok := p.b.net.SandboxOfIfindex(int(pkt.InIfindex))
	if !ok {
		return events.Event{}, false
	}
	what := "a packet"
	if f, ok := nflog.ParseFlow(pkt.Payload); ok {
		what = f.Proto + " to " + f.Dst
		if f.Port != 0 {
			what += fmt.Sprintf(" port %d", f.Port)
		}
	}
	return events.Event{Sandbox: id, Kind: events.PolicyDrop, Detail: what + " refused by the network policy"}, true
}

// Close unbinds the group.
func (p *PolicyDrops) Close() error { return p.r.Close() }

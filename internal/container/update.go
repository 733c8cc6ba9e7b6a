package container

import (
	"context"
	"errors"
	"net/netip"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/netpolicy"
)

var _ backend.Updater = (*sandbox)(nil)

// Update changes the sandbox's network policy, QoS class and cgroup
// limits, all or none: the policy first, then the class
// (cgroups.Group.SetLimits restores what it wrote when a write fails,
// and the old class and policy are put back then, one cleanup stack).
// Once the limits are in, a new CPU quota moves the sandbox's CPUs; a
// failure there is reported with everything else kept.
func (s *sandbox) Update(ctx context.Context, u backend.Update) (retErr error) {
	select {
	case <-s.exited.Done():
		return errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var cu cleanup.Cleanup
	defer func() {
		if err := cu.Clean(); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	if u.Network != nil {
		undo, err := s.setNetwork(*u.Network)
		if err != nil {
			return err
		}
		cu.AddAs("restore network policy", undo)
	}
	if u.QoS != nil {
		undo, err := s.setQoS(*u.QoS)
		if err != nil {
			return err
		}
		cu.AddAs("restore QoS class", undo)
	}
	if err := s.grp.SetLimits(cgroups.Limits{CPUMillis: u.CPUMillis, MemoryBytes: u.MemoryBytes, PidsMax: u.PidsMax}); err != nil {
		return err
	}
	// The limits are in: from here on, a failure keeps the new policy
	// and class (the error says what did not change).
	cu.Release()
	if u.CPUMillis != nil && !s.b.opts.NoCPUAffinity {
		if err := s.replaceCPUs(*u.CPUMillis); err != nil {
			return errdefs.Wrap(errdefs.CategoryOf(err), err, "sandbox "+s.id+": limits changed, but not the CPUs it runs on")
		}
	}
	return nil
}

// replaceCPUs places the sandbox on the CPUs of a new quota (cpus.go)
// and changes its CPU views to match. Every thread of every process
// gets the new affinity; two passes, so that a child forked by a
// process not yet moved is moved too.
func (s *sandbox) replaceCPUs(millis int64) error {
	p := s.b.cpus
	n := p.cpusFor(millis)
	if n == p.count(s.id) {
		return nil
	}
	cpus := p.place(s.id, n)
	for range 2 {
		pids, err := s.grp.Procs()
		if err != nil {
			return err
		}
		for _, pid := range pids {
			if err := p.setAffinity(pid, cpus); err != nil {
				return err
			}
		}
	}
	srcs := []string{"", ""}
	if n > 0 {
		online, cpuinfo, err := s.b.cpuViews(n)
		if err != nil {
			return err
		}
		srcs = []string{online, cpuinfo}
	}
	return rebind(s.st.Pid, []string{"/" + cpuOnlinePath, "/" + cpuinfoPath}, srcs)
}

// setNetwork moves the sandbox to policy p and returns what moves it
// back. Between two modes with an interface only the rules change (one
// nftables transaction); to none the interface goes (its sockets lose
// their route), and from none one is made in the running sandbox's
// namespace as at create.
func (s *sandbox) setNetwork(p netpolicy.Policy) (undo func() error, err error) {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	old := s.st.Net
	// A group is fixed at create: an update naming none keeps it.
	cur := ""
	if old != nil {
		cur = old.Policy.Group
	}
	if p.Group == "" {
		p.Group = cur
	}
	if p.Group != cur {
		return nil, errdefs.Invalidf("network.group: sandbox %s's group is fixed at create", s.id)
	}
	switch {
	case old == nil && p.IsNone():
		return func() error { return nil }, nil
	case old == nil:
		// No hostname: outside a group (a member has an interface from
		// create on) nobody resolves it.
		a, err := s.b.net.Attach(s.id, "", s.st.Pid, p)
		if err != nil {
			return nil, err
		}
		s.st.Net = &a
		return func() error { return s.detachNetwork() }, nil
	case p.IsNone():
		// Its connections would lose their route and hang: abort them.
		if err := s.b.net.Cut(s.st.Pid, *old, p); err != nil {
			return nil, err
		}
		if err := s.b.net.Detach(s.id, *old); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "sandbox "+s.id+": remove network")
		}
		s.st.Net = nil
		return func() error { return s.restoreNetwork(old.Policy) }, nil
	default:
		if err := s.b.net.SetPolicy(s.id, s.st.Pid, *old, p); err != nil {
			return nil, err
		}
		prev := old.Policy
		s.st.Net = &netpolicy.Attachment{Index: old.Index, Policy: p}
		return func() error { return s.restoreNetwork(prev) }, nil
	}
}

func (s *sandbox) restoreNetwork(p netpolicy.Policy) error {
	_, err := s.setNetwork(p)
	return err
}

func (s *sandbox) detachNetwork() error {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	if s.st.Net == nil {
		return nil
	}
	if err := s.b.net.Detach(s.id, *s.st.Net); err != nil {
		return err
	}
	s.st.Net = nil
	return nil
}

var (
	_ backend.Networked = (*sandbox)(nil)
	_ backend.Resolved  = (*sandbox)(nil)
)

// Nameserver is the sandbox's gateway, where Warren's resolver answers
// it; invalid in mode none.
func (s *sandbox) Nameserver() netip.Addr {
	a := s.network()
	if a == nil {
		return netip.Addr{}
	}
	gw, _ := s.b.net.Addrs(a.Index)
	return gw
}

// NetworkAddress is the sandbox's address on the node's sandbox subnet,
// "" in mode none.
func (s *sandbox) NetworkAddress() string {
	a := s.network()
	if a == nil {
		return ""
	}
	_, addr := s.b.net.Addrs(a.Index)
	return addr.String()
}

package microvm

import (
	"context"
	"errors"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/qos"
)

var _ backend.Updater = (*sandbox)(nil)

// MaxSandboxMemory is the most memory a sandbox in a VM of guestMB may be
// given: the VM's memory less what the guest keeps for itself
// (guestOverheadMB). Guest memory is fixed at boot.
func MaxSandboxMemory(guestMB int) int64 { return sandboxMemory(guestMB, guestOverheadMB) }

func sandboxMemory(guestMB, overheadMB int) int64 {
	return int64(max(guestMB-overheadMB, 0)) << 20
}

// guestLimits sets the memory and pids limits of the sandbox's cgroup in
// the guest (nil: unchanged, 0: none) through the agent, all or none.
func (s *sandbox) guestLimits(ctx context.Context, memory, pids *int64) error {
	var r struct{}
	if err := s.vm.call(ctx, guest.Request{Op: "limits", Limits: &guest.Limits{MemoryBytes: memory, PidsMax: pids}}, nil, &r); err != nil {
		return errdefs.Wrap(errdefs.CategoryOf(err), err, s.name()+": sandbox "+s.id+": limits in the guest")
	}
	return nil
}

// Update changes a running VM's network policy and limits, all or none:
// the rules of its tap (netpolicy.SetTapPolicy), the QoS class and CPU
// quota of its QEMU cgroup on the host, then the memory and pids limits
// of the sandbox's cgroup in the guest (through the agent, which writes
// them all or none); a failed later step puts the earlier ones back.
// Everything is checked first: a memory limit beyond what the VM booted
// with (MaxSandboxMemory) is Invalid, gaining or losing the network
// device Unsupported (checkNetwork), and nothing changes.
func (s *sandbox) Update(ctx context.Context, u backend.Update) (retErr error) {
	if err := s.checkUpdate(u); err != nil {
		return err
	}
	var cu cleanup.Cleanup
	defer func() {
		if err := cu.Clean(); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	if u.Network != nil && s.att != nil {
		undo, err := s.setNetwork(*u.Network)
		if err != nil {
			return err
		}
		cu.AddAs("restore network policy", undo)
	}
	grp := s.vm.cfg.Cgroup
	if u.QoS != nil {
		undo, err := qos.Replace(grp, func() []int { return []int{s.vm.Pid()} }, *u.QoS)
		if err != nil {
			return err
		}
		cu.AddAs("restore QoS class", undo)
	}
	if u.CPUMillis != nil {
		old := s.cpuMillis
		if err := grp.SetLimits(cgroups.Limits{CPUMillis: u.CPUMillis}); err != nil {
			return err
		}
		cu.AddAs("restore CPU quota", func() error { return grp.SetLimits(cgroups.Limits{CPUMillis: &old}) })
	}
	if u.MemoryBytes != nil || u.PidsMax != nil {
		if err := s.guestLimits(ctx, u.MemoryBytes, u.PidsMax); err != nil {
			return err
		}
	}
	cu.Release()
	if u.CPUMillis != nil {
		s.cpuMillis = *u.CPUMillis
	}
	return nil
}

// maxMemory is the most memory the sandbox may be given: its VM's less
// what the guest keeps for itself.
func (s *sandbox) maxMemory() int64 {
	if s.overheadMB > 0 {
		return sandboxMemory(s.memoryMB, s.overheadMB)
	}
	return MaxSandboxMemory(s.memoryMB)
}

// name is the sandbox's backend, for errors.
func (s *sandbox) name() string {
	if s.kind != "" {
		return s.kind
	}
	return Name
}

// checkUpdate refuses what Update cannot apply, before anything changes.
func (s *sandbox) checkUpdate(u backend.Update) error {
	select {
	case <-s.exited.Done():
		return errdefs.Conflictf("%s: sandbox %s is not running", s.name(), s.id)
	default:
	}
	if u.Network != nil {
		if err := s.checkNetwork(*u.Network); err != nil {
			return err
		}
	}
	if u.QoS != nil {
		if err := qos.Check(*u.QoS); err != nil {
			return err
		}
	}
	if (u.QoS != nil || u.CPUMillis != nil) && s.vm.cfg.Cgroup == nil {
		return errdefs.Unsupportedf("%s: sandbox %s's QEMU has no cgroup of its own (booted by an earlier version): its CPU quota and class cannot change", s.name(), s.id)
	}
	if u.MemoryBytes != nil {
		most := s.maxMemory()
		switch {
		case s.memoryMB == 0:
			return errdefs.Unsupportedf("%s: sandbox %s's VM memory is unknown (booted by an earlier version): its memory limit cannot change", s.name(), s.id)
		case *u.MemoryBytes == 0 || *u.MemoryBytes > most:
			return errdefs.Invalidf("%s: memory limit %d bytes: the VM booted with %d MiB, which holds a sandbox of at most %d bytes (%d MiB); make a new sandbox for more",
				s.name(), *u.MemoryBytes, s.memoryMB, most, most>>20)
		}
	}
	if (u.MemoryBytes != nil || u.PidsMax != nil) && s.paused.Load() {
		return errdefs.Conflictf("%s: sandbox %s is paused: its guest's limits change once it is resumed", s.name(), s.id)
	}
	return nil
}

// checkNetwork refuses a policy change a running VM cannot take: its
// network device is fixed at boot (microvm's virtio-mmio has no hotplug),
// so a VM without one keeps none and one with one keeps an interface; the
// group is fixed at create, as a container's.
func (s *sandbox) checkNetwork(p netpolicy.Policy) error {
	switch {
	case s.att == nil && p.IsNone():
		return nil
	case s.att == nil:
		return errdefs.Unsupportedf("%s: sandbox %s booted without a network device, which a running VM cannot gain; make a new sandbox with network policy %s", s.name(), s.id, p)
	case p.IsNone():
		return errdefs.Unsupportedf("%s: sandbox %s's network device cannot be taken from the running VM; an allowlist with no rule cuts it off instead", s.name(), s.id)
	case p.Group != "" && p.Group != s.att.Policy.Group:
		return errdefs.Invalidf("network.group: sandbox %s's group is fixed at create", s.id)
	}
	return nil
}

// setNetwork changes the rules of the VM's tap to p (checkNetwork passed)
// and returns what puts the old ones back.
func (s *sandbox) setNetwork(p netpolicy.Policy) (undo func() error, err error) {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	if p.Group == "" {
		p.Group = s.att.Policy.Group
	}
	old := s.att.Policy
	if err := s.net.SetTapPolicy(s.id, *s.att, p); err != nil {
		return nil, err
	}
	s.att.Policy = p
	return func() error {
		s.netMu.Lock()
		defer s.netMu.Unlock()
		if err := s.net.SetTapPolicy(s.id, *s.att, old); err != nil {
			return err
		}
		s.att.Policy = old
		return nil
	}, nil
}

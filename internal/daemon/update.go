package daemon

import (
	"context"
	"maps"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/caller"
	"github.com/warrenrl/warren/internal/errdefs"
)

// updateParams is a validated UpdateSandbox request with the node's
// defaults applied to the limits it sets.
type updateParams struct {
	limits  backend.Update
	timeout *time.Duration
	set     map[string]string
	remove  []string
}

func (u *updateParams) hasLimits() bool {
	return u.limits.CPUMillis != nil || u.limits.MemoryBytes != nil || u.limits.PidsMax != nil || u.limits.Network != nil || u.limits.QoS != nil
}

func (m *Manager) validateUpdate(req *warrenv1.UpdateSandboxRequest) (updateParams, error) {
	var u updateParams
	if req.GetId() == "" {
		return u, errdefs.Invalidf("sandbox id is required")
	}
	if req.CpuMillis != nil {
		if err := checkCPU(req.GetCpuMillis()); err != nil {
			return u, err
		}
		u.limits.CPUMillis = proto.Int64(req.GetCpuMillis())
	}
	if req.MemoryBytes != nil {
		if err := checkMemory(req.GetMemoryBytes()); err != nil {
			return u, err
		}
		u.limits.MemoryBytes = proto.Int64(cmpOr(req.GetMemoryBytes(), m.cfg.DefaultMemoryBytes))
	}
	if req.PidsMax != nil {
		if err := checkPids(req.GetPidsMax()); err != nil {
			return u, err
		}
		u.limits.PidsMax = proto.Int64(cmpOr(req.GetPidsMax(), m.cfg.DefaultPids))
	}
	if req.Network != nil {
		p, err := networkPolicy("network", req.GetNetwork())
		if err != nil {
			return u, err
		}
		u.limits.Network = &p
	}
	if req.Qos != nil {
		q, err := qosOf(req.GetQos(), req.GetQosCpus())
		if err != nil {
			return u, err
		}
		u.limits.QoS = &q
	} else if len(req.GetQosCpus()) > 0 {
		return u, errdefs.Invalidf("qos_cpus without qos: the pinning changes with the class")
	}
	if req.TimeoutSeconds != nil {
		d, err := m.lifetime(req.GetTimeoutSeconds())
		if err != nil {
			return u, err
		}
		u.timeout = &d
	}
	u.set, u.remove = req.GetSetLabels(), req.GetRemoveLabels()
	for _, k := range u.remove {
		if _, ok := u.set[k]; ok {
			return u, errdefs.Invalidf("label %q is both set and removed", k)
		}
	}
	return u, nil
}

func cmpOr(v, def int64) int64 {
	if v == 0 {
		return def
	}
	return v
}

// UpdateSandbox changes a RUNNING sandbox's limits (through the backend's
// Updater), lifetime and labels, all or nothing: everything is validated
// first, the backend applies its part whole or not at all, and a failed
// write of the record puts the limits back. Conflict in any other state,
// and while another update of the sandbox runs. A network change makes
// the sandbox's resolv.conf follow (etc.go) while it is Warren's.
func (m *Manager) UpdateSandbox(ctx context.Context, req *warrenv1.UpdateSandboxRequest) (_ *warrenv1.Sandbox, err error) {
	defer m.observe("UpdateSandbox", &err)
	u, err := m.validateUpdate(req)
	if err != nil {
		return nil, err
	}
	if parent, ok := caller.Harness(ctx); ok && u.limits.Network != nil {
		// A harness cannot widen a child's network past its own.
		pinfo, err := m.parentInfo(parent)
		if err != nil {
			return nil, err
		}
		if err := checkChildNetwork(pinfo, *u.limits.Network); err != nil {
			return nil, err
		}
	}
	s, err := m.find(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if err := s.allowLocked(opUpdate); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if s.updating {
		s.mu.Unlock()
		return nil, errdefs.Conflictf("sandbox %s is already being updated: retry once that call returned", s.id)
	}
	labels := maps.Clone(s.info.GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, u.set)
	for _, k := range u.remove {
		delete(labels, k)
	}
	if err := checkLabels(labels); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	old := proto.Clone(s.info.GetResources()).(*warrenv1.Resources)
	oldQoS := recordedQoS(s.info)
	oldNet, err := networkPolicy("network", s.info.GetNetwork())
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if n := u.limits.Network; n != nil && n.Group == "" {
		// The group is fixed at create: a policy naming none keeps it.
		merged := *n
		merged.Group = oldNet.Group
		u.limits.Network = &merged
	}
	sb, backendName, fs, keepEtc, etcNS := s.sb, s.backendName, s.fs, s.info.GetKeepEtc(), s.etcNS
	s.updating = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.updating = false
		s.mu.Unlock()
	}()

	var up backend.Updater
	if u.hasLimits() {
		var ok bool
		if up, ok = sb.(backend.Updater); !ok {
			return nil, errdefs.Unsupportedf("backend %s cannot change the limits, network or QoS class of a running sandbox", backendName)
		}
		if err := up.Update(ctx, u.limits); err != nil {
			return nil, m.explain(opUpdate, s, err, "update sandbox "+s.id)
		}
	}
	var resolv resolvRewrite
	if u.limits.Network != nil {
		// The network has changed: a client gone now must not leave the
		// file naming the old one.
		resolv = m.followNetwork(context.WithoutCancel(ctx), s.id, sb, fs, keepEtc, etcNS)
	}

	s.mu.Lock()
	if err := s.allowLocked(opUpdate); err != nil {
		// Died or being deleted meanwhile: its limits no longer matter.
		s.mu.Unlock()
		return nil, err
	}
	prevInfo := cloneSandbox(s.info)
	res := proto.Clone(old).(*warrenv1.Resources)
	if res == nil {
		res = &warrenv1.Resources{}
	}
	setIf(&res.CpuMillis, u.limits.CPUMillis)
	setIf(&res.MemoryBytes, u.limits.MemoryBytes)
	setIf(&res.PidsMax, u.limits.PidsMax)
	s.info.Resources, s.info.Labels = res, labels
	if u.limits.QoS != nil {
		setQoSInfo(s.info, *u.limits.QoS)
	}
	prevState := s.backendState
	if resolv.done {
		s.etcNS = resolv.to
	}
	if u.limits.Network != nil {
		s.info.Network = networkProto(*u.limits.Network)
		s.info.NetworkAddress = networkAddress(sb)
		// The backend's state says which interface and rules to adopt
		// and remove after a restart.
		s.backendState = sb.State()
	}
	var expires time.Time
	if u.timeout != nil {
		expires = time.Now().Add(*u.timeout)
		s.info.ExpiresAtUnixMs = expires.UnixMilli()
	}
	if err := m.persist(s); err != nil {
		s.info.Resources, s.info.Labels, s.info.ExpiresAtUnixMs = prevInfo.Resources, prevInfo.Labels, prevInfo.ExpiresAtUnixMs
		s.info.Network, s.info.NetworkAddress, s.backendState = prevInfo.Network, prevInfo.NetworkAddress, prevState
		s.info.Qos, s.info.QosCpus = prevInfo.Qos, prevInfo.QosCpus
		s.etcNS = etcNS
		s.mu.Unlock()
		m.undoResolv(context.WithoutCancel(ctx), s.id, fs, resolv)
		if up != nil {
			back := backend.Update{}
			if u.limits.CPUMillis != nil {
				back.CPUMillis = proto.Int64(old.GetCpuMillis())
			}
			if u.limits.MemoryBytes != nil {
				back.MemoryBytes = proto.Int64(old.GetMemoryBytes())
			}
			if u.limits.PidsMax != nil {
				back.PidsMax = proto.Int64(old.GetPidsMax())
			}
			if u.limits.Network != nil {
				back.Network = &oldNet
			}
			if u.limits.QoS != nil {
				back.QoS = &oldQoS
			}
			if rerr := up.Update(context.WithoutCancel(ctx), back); rerr != nil {
				m.log.Error("restore limits after a failed update", "sandbox", s.id, "err", rerr)
			}
		}
		return nil, err
	}
	if u.timeout != nil {
		m.armTimerLocked(s, expires)
	}
	out := cloneSandbox(s.info)
	s.mu.Unlock()
	m.log.Debug("sandbox updated", "sandbox", s.id)
	return out, nil
}

func setIf(dst *int64, v *int64) {
	if v != nil {
		*dst = *v
	}
}

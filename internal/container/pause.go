package container

import (
	"context"
	"errors"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
)

var _ backend.Pauser = (*sandbox)(nil)

// Pause freezes the sandbox's cgroup (the agent, PID 1, with every
// process below it) and, with reclaim, has the cgroup give its memory
// back (backend.Pauser). The freeze is the cgroup v1 freezer on v1 hosts
// and cgroup.freeze on v2 and on a hybrid host's controller-less v2 tree;
// the reclaim works on the memory controller wherever it is mounted
// (cgroups.Group.Reclaim).
func (s *sandbox) Pause(ctx context.Context, reclaim bool) (st backend.PauseStats, err error) {
	select {
	case <-s.exited.Done():
		return st, errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	var cl cleanup.Cleanup
	defer func() {
		if err != nil {
			err = errors.Join(err, cl.Clean())
		}
	}()
	t0 := time.Now()
	if err := s.grp.Freeze(); err != nil {
		_ = s.grp.Thaw() // a partial freeze must not leave processes stopped
		return st, err
	}
	st.Freeze = time.Since(t0)
	cl.Add(s.grp.Thaw)
	m, err := s.grp.Memory()
	if err != nil {
		return st, err
	}
	st.Before, st.After = memoryUse(m), memoryUse(m)
	if reclaim {
		t1 := time.Now()
		if err := s.grp.Reclaim(); err != nil {
			return st, err
		}
		st.Reclaim = time.Since(t1)
		if m, err = s.grp.Memory(); err != nil {
			return st, err
		}
		st.After = memoryUse(m)
	}
	cl.Release()
	return st, nil
}

var _ backend.IdleReclaimer = (*sandbox)(nil)

// ReclaimIdle has the running sandbox's cgroup give back what memory it
// can without stopping it (backend.IdleReclaimer).
func (s *sandbox) ReclaimIdle(ctx context.Context) (before, after backend.MemoryUse, err error) {
	if err := ctx.Err(); err != nil {
		return before, after, err
	}
	m, err := s.grp.Memory()
	if err != nil {
		return before, after, err
	}
	before = memoryUse(m)
	if err := s.grp.ReclaimIdle(); err != nil {
		return before, before, err
	}
	if m, err = s.grp.Memory(); err != nil {
		return before, before, err
	}
	return before, memoryUse(m), nil
}

// MemoryPressure is the sandbox cgroup's PSI (backend.IdleReclaimer).
func (s *sandbox) MemoryPressure() float64 { return s.grp.MemoryPressure() }

func memoryUse(m cgroups.Memory) backend.MemoryUse {
	return backend.MemoryUse{Bytes: m.Usage, File: m.File, Anon: m.Anon, Swap: m.Swap}
}

// Resume restores the memory limit if asked and thaws the cgroup.
func (s *sandbox) Resume(ctx context.Context, o backend.ResumeOptions) error {
	select {
	case <-s.exited.Done():
		return errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	if o.MemoryBytes != nil {
		if err := s.grp.SetLimits(cgroups.Limits{MemoryBytes: o.MemoryBytes}); err != nil {
			return err
		}
	}
	return s.grp.Thaw()
}

// thawForKill lets a SIGKILL sent to a frozen sandbox be delivered: the
// v1 freezer holds signals until the thaw (the v2 freezer lets fatal
// ones through, but a thaw does no harm there). Frozen is one small read.
func (s *sandbox) thawForKill() {
	if frozen, err := s.grp.Frozen(); err == nil && frozen {
		_ = s.grp.Thaw()
	}
}

// MemoryUse is what the sandbox's cgroup is charged now
// (backend.MemoryReporter).
func (s *sandbox) MemoryUse() (backend.MemoryUse, error) {
	m, err := s.grp.Memory()
	if err != nil {
		return backend.MemoryUse{}, err
	}
	return memoryUse(m), nil
}

package container

import (
	"context"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
)

var _ backend.Updater = (*sandbox)(nil)

// Update changes the sandbox's cgroup limits, all or none
// (cgroups.Group.SetLimits restores what it wrote when a write fails).
func (s *sandbox) Update(ctx context.Context, u backend.Update) error {
	select {
	case <-s.exited.Done():
		return errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.grp.SetLimits(cgroups.Limits{CPUMillis: u.CPUMillis, MemoryBytes: u.MemoryBytes, PidsMax: u.PidsMax}); err != nil {
		return err
	}
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

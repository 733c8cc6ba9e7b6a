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
	return s.grp.SetLimits(cgroups.Limits{CPUMillis: u.CPUMillis, MemoryBytes: u.MemoryBytes, PidsMax: u.PidsMax})
}

package container

import (
	"context"
	"errors"
	"syscall"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
)

var _ backend.JobRunner = (*sandbox)(nil)

// jobMemorySlack is what the memory cgroup allows above a job's largest
// step limit: the agent judges a step by its exact peak (MemoryLimit once
// it passed the limit), and the cgroup only stops a program that keeps
// growing past it, so that a program just over the limit gets the status,
// not a kill whose cause is a guess.
const jobMemorySlack = 16 << 20

// RunJob runs a job through the agent (one JOB frame: every step, then
// the reset), completes the reset with what the agent cannot reach (POSIX
// message queues, mqueue.go), and turns kills by the memory cgroup into MemoryLimit: the
// agent sees only a SIGKILL, the cgroup's OOM counter says whose.
func (s *sandbox) RunJob(ctx context.Context, j backend.Job) (backend.JobResult, error) {
	select {
	case <-s.exited.Done():
		return backend.JobResult{}, errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	var mem int64
	for _, st := range j.Steps {
		mem = max(mem, st.Limits.MemoryBytes)
	}
	if mem > 0 {
		mem += jobMemorySlack
	}
	s.jobMu.Lock()
	defer s.jobMu.Unlock()
	if mem != s.jobMem {
		// Only a change costs a write (most callers use one limit).
		if err := s.grp.SetLimits(cgroups.Limits{MemoryBytes: &mem}); err != nil {
			return backend.JobResult{}, err
		}
		s.jobMem = mem
	}
	// Nothing runs between jobs: the count after the last job is the
	// count before this one (one cgroup read per job, not two).
	if !s.jobOOMKnown {
		n, err := s.grp.OOMKills()
		if err != nil {
			return backend.JobResult{}, err
		}
		s.jobOOM, s.jobOOMKnown = n, true
	}
	before := s.jobOOM
	res, err := s.agent.RunJob(ctx, j)
	if err != nil {
		return res, err
	}
	if res.ResetErr == 0 {
		res.ResetErr = s.wipeJobMqueues()
	}
	after, err := s.grp.OOMKills()
	if err != nil {
		s.jobOOMKnown = false
		return res, err
	}
	s.jobOOM = after
	if after > before {
		// Only the agent (limits, the end of a step) and the OOM killer
		// send SIGKILL here, and the agent's own kills end in another
		// status; a program that killed itself with SIGKILL while the
		// cgroup killed another process is the rare misreading.
		for i := range res.Steps {
			st := &res.Steps[i]
			if st.Status == backend.StatusSignalled && st.Signal == syscall.SIGKILL {
				st.Status = backend.StatusMemoryLimit
			}
		}
	}
	return res, nil
}

// wipeJobMqueues removes the message queues the job left, opening the
// sandbox's mqueue filesystem on its first job; an errno fails the reset.
func (s *sandbox) wipeJobMqueues() syscall.Errno {
	if s.jobMq == nil {
		d, err := openMqueue(s.st.Pid)
		if err != nil {
			return errnoOf(err)
		}
		s.jobMq = d
	}
	if err := wipeMqueue(s.jobMq); err != nil {
		return errnoOf(err)
	}
	return 0
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

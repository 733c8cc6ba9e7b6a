package container

import (
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/coresched"
	"github.com/warrenrl/warren/internal/errdefs"
)

// LSWeight is the CPU weight of a latency-sensitive sandbox's group (v2
// scale, cpu.shares 10240 on v1): ten times a default group's, so that
// against groups that are not idle (the node's own services, sandboxes
// of another daemon) it still gets most of a contended CPU.
const LSWeight = 1000

// groupQoS is the cgroup side of class q: best-effort idles, latency-
// sensitive weighs more and may be pinned.
func groupQoS(q backend.QoS) cgroups.QoS {
	if q.Latency() {
		return cgroups.QoS{Weight: LSWeight, CPUs: q.CPUs}
	}
	return cgroups.QoS{Idle: true}
}

// checkQoS refuses what no kernel call should see: an unknown class, and
// pinning outside the latency-sensitive class.
func checkQoS(q backend.QoS) error {
	switch q.Class {
	case "", backend.QoSBestEffort:
		if len(q.CPUs) > 0 {
			return errdefs.Invalidf("qos_cpus: only a latency-sensitive (ls) sandbox is pinned")
		}
	case backend.QoSLatency:
	default:
		return errdefs.Invalidf("qos %q: want %q or %q", q.Class, backend.QoSLatency, backend.QoSBestEffort)
	}
	return nil
}

// applyQoS puts group grp, whose processes are pids, in class q: its cgroup
// files, and where the kernel has core scheduling one cookie for a
// latency-sensitive sandbox's processes (those they fork inherit it) or
// none for a best-effort one.
func applyQoS(grp cgroups.Group, pids []int, q backend.QoS) error {
	if err := checkQoS(q); err != nil {
		return err
	}
	if err := grp.SetQoS(groupQoS(q)); err != nil {
		return err
	}
	if !coresched.Available() {
		return nil
	}
	return coresched.Isolate(pids, q.Latency())
}

// setQoS changes a running sandbox's class and returns what puts the old
// one back (read from its cgroup, so that a sandbox adopted from an
// earlier daemon is restored as it was).
func (s *sandbox) setQoS(q backend.QoS) (undo func() error, err error) {
	if err := checkQoS(q); err != nil {
		return nil, err
	}
	idle, _, cpus, err := cgroups.ReadQoS(s.grp)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read the QoS of sandbox "+s.id)
	}
	old := backend.QoS{Class: backend.QoSBestEffort}
	if !idle {
		old = backend.QoS{Class: backend.QoSLatency, CPUs: parseCPUList(cpus)}
	}
	procs := func() []int {
		pids, _ := s.grp.Procs()
		return pids
	}
	if err := applyQoS(s.grp, procs(), q); err != nil {
		// SetQoS writes all or nothing, but a pinning or cookie step may
		// have followed the class files.
		_ = applyQoS(s.grp, procs(), old)
		return nil, err
	}
	return func() error { return applyQoS(s.grp, procs(), old) }, nil
}

// parseCPUList reads the kernel's list format ("0-2,5"); nil for "".
func parseCPUList(s string) []int {
	var out []int
	for part := range strings.SplitSeq(strings.TrimSpace(s), ",") {
		lo, hi, rng := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		b := a
		if rng {
			if b, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out
}

// Package qos puts a sandbox's host cgroup in its CPU class
// (docs/ARCHITECTURE.md, "CPU QoS"): the one mapping of backend.QoS onto
// cgroup files and core scheduling that the container backend's groups
// and the VM backends' QEMU groups share, so that a class weighs the
// same whichever backend runs the sandbox.
package qos

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

// Group is the cgroup side of class q: best-effort idles, latency-
// sensitive weighs more and may be pinned.
func Group(q backend.QoS) cgroups.QoS {
	if q.Latency() {
		return cgroups.QoS{Weight: LSWeight, CPUs: q.CPUs}
	}
	return cgroups.QoS{Idle: true}
}

// Check refuses what no kernel call should see: an unknown class, and
// pinning outside the latency-sensitive class.
func Check(q backend.QoS) error {
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

// Apply puts group grp, whose processes are pids, in class q: its cgroup
// files, and where the kernel has core scheduling one cookie for a
// latency-sensitive sandbox's processes (those they fork inherit it) or
// none for a best-effort one.
func Apply(grp cgroups.Group, pids []int, q backend.QoS) error {
	if err := Check(q); err != nil {
		return err
	}
	if err := grp.SetQoS(Group(q)); err != nil {
		return err
	}
	if !coresched.Available() {
		return nil
	}
	return coresched.Isolate(pids, q.Latency())
}

// Current reads grp's class back from its cgroup files (a group an
// earlier daemon made is read as it is).
func Current(grp cgroups.Group) (backend.QoS, error) {
	idle, _, cpus, err := cgroups.ReadQoS(grp)
	if err != nil {
		return backend.QoS{}, err
	}
	if idle {
		return backend.QoS{Class: backend.QoSBestEffort}, nil
	}
	return backend.QoS{Class: backend.QoSLatency, CPUs: ParseCPUList(cpus)}, nil
}

// Replace changes the class of a running sandbox's group and returns what
// puts the old one back. procs lists the group's processes at each step.
func Replace(grp cgroups.Group, procs func() []int, q backend.QoS) (undo func() error, err error) {
	if err := Check(q); err != nil {
		return nil, err
	}
	old, err := Current(grp)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read the QoS of cgroup "+grp.Name())
	}
	if err := Apply(grp, procs(), q); err != nil {
		// SetQoS writes all or nothing, but a pinning or cookie step may
		// have followed the class files.
		_ = Apply(grp, procs(), old)
		return nil, err
	}
	return func() error { return Apply(grp, procs(), old) }, nil
}

// ParseCPUList reads the kernel's list format ("0-2,5"); nil for "".
func ParseCPUList(s string) []int {
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

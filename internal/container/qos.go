package container

import (
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/qos"
)

// LSWeight is the CPU weight of a latency-sensitive sandbox's group
// (internal/qos, which the VM backends' QEMU groups share).
const LSWeight = qos.LSWeight

// applyQoS puts group grp, whose processes are pids, in class q
// (qos.Apply).
func applyQoS(grp cgroups.Group, pids []int, q backend.QoS) error { return qos.Apply(grp, pids, q) }

// setQoS changes a running sandbox's class and returns what puts the old
// one back (read from its cgroup, so that a sandbox adopted from an
// earlier daemon is restored as it was).
func (s *sandbox) setQoS(q backend.QoS) (undo func() error, err error) {
	return qos.Replace(s.grp, func() []int {
		pids, _ := s.grp.Procs()
		return pids
	}, q)
}

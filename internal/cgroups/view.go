package cgroups

import (
	"path/filepath"
	"slices"
	"sync"

	cgroup1 "github.com/containerd/cgroups/v3/cgroup1"

	"github.com/warrenrl/warren/internal/mountinfo"
)

// ViewMount is one cgroup hierarchy a sandbox sees, read-only, at
// /sys/fs/cgroup: a bind of its own group's directory, which shows it as
// the root (its limits, usage and pressure: what JVMs, Go, Node and build
// tools read to size themselves) and nothing above or beside it. It is
// the host's superblock seen from below the sandbox's group, not a new
// one, and in the sandbox's cgroup namespace its mountinfo names no host
// path (the kernel shows a cgroup mount's root relative to the reader's
// namespace), as a mount of the hierarchy made inside that namespace
// would; a bind needs no filesystem context parsed and matched to the
// superblock, and no remount once the init makes /sys read-only at once.
type ViewMount struct {
	// Dir is where below /sys/fs/cgroup: "" for a v2 host's one
	// hierarchy, else the host's directory name ("memory", "unified").
	Dir string
}

// Source is the directory of group (a Group's Name) in v's hierarchy on
// the host: what the sandbox's init binds.
func (v ViewMount) Source(group string) string { return filepath.Join(Root, v.Dir, group) }

// Views lists what a sandbox of this host mounts at /sys/fs/cgroup: the
// hierarchies in which it has a group of its own. Hierarchies it shares
// (devices on hybrid hosts, cpuset, blkio, name=systemd) are left out:
// there its namespace's root is a group other processes are in.
func Views() []ViewMount { return views() }

var views = sync.OnceValue(func() []ViewMount {
	if unified() {
		return []ViewMount{{}}
	}
	owned := legacySubsystems
	if hybrid() {
		owned = hybridSubsystems
	}
	var out []ViewMount
	for _, h := range v1Mounts() {
		// Every controller of a co-mounted hierarchy must be one the
		// sandbox has its group in, or its root would be shared.
		shared := slices.ContainsFunc(h.controllers, func(c string) bool {
			return !slices.Contains(owned, cgroup1.Name(c))
		})
		if len(h.controllers) > 0 && !shared {
			out = append(out, ViewMount{Dir: h.dir})
		}
	}
	if hybrid() {
		out = append(out, ViewMount{Dir: unifiedDir})
	}
	return out
})

type v1Mount struct {
	dir         string
	controllers []string
}

// v1Mounts lists the v1 hierarchies mounted directly below Root, with
// their controllers (from the super options; named hierarchies such as
// name=systemd have none).
func v1Mounts() []v1Mount {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil
	}
	var out []v1Mount
	for _, m := range mounts {
		if m.FSType != "cgroup" || filepath.Dir(m.Point) != Root {
			continue
		}
		var ctrls []string
		for _, o := range m.Options {
			if knownController[o] {
				ctrls = append(ctrls, o)
			}
		}
		out = append(out, v1Mount{dir: filepath.Base(m.Point), controllers: ctrls})
	}
	return out
}

var knownController = map[string]bool{
	"cpu": true, "cpuacct": true, "cpuset": true, "memory": true, "pids": true, "freezer": true,
	"devices": true, "blkio": true, "net_cls": true, "net_prio": true, "hugetlb": true, "perf_event": true,
	"rdma": true, "misc": true,
}

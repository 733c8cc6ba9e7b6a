package cgroups

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"

	cgroup1 "github.com/containerd/cgroups/v3/cgroup1"

	"github.com/warrenrl/warren/internal/mountinfo"
)

// ViewMount is one cgroup filesystem a sandbox mounts, read-only and
// inside its cgroup namespace, so that it sees its own group as the root
// (its limits, usage and pressure: what JVMs, Go, Node and build tools
// read to size themselves) and nothing above or beside it. Such a mount
// is a second view of the host's superblock, not a new one.
type ViewMount struct {
	// Dir is where below /sys/fs/cgroup: "" for a v2 host's one
	// hierarchy, else the host's directory name ("memory", "unified").
	Dir string
	// Type is "cgroup" (v1) or "cgroup2"; Data the v1 controllers, as the
	// host mounted them ("cpu,cpuacct" where they are co-mounted).
	Type, Data string
}

// Views lists what a sandbox of this host mounts at /sys/fs/cgroup: the
// hierarchies in which it has a group of its own. Hierarchies it shares
// (devices on hybrid hosts, cpuset, blkio, name=systemd) are left out:
// there its namespace's root is a group other processes are in.
func Views() []ViewMount { return views() }

var views = sync.OnceValue(func() []ViewMount {
	if unified() {
		return []ViewMount{{Type: "cgroup2"}}
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
			out = append(out, ViewMount{Dir: h.dir, Type: "cgroup", Data: strings.Join(h.controllers, ",")})
		}
	}
	if hybrid() {
		out = append(out, ViewMount{Dir: unifiedDir, Type: "cgroup2"})
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

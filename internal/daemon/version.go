package daemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/coresched"
	"github.com/warrenrl/warren/internal/mountinfo"
)

// Version and Commit are set at link time:
//
//	go build -ldflags "-X github.com/warrenrl/warren/internal/daemon.Version=v0.1.0 -X github.com/warrenrl/warren/internal/daemon.Commit=abc123"
var (
	Version = "dev"
	Commit  = ""
)

// Version reports the daemon's version, backends, cgroup mode and QoS
// mechanisms.
func (m *Manager) Version(ctx context.Context, req *warrenv1.VersionRequest) (_ *warrenv1.VersionResponse, err error) {
	defer m.observe("Version", &err)
	return &warrenv1.VersionResponse{
		Version:    Version,
		Commit:     Commit,
		Backends:   m.backendNames(),
		CgroupMode: CgroupMode(),
		Gpus:       m.nodeGPUs(),
		Node:       m.cfg.NodeName,
		NodeTag:    m.cfg.NodeTag,
		// The QoS mechanisms of this kernel (qos.go): detected once.
		CpuIdle:        cgroups.HasIdle(),
		CoreScheduling: coresched.Available(),
	}, nil
}

// nodeGPUs are the GPUs the fncall backend hands out, and their jobs now.
func (m *Manager) nodeGPUs() []*warrenv1.NodeGpu {
	if m.cfg.FnCall == nil {
		return nil
	}
	var out []*warrenv1.NodeGpu
	for _, g := range m.cfg.FnCall.GPUs() {
		out = append(out, &warrenv1.NodeGpu{Index: int32(g.Index), Device: g.Path, Exclusive: g.Exclusive, SharedJobs: int32(g.Shared)})
	}
	return out
}

// CgroupMode detects the host's cgroup layout: "v2" (unified), "hybrid"
// (v1 controllers with a cgroup2 mount at /sys/fs/cgroup/unified) or "v1".
func CgroupMode() string {
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	return cgroupMode("/sys/fs/cgroup", string(mounts))
}

// cgroupMode decides from the cgroup mount's directory (root) and the
// mount table.
func cgroupMode(root, mountinfo string) string {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return "v2"
	}
	if slices.Contains(mountPoints(mountinfo, "cgroup2"), "/sys/fs/cgroup/unified") {
		return "hybrid"
	}
	return "v1"
}

// mountPoints lists the mount points of filesystems of type fstype in a
// /proc/self/mountinfo text.
func mountPoints(text, fstype string) []string {
	var out []string
	for _, m := range mountinfo.Parse(text) {
		if m.FSType == fstype {
			out = append(out, m.Point)
		}
	}
	return out
}

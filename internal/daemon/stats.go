package daemon

import (
	"context"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
)

// SandboxStats reads a running sandbox's resource use now: the backend's
// counters (its cgroup for the container backend), its limits, and the
// filesystem of its writable layer.
func (m *Manager) SandboxStats(ctx context.Context, req *warrenv1.SandboxStatsRequest) (_ *warrenv1.SandboxStatsResponse, err error) {
	defer m.observe("SandboxStats", &err)
	s, v, err := m.live(ctx, opFiles, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	st, err := v.sb.Stats()
	if err != nil {
		return nil, m.explain(opFiles, s, err, "read sandbox stats")
	}
	res := s.resources()
	out := &warrenv1.SandboxStatsResponse{
		SampledAtUnixMs:   unixMs(time.Now()),
		CpuUsageNs:        uint64(st.CPUUsage),
		CpuCount:          uint32(runtime.NumCPU()),
		MemoryBytes:       st.MemoryBytes,
		MemoryCacheBytes:  st.MemoryCache,
		MemoryAnonBytes:   st.MemoryAnon,
		MemoryKernelBytes: st.MemoryKernel,
		MemorySwapBytes:   st.MemorySwap,
		MemoryLimitBytes:  uint64(res.GetMemoryBytes()),
		Pids:              st.Pids,
		OomKills:          st.OOMKills,
	}
	if c := res.GetCpuMillis(); c > 0 {
		out.CpuCount = uint32((c + 999) / 1000)
	}
	if out.MemoryLimitBytes == 0 {
		out.MemoryLimitBytes = uint64(memTotal())
	}
	out.DiskBytes, out.DiskUsedBytes = diskOf(ctx, v.sb, res.GetDiskBytes())
	return out, nil
}

// diskOf is the size and use of the filesystem of the sandbox's writable
// layer: its own disk (a disk limit), else what statfs of its root says,
// which on an overlay is the filesystem of its upper layer (the node's,
// shared). A VM (no host-visible root) with a disk limit: the limit, and
// what its disk image holds on the node (the guest gives deleted blocks
// back). 0, 0 where none of these can be read (a VM without a limit).
func diskOf(ctx context.Context, sb backend.Sandbox, limit int64) (total, used uint64) {
	if c, ok := sb.(backend.Containment); ok {
		if ct, err := c.Contained(); err == nil && ct.Disk != nil {
			return ct.Disk.Bytes, ct.Disk.Bytes - ct.Disk.FreeBytes
		}
	}
	root := sb.Root()
	if root == "" {
		if du, ok := sb.(backend.DiskUser); ok && limit > 0 {
			if u, err := du.DiskUsage(ctx); err == nil {
				return uint64(limit), min(u.Bytes, uint64(limit))
			}
		}
		return 0, 0
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return 0, 0
	}
	bs := uint64(fs.Bsize)
	return fs.Blocks * bs, (fs.Blocks - fs.Bfree) * bs
}

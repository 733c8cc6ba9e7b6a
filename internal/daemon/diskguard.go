package daemon

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/events"
)

// The node's disk guard. A sandbox without a disk limit writes its layer
// onto the state directory's filesystem, unbounded: one agent could fill
// the node. A limit for every sandbox (--default-disk) costs an ext4
// image, a loop device and a mount per create (~10 ms); instead the
// guard keeps a reserve on that filesystem, read with one statfs per
// GuardInterval, for bytes (--disk-reserve) and inodes (5% of them):
//
//   - below the reserve, creates are refused (exhausted), so no new
//     sandbox starts on a disk that is running out;
//   - below half of it, the sandbox whose writable layer takes the most
//     of what is short (bytes, or files) is stopped (STOPPED, with the reason, and a
//     disk_reserve event): its layer is removed and the space comes
//     back. Its usage is measured only then (a walk of every running
//     sandbox's layer), so the guard costs nothing while the disk is fine.
//
// After a stop the guard waits for the removal (the delete backlog) for
// up to diskStopCooldown before it stops another, so one offender costs
// one sandbox, not every sandbox the reaper has not caught up with.

const (
	diskStopCooldown = time.Minute
	// diskUsageTimeout bounds the walks of one search for the largest
	// sandbox.
	diskUsageTimeout = 30 * time.Second
)

// diskGuard is the guard's state; only the guard goroutine writes it
// (Create reads Manager.diskLow).
type diskGuard struct {
	lastStop time.Time
}

// inodeReservePercent is the share of the state filesystem's inodes the
// guard keeps free (below half of it, it stops the sandbox with the most
// files): empty files fill an inode table long before the blocks.
const inodeReservePercent = 5

// nodeDisk is one look at the state directory's filesystem.
type nodeDisk struct {
	free, reserve            uint64 // bytes
	freeInodes, inodeReserve uint64 // inodeReserve 0: no inode count (some filesystems)
}

func (d nodeDisk) low() bool {
	return d.free < d.reserve || d.freeInodes < d.inodeReserve
}

// short says what is critically short (under half its reserve): "bytes",
// "inodes" or "".
func (d nodeDisk) short() string {
	switch {
	case d.free < d.reserve/2:
		return "bytes"
	case d.freeInodes < d.inodeReserve/2:
		return "inodes"
	}
	return ""
}

// checkNodeDisk reads the state directory's free space and acts on it.
func (m *Manager) checkNodeDisk() {
	if m.cfg.DiskReserveBytes <= 0 {
		return
	}
	var st unix.Statfs_t
	if err := unix.Statfs(m.cfg.StateDir, &st); err != nil {
		return
	}
	d := nodeDisk{free: st.Bavail * uint64(st.Bsize), reserve: uint64(m.cfg.DiskReserveBytes),
		freeInodes: st.Ffree, inodeReserve: st.Files * inodeReservePercent / 100}
	low := d.low()
	if was := m.diskLow.Swap(low); was != low {
		m.log.Warn("node disk below its reserve: creates are refused", "low", low, "free", d.free, "reserve", d.reserve,
			"free_inodes", d.freeInodes, "inode_reserve", d.inodeReserve)
	}
	if what := d.short(); what != "" && m.mayStopForDisk() {
		m.stopLargest(d, what == "inodes")
	}
}

// mayStopForDisk: the last stop's layer has been removed, or the
// cooldown passed.
func (m *Manager) mayStopForDisk() bool {
	if time.Since(m.disk.lastStop) >= diskStopCooldown {
		return true
	}
	for _, b := range m.cfg.Backends {
		if bl, ok := b.(backend.Backlogged); ok && bl.Backlog() > 0 {
			return false
		}
	}
	return true
}

// stopLargest stops the running sandbox whose writable layer takes the
// most of the node's disk: bytes, or with byInodes, files.
func (m *Manager) stopLargest(d nodeDisk, byInodes bool) {
	ctx, cancel := context.WithTimeout(context.Background(), diskUsageTimeout)
	defer cancel()
	var (
		best    *sandbox
		bestSB  backend.Sandbox
		bestUse backend.LayerUsage
	)
	for _, s := range m.snapshot() {
		s.mu.Lock()
		sb, running := s.sb, s.st == stateRunning
		s.mu.Unlock()
		du, ok := sb.(backend.DiskUser)
		if !running || !ok {
			continue
		}
		u, err := du.DiskUsage(ctx)
		if err == nil && (byInodes && u.Inodes > bestUse.Inodes || !byInodes && u.Bytes > bestUse.Bytes) {
			best, bestSB, bestUse = s, sb, u
		}
	}
	if best == nil {
		m.log.Error("node disk below half its reserve, and no sandbox to stop holds any of it", "free", d.free, "free_inodes", d.freeInodes)
		return
	}
	why := fmt.Sprintf("stopped by the disk guard: the node's disk had %s free, under half its reserve of %s, and this sandbox's writable layer took the most of it (%s)",
		bytesText(int64(d.free)), bytesText(int64(d.reserve)), bytesText(int64(bestUse.Bytes)))
	if byInodes {
		why = fmt.Sprintf("stopped by the disk guard: the node's disk had %d free inodes, under half its reserve of %d, and this sandbox's writable layer held the most files (%d)",
			d.freeInodes, d.inodeReserve, bestUse.Inodes)
	}
	m.record(best.id, events.DiskReserve, 1, "", "%s", why)
	m.disk.lastStop = time.Now()
	m.died(best, bestSB, why)
}

// refuseOnLowDisk is Create's check of the guard.
func (m *Manager) refuseOnLowDisk() error {
	if m.diskLow.Load() {
		return errdefs.Exhaustedf("the node's disk is below its reserve (%s, and %d%% of its inodes): no sandbox is created until space is freed", bytesText(m.cfg.DiskReserveBytes), inodeReservePercent)
	}
	return nil
}

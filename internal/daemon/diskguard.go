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
// GuardInterval:
//
//   - below the reserve, creates are refused (exhausted), so no new
//     sandbox starts on a disk that is running out;
//   - below half of it, the sandbox whose writable layer takes the most
//     of the node's disk is stopped (STOPPED, with the reason, and a
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
// except low, which Create reads.
type diskGuard struct {
	lastStop time.Time
}

// checkNodeDisk reads the state directory's free space and acts on it.
func (m *Manager) checkNodeDisk() {
	reserve := uint64(m.cfg.DiskReserveBytes)
	if reserve == 0 {
		return
	}
	var st unix.Statfs_t
	if err := unix.Statfs(m.cfg.StateDir, &st); err != nil {
		return
	}
	free := st.Bavail * uint64(st.Bsize)
	low := free < reserve
	if was := m.diskLow.Swap(low); was != low {
		m.log.Warn("node disk below its reserve: creates are refused", "low", low, "free", free, "reserve", reserve)
	}
	if free >= reserve/2 || !m.mayStopForDisk() {
		return
	}
	m.stopLargest(free, reserve)
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
// most of the node's disk.
func (m *Manager) stopLargest(free, reserve uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), diskUsageTimeout)
	defer cancel()
	var (
		best    *sandbox
		bestSB  backend.Sandbox
		bestUse uint64
	)
	for _, s := range m.snapshot() {
		s.mu.Lock()
		sb, running := s.sb, s.st == stateRunning
		s.mu.Unlock()
		du, ok := sb.(backend.DiskUser)
		if !running || !ok {
			continue
		}
		if n, err := du.DiskUsage(ctx); err == nil && n > bestUse {
			best, bestSB, bestUse = s, sb, n
		}
	}
	if best == nil {
		m.log.Error("node disk below half its reserve, and no sandbox to stop holds any of it", "free", free, "reserve", reserve)
		return
	}
	why := fmt.Sprintf("stopped by the disk guard: the node's disk had %s free, under half its reserve of %s, and this sandbox's writable layer took the most of it (%s)",
		bytesText(int64(free)), bytesText(int64(reserve)), bytesText(int64(bestUse)))
	m.record(best.id, events.DiskReserve, 1, "", "%s", why)
	m.disk.lastStop = time.Now()
	m.died(best, bestSB, why)
}

// refuseOnLowDisk is Create's check of the guard.
func (m *Manager) refuseOnLowDisk() error {
	if m.diskLow.Load() {
		return errdefs.Exhaustedf("the node's disk is below its reserve of %s: no sandbox is created until space is freed", bytesText(m.cfg.DiskReserveBytes))
	}
	return nil
}

package microvm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
)

// A VM's memory is QEMU's anonymous memory: the guest touches a page
// once and the node keeps it, even after the guest freed it. A virtio
// balloon with free page reporting (VIRTIO_BALLOON_F_REPORTING, Linux's
// page_reporting) has the guest tell QEMU which free blocks it holds (2
// MiB and up, a couple of seconds after they were freed), and QEMU
// discards them (MADV_DONTNEED): the node gets them back, the guest
// touches them again when it needs them. The balloon itself is never
// inflated: the guest's size stays what it was booted with.

func balloonArgs(cfg Config) []string {
	if cfg.NoBalloon {
		return nil
	}
	return []string{"-device", "virtio-balloon-device,free-page-reporting=on"}
}

// reportsFreePages says whether the VM's QEMU was started with free page
// reporting (a VM adopted from an older daemon may not have been).
func (v *VM) reportsFreePages() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", v.pid))
	return err == nil && bytes.Contains(b, []byte("free-page-reporting=on"))
}

// Reporting settles: the guest reports freed blocks ~2 s after they were
// freed (Linux's page_reporting delay), in batches; QEMU's memory has
// stopped falling once it held for reclaimSettle. reclaimMax bounds the
// wait on a loaded node.
const (
	reclaimSettle = 3 * time.Second
	reclaimMax    = 15 * time.Second
)

// Reclaim has the running guest drop its page cache (guest "reclaim":
// the layers' pages it read, files it no longer holds) and waits for the
// balloon's free page reporting to return the freed memory to the node.
// before is the VM's memory on the node ahead of it, after once QEMU's
// memory stopped falling. The guest's tmpfs files and its processes'
// memory stay.
func (v *VM) Reclaim(ctx context.Context) (before, after backend.MemoryUse, err error) {
	if before, err = processMemory(v.pid); err != nil {
		return before, before, err
	}
	var rr guest.ReclaimResult
	if err := v.call(ctx, guest.Request{Op: "reclaim"}, nil, &rr); err != nil {
		return before, before, err
	}
	if !v.reportsFreePages() {
		after, err = processMemory(v.pid)
		return before, after, err
	}
	// Anonymous memory: the guest's; the file part (QEMU's code) moves
	// with the other processes that map the same libraries.
	low := before.Anon
	lowAt, end := time.Now(), time.Now().Add(reclaimMax)
	for {
		u, err := processMemory(v.pid)
		if err != nil {
			return before, before, err
		}
		if u.Anon+(1<<20) < low {
			low, lowAt = u.Anon, time.Now()
		}
		if now := time.Now(); now.Sub(lowAt) >= reclaimSettle || now.After(end) {
			return before, u, nil
		}
		select {
		case <-ctx.Done():
			return before, u, nil
		case <-v.done:
			return before, before, errdefs.Unavailablef("the VM ended: %v", v.err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

var _ backend.IdleReclaimer = (*sandbox)(nil)

// ReclaimIdle is Reclaim on a running, idle VM (backend.IdleReclaimer):
// the daemon's idle reclaim takes back the guest's page cache.
func (s *sandbox) ReclaimIdle(ctx context.Context) (before, after backend.MemoryUse, err error) {
	if s.paused.Load() {
		return before, after, errdefs.Conflictf("the VM is paused")
	}
	return s.vm.Reclaim(ctx)
}

// MemoryPressure is unknown (-1): the guest's own pressure is not read
// yet, and the sandbox's CPU use already says whether it is idle.
func (s *sandbox) MemoryPressure() float64 { return -1 }

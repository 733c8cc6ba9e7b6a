package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/qmp"
)

// A VM pauses whole: QMP "stop" halts its vCPUs (the guest's processes,
// its agent, its clock), "cont" runs them on.
var (
	_ backend.Pauser         = (*sandbox)(nil)
	_ backend.MemoryReporter = (*sandbox)(nil)
)

// qmp runs one QMP command on a connection of its own: QEMU serves one
// client at a time, and a connection per call leaves none held (a
// restarted daemon finds the socket free).
func (v *VM) qmp(ctx context.Context, cmd string, out any) error {
	return v.qmpArgs(ctx, cmd, nil, out)
}

// qmpArgs is qmp with arguments.
func (v *VM) qmpArgs(ctx context.Context, cmd string, args, out any) error {
	c, err := qmp.Dial(ctx, filepath.Join(v.cfg.Dir, qmpSocket))
	if err != nil {
		return v.streamErr(ctx, err, "connect to QEMU's QMP socket")
	}
	defer c.Close()
	if err := c.Run(ctx, cmd, args, out); err != nil {
		if _, ok := err.(*qmp.Error); ok {
			return errdefs.Wrap(errdefs.Internal, err, "QMP "+cmd)
		}
		return v.streamErr(ctx, err, "QMP "+cmd)
	}
	return nil
}

// Pause stops the VM's vCPUs. With reclaim the guest first drops its
// page cache while it still runs, and the balloon's free page reporting
// returns what that freed to the node (VM.Reclaim: a stopped guest
// reports nothing); Before is then the VM's memory ahead of the reclaim,
// After once paused. A guest agent without the reclaim call (a VM booted
// by an older daemon) pauses without it, After equal to Before.
func (s *sandbox) Pause(ctx context.Context, reclaim bool) (backend.PauseStats, error) {
	var st backend.PauseStats
	var before backend.MemoryUse
	reclaimed := false
	if reclaim {
		t0 := time.Now()
		b, _, err := s.vm.Reclaim(ctx)
		switch {
		case ctx.Err() != nil:
			return st, ctx.Err()
		case err == nil:
			before, reclaimed = b, true
			st.Reclaim = time.Since(t0)
		case errdefs.CategoryOf(err) == errdefs.Unsupported:
		default:
			return st, err
		}
	}
	t0 := time.Now()
	if err := s.vm.stop(ctx); err != nil {
		return backend.PauseStats{}, err
	}
	s.paused.Store(true)
	st.Freeze = time.Since(t0)
	use, err := s.MemoryUse()
	if err != nil {
		// All or nothing: it runs on.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if s.vm.cont(rctx) == nil {
			s.paused.Store(false)
		}
		return backend.PauseStats{}, err
	}
	st.Before, st.After = use, use
	if reclaimed {
		st.Before = before
	}
	return st, nil
}

// Resume runs the VM's vCPUs on; "cont" on a running VM does nothing.
// The memory limit is the guest cgroup's, which a pause leaves alone.
func (s *sandbox) Resume(ctx context.Context, o backend.ResumeOptions) error {
	if err := s.vm.cont(ctx); err != nil {
		return err
	}
	s.paused.Store(false)
	return nil
}

// stop halts the VM: QMP "stop", or for a VM on a vhost-user vsock, a
// freeze of its cgroup (QEMU and the backend). QEMU's stop also stops
// the vhost-user device, and vhost-device-vsock 0.3.0 loses the device
// for good if a host connection opens or closes meanwhile (measured:
// every session then hangs after "cont", the guest sending from CID 0);
// a frozen VM keeps its device running, and the host's connection events
// wait in the kernel until the thaw. The guest's clock runs on through a
// freeze (it does not through a stop).
func (v *VM) stop(ctx context.Context) error {
	if !v.cfg.vhostUser() {
		return v.qmp(ctx, "stop", nil)
	}
	if v.cfg.Cgroup == nil {
		return errdefs.Unsupportedf("microvm: a vsock VM without a host cgroup cannot be paused")
	}
	return v.cfg.Cgroup.Freeze()
}

// cont runs a stopped VM on.
func (v *VM) cont(ctx context.Context) error {
	if !v.cfg.vhostUser() {
		return v.qmp(ctx, "cont", nil)
	}
	if v.cfg.Cgroup == nil {
		return nil
	}
	return v.cfg.Cgroup.Thaw()
}

// Running reports whether the VM runs (not stopped: stop). A frozen
// QEMU does not answer QMP.
func (v *VM) Running(ctx context.Context) (bool, error) { return v.running(ctx) }

func (v *VM) running(ctx context.Context) (bool, error) {
	if v.cfg.vhostUser() && v.cfg.Cgroup != nil {
		frozen, err := v.cfg.Cgroup.Frozen()
		if err != nil || frozen {
			return false, err
		}
	}
	var qs qmp.Status
	if err := v.qmp(ctx, "query-status", &qs); err != nil {
		return false, err
	}
	return qs.Running, nil
}

// MemoryUse is what the VM takes of the node: the QEMU process's
// proportional set size (pages shared with other processes, QEMU's code
// and libraries, counted by share), its anonymous part (the guest's
// memory) and its file part, and what of it is on swap.
func (s *sandbox) MemoryUse() (backend.MemoryUse, error) {
	return processMemory(s.vm.Pid())
}

// processMemory reads a process's memory from /proc/PID/smaps_rollup.
func processMemory(pid int) (backend.MemoryUse, error) {
	var use backend.MemoryUse
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return use, errdefs.Wrap(errdefs.Unavailable, err, "read the VM's memory")
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "Pss":
			use.Bytes = kb << 10
		case "Pss_Anon", "Pss_Shmem":
			use.Anon += kb << 10
		case "Pss_File":
			use.File = kb << 10
		case "SwapPss":
			use.Swap = kb << 10
		}
	}
	return use, nil
}

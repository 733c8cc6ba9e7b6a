package daemon

import (
	"cmp"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/atomicfile"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/store"
)

// Hibernating to disk (Hibernate, HibernateByLabel; Resume restores).
//
// The backend checkpoints the sandbox into <state>/checkpoints/<id>
// (backend.Checkpointer: CRIU's images and the writable layer, moved) and
// its processes are gone; the daemon then destroys the backend sandbox,
// which releases its cgroup, mounts and run directory, and records it
// HIBERNATED. The image layers stay held: the restore needs them, and
// image GC must not take them.
//
// The record of a hibernated sandbox must outlive a reboot, unlike a
// running one's (which dies with the machine): the store is synced after
// it is written, and a copy of it goes into the checkpoint directory,
// synced, from which adoptAll puts it back should the store's file of an
// ended boot have been torn (recoverHibernated).
//
// While HIBERNATED its lifetime keeps counting (the checkpoint holds the
// node's disk) and process timeouts do not: hibernation counts as paused
// time (paused_total_ms), as a pause does. Delete removes the checkpoint.

// checkpointDir is where the sandbox's checkpoint lives while it is
// HIBERNATED: <state>/checkpoints, or Config.CheckpointDir, which other
// nodes may share (restore.go).
func (m *Manager) checkpointDir(id string) string {
	return filepath.Join(m.checkpointRoot(), id)
}

// hibernatedRecord is the copy of the record in the checkpoint directory.
const hibernatedRecord = "record.pb"

// processesFile is the background processes' records as they were at the
// hibernation (a ListProcessesResponse), which ListProcesses returns
// while the sandbox is HIBERNATED.
const processesFile = "processes.pb"

// hibernatedProcesses is ListProcesses of a HIBERNATED sandbox.
func (m *Manager) hibernatedProcesses(id string) (*warrenv1.ListProcessesResponse, error) {
	out := &warrenv1.ListProcessesResponse{}
	b, err := os.ReadFile(filepath.Join(m.checkpointDir(id), processesFile))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil // a checkpoint of an older daemon
	}
	if err == nil {
		err = proto.Unmarshal(b, out)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "read the process list of hibernated sandbox "+id)
	}
	return out, nil
}

// Hibernate checkpoints a RUNNING or PAUSED sandbox to disk.
func (m *Manager) Hibernate(ctx context.Context, req *warrenv1.HibernateRequest) (_ *warrenv1.HibernateResponse, err error) {
	defer m.observe("Hibernate", &err)
	start := time.Now()
	s, v, err := m.live(ctx, opHibernate, req.GetId())
	if err != nil {
		return nil, err
	}
	if v.sb == nil {
		return nil, errdefs.Unavailablef("sandbox %s cannot be reached to hibernate it; retry later", req.GetId())
	}
	cp, ok := v.sb.(backend.Checkpointer)
	if !ok {
		return nil, errdefs.Unsupportedf("backend %s cannot hibernate sandboxes", v.backend)
	}
	if err := refuseHarness(s); err != nil {
		return nil, err
	}
	if !m.ownsCheckpoint(s.id) {
		// Sandbox ids are the caller's to choose: one of another node
		// may have its checkpoint in a shared directory.
		return nil, errdefs.Conflictf("the shared checkpoint directory holds a checkpoint of another sandbox %s, of node %s", s.id, m.checkpointOwner(s.id))
	}
	s.mu.Lock()
	if err := s.mayStartLocked(opHibernate); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	sb, prev := s.sb, s.st
	var limit *int64
	if mem := s.info.GetResources().GetMemoryBytes(); mem > 0 {
		limit = &mem
	}
	done := s.startPausingLocked()
	// CRIU kills the tree once it is saved: that exit is no death.
	watching := s.unwatch != nil && s.unwatch()
	s.unwatch = nil
	// The daemon's connections to the agent (a watcher per background
	// process) cannot be checkpointed: they are let go of, and the
	// records are rebuilt from the agent once it runs again (restored,
	// or left running by a failure).
	procs := len(s.procs)
	// What ListProcesses shows while it is hibernated (the agent that
	// knows them is in the checkpoint): kept with the checkpoint.
	listed := &warrenv1.ListProcessesResponse{}
	for id, pr := range s.procs {
		listed.Processes = append(listed.Processes, pr.info(nil))
		pr.detach()
		delete(s.procs, id)
	}
	s.exited = nil
	s.mu.Unlock()
	// Port connections into it are the daemon's sockets: cut.
	m.ports.CloseAll(s.id)
	slices.SortFunc(listed.Processes, func(a, b *warrenv1.ProcessInfo) int {
		return cmp.Compare(a.GetStartedAtUnixMs(), b.GetStartedAtUnixMs())
	})

	fail := func(err error) (*warrenv1.HibernateResponse, error) {
		_ = os.RemoveAll(m.checkpointDir(s.id))
		s.mu.Lock()
		s.endPausingLocked(done)
		s.mu.Unlock()
		if watching {
			m.watch(s, sb)
		}
		if procs > 0 {
			if prev == statePaused {
				// Frozen again: its agent answers on resume.
				s.mu.Lock()
				s.procsOnResume = true
				s.mu.Unlock()
			} else {
				m.adoptProcesses(s, sb)
			}
		}
		return nil, err
	}
	// A paused sandbox is thawed for CRIU, which freezes it its own way,
	// and frozen again should the checkpoint fail.
	p, _ := sb.(backend.Pauser)
	if prev == statePaused {
		if p == nil {
			return fail(errdefs.Unsupportedf("backend %s cannot thaw sandbox %s to hibernate it", v.backend, s.id))
		}
		if err := p.Resume(ctx, backend.ResumeOptions{MemoryBytes: limit}); err != nil {
			return fail(withCategory(err, errdefs.Internal, "thaw sandbox "+s.id+" to hibernate it"))
		}
	}
	var before backend.MemoryUse
	if ms, ok := sb.(backend.MemoryReporter); ok {
		before, _ = ms.MemoryUse()
	}
	// The log must be as durable as the state it describes.
	if err := m.traj.sync(s.id); err != nil {
		m.log.Warn("sync trajectory log before hibernating", "sandbox", s.id, "err", err)
	}
	dir := m.checkpointDir(s.id)
	_ = os.RemoveAll(dir) // what a crashed attempt left
	// The owner goes first: a node that shares the directory never takes
	// a checkpoint in progress for an orphan of its own.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(errdefs.Wrap(errdefs.Internal, err, "create checkpoints directory"))
	}
	if err := m.writeOwner(s.id); err != nil {
		return fail(errdefs.Wrap(errdefs.Internal, err, "write the checkpoint's owner"))
	}
	t0 := time.Now()
	cerr := cp.Checkpoint(ctx, dir)
	took := time.Since(t0)
	if cerr != nil {
		if prev == statePaused {
			if _, err := p.Pause(context.WithoutCancel(ctx), false); err != nil {
				m.log.Warn("freeze sandbox again after a failed hibernation", "sandbox", s.id, "err", err)
			}
		}
		return fail(withCategory(cerr, errdefs.Internal, "hibernate sandbox "+s.id))
	}
	if b, err := proto.Marshal(listed); err == nil {
		if err := os.WriteFile(filepath.Join(dir, processesFile), b, 0o600); err != nil {
			m.log.Warn("keep the process list in the checkpoint", "sandbox", s.id, "err", err)
		}
	}
	if m.sharedCheckpoints() {
		// For the node that may restore it: the log is synced above.
		if err := copyFile(m.traj.path(s.id), filepath.Join(dir, trajFile)); err != nil {
			m.log.Warn("keep the trajectory log in the checkpoint", "sandbox", s.id, "err", err)
		}
	}
	size := dirBytes(dir)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
	if err := sb.Destroy(dctx); err != nil {
		m.log.Warn("release resources of hibernated sandbox", "sandbox", s.id, "err", err)
	}
	cancel()

	s.mu.Lock()
	s.endPausingLocked(done)
	if s.st != prev {
		// Deleted meanwhile (the deletion waited for us): it removes
		// the checkpoint.
		err := s.allowLocked(opHibernate)
		s.mu.Unlock()
		return nil, err
	}
	now := time.Now()
	if prev == statePaused {
		// The pause so far counts; the hibernation counts from now.
		s.info.PausedTotalMs = s.pausedTotalLocked().Milliseconds()
	}
	s.info.PausedAtUnixMs = now.UnixMilli()
	s.info.HibernatedAtUnixMs = now.UnixMilli()
	m.stopLifetimeLocked(s) // nothing to undo: the sandbox is on disk either way
	s.info.CheckpointBytes = uint64(size)
	_ = m.setState(s, stateHibernated)
	s.sb, s.fs, s.backendState = nil, nil, nil
	// Its background processes are saved with it; their records are
	// rebuilt from the agent once it is restored.
	s.procsOnResume = true
	perr := m.persistDurable(s)
	out := &warrenv1.HibernateResponse{
		Sandbox:      cloneSandbox(s.info),
		CheckpointUs: took.Microseconds(),
		TotalUs:      time.Since(start).Microseconds(),
		Bytes:        uint64(size),
		Before:       memoryProto(before),
	}
	s.mu.Unlock()
	if perr != nil {
		// The checkpoint is on disk and the sandbox is gone from the
		// node: the record in the checkpoint directory is what a
		// restart finds, if the store's is not.
		m.log.Error("persist hibernated state", "sandbox", s.id, "err", perr)
	}
	// CRIU does not sync its images: they go to disk in the background,
	// so that the call does not wait for ~the sandbox's memory in writes.
	// A machine crash before that loses them, and the restore then fails
	// with CRIU's error (the record says HIBERNATED; Delete removes it).
	m.spawn(func() {
		f, err := os.Open(dir)
		if err != nil {
			return
		}
		defer f.Close()
		if err := unix.Syncfs(int(f.Fd())); err != nil {
			m.log.Warn("sync checkpoint", "sandbox", s.id, "err", err)
		}
	})
	m.metrics.ObserveHibernate(took, size)
	m.log.Debug("sandbox hibernated", "sandbox", s.id, "checkpoint", took, "bytes", size, "took", time.Since(start))
	return out, nil
}

// refuseHarness refuses to checkpoint a harness: its processes hold
// connections to its route, the daemon's end of which no checkpoint can
// hold.
func refuseHarness(s *sandbox) error {
	if s.isHarness() {
		return errdefs.Unsupportedf("sandbox %s is a harness: its API route's connections cannot be checkpointed, so it cannot be hibernated or forked", s.id)
	}
	return nil
}

// persistDurable writes the record, syncs the store, and keeps a synced
// copy in the checkpoint directory; s.mu held.
func (m *Manager) persistDurable(s *sandbox) error {
	rec := m.recordOf(s)
	if err := m.store.Put(rec); err != nil {
		return err
	}
	if err := m.store.Sync(); err != nil {
		return err
	}
	enc, err := store.Encode(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(m.checkpointDir(s.id), hibernatedRecord), ".record-", enc, 0o600)
}

// discardCheckpoint removes sandbox id's checkpoint in the background: it
// is renamed aside at once (the id may hibernate again), and its images,
// as large as the sandbox's memory and perhaps still being written back
// (the hibernation's sync), are unlinked off the caller's path: that
// waited for the writeback, ~150 ms of a restore of 256 MiB here. What a
// crash leaves aside, recoverHibernated removes (no record names it).
// dropCheckpoint lets go of sandbox s's checkpoint: what it holds in the
// backend (always: another node may have taken it, the backend's hold
// is this node's), and its files (if this node owns them).
func (m *Manager) dropCheckpoint(s *sandbox) {
	if h, ok := s.b.(backend.CheckpointHolder); ok {
		h.ReleaseCheckpoint(m.checkpointDir(s.id))
	}
	m.discardCheckpoint(s.id)
}

func (m *Manager) discardCheckpoint(id string) {
	if !m.ownsCheckpoint(id) {
		return // restored on another node, which removes it
	}
	dir := m.checkpointDir(id)
	aside := filepath.Join(filepath.Dir(dir), ".gone-"+id+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Rename(dir, aside); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("remove checkpoint", "sandbox", id, "err", err)
			_ = os.RemoveAll(dir)
		}
		return
	}
	if !m.spawn(func() {
		if err := os.RemoveAll(aside); err != nil {
			m.log.Warn("remove checkpoint", "sandbox", id, "err", err)
		}
	}) {
		_ = os.RemoveAll(aside)
	}
}

// recoverHibernated puts back the records of hibernated sandboxes that
// the store lost (a file of an ended boot torn past salvage), from the
// copies in their checkpoint directories, and removes checkpoint
// directories no record names (a crash between the checkpoint and its
// record, or a delete whose removal failed).
func (m *Manager) recoverHibernated(recs []store.Record) []store.Record {
	root := m.checkpointRoot()
	ents, err := os.ReadDir(root)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("read checkpoints directory", "err", err)
		}
		return recs
	}
	have := map[string]store.Record{}
	for _, r := range recs {
		have[r.ID] = r
	}
	for _, e := range ents {
		id := e.Name()
		if strings.HasPrefix(id, ".") {
			// Not a sandbox's: bases, moved sandboxes, the container
			// backend's image links (.lazy). Sandbox ids never start
			// with a dot.
			continue
		}
		if r, ok := have[id]; ok && r.State() == stateHibernated {
			continue
		}
		dir := filepath.Join(root, id)
		if m.sharedCheckpoints() {
			// Only this node's: another's, in progress, hibernated or
			// being removed, is that node's to keep or remove.
			b, err := os.ReadFile(filepath.Join(dir, ownerFile))
			if err != nil || strings.TrimSpace(string(b)) != m.cfg.NodeName {
				continue
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, hibernatedRecord))
		if _, known := have[id]; err == nil && !known {
			if rec, derr := store.Decode(b); derr == nil && rec.ID == id {
				if perr := m.store.Put(rec); perr == nil {
					m.log.Warn("hibernated sandbox's record recovered from its checkpoint", "sandbox", id)
					recs = append(recs, rec)
					continue
				}
			}
		}
		// A checkpoint no record names as HIBERNATED is not restorable.
		if rerr := os.RemoveAll(dir); rerr != nil {
			m.log.Warn("remove orphaned checkpoint", "sandbox", id, "err", rerr)
		}
	}
	return recs
}

// restoreHibernated is Resume of a HIBERNATED sandbox: the backend
// restores it from its checkpoint with the spec it was created with.
func (m *Manager) restoreHibernated(ctx context.Context, s *sandbox, start time.Time, lazy bool) (*warrenv1.ResumeResponse, error) {
	s.mu.Lock()
	if err := s.mayStartLocked(opResume); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if s.b == nil {
		s.mu.Unlock()
		return nil, errdefs.Unavailablef("sandbox %s: backend %s is not configured on this daemon", s.id, s.backendName)
	}
	info := cloneSandbox(s.info)
	digests, bases := s.imageLayers, s.bases
	done := s.startPausingLocked()
	s.mu.Unlock()
	// Back in memory, it counts against the node's admission from now
	// until it is RUNNING (resident then) or the restore failed.
	m.mu.Lock()
	err := m.admitLocked(s, info.GetResources())
	if err == nil {
		s.mu.Lock()
		s.admitted = true
		s.mu.Unlock()
	}
	m.mu.Unlock()
	end := func() {
		s.mu.Lock()
		s.admitted = false
		s.endPausingLocked(done)
		s.mu.Unlock()
	}
	if err != nil {
		end()
		return nil, err
	}
	if m.sharedCheckpoints() {
		// One node restores a checkpoint, and only its owner.
		unclaim, err := m.claimCheckpoint(s.id)
		if err != nil {
			end()
			return nil, err
		}
		defer unclaim()
		if !m.ownsCheckpoint(s.id) {
			end()
			to, _ := m.movedAway(s)
			return nil, errdefs.NotFoundf("sandbox %s was restored on node %s", s.id, to)
		}
	}

	m.imgMu.RLock()
	img := image.Image{Name: info.GetImage(), Layers: digests}
	layers, release, err := m.images.LayerRefs(ctx, img, mountsLayers(s.b))
	m.imgMu.RUnlock()
	if err != nil {
		end()
		return nil, withCategory(err, errdefs.Internal, "resolve the layers of hibernated sandbox "+s.id)
	}
	spec, err := m.restoreSpec(s.id, info, layers, bases, s.id)
	if err != nil {
		release()
		end()
		return nil, err
	}
	spec.LazyPages = lazy
	if err := m.settleBase(s.id, bases); err != nil {
		release()
		end()
		return nil, err
	}
	t0 := time.Now()
	sb, err := s.b.Create(ctx, spec)
	took := time.Since(t0)
	if err != nil {
		release()
		end()
		return nil, withCategory(err, errdefs.Internal, "restore hibernated sandbox "+s.id)
	}

	s.mu.Lock()
	s.admitted = false
	s.endPausingLocked(done)
	if s.st != stateHibernated {
		err := s.allowLocked(opResume)
		s.mu.Unlock()
		release()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
		_ = sb.Destroy(dctx)
		cancel()
		return nil, err
	}
	hibernated := time.Since(time.UnixMilli(s.info.GetHibernatedAtUnixMs()))
	s.info.PausedTotalMs = s.pausedTotalLocked().Milliseconds()
	s.info.PausedAtUnixMs, s.info.HibernatedAtUnixMs, s.info.CheckpointBytes = 0, 0, 0
	m.restartLifetimeLocked(s)
	old := s.release
	s.sb, s.fs, s.backendState, s.release = sb, fsFor(sb), sb.State(), release
	s.info.NetworkAddress = networkAddress(sb)
	m.followRestoredNetwork(ctx, s)
	_ = m.setState(s, stateRunning)
	if err := m.persist(s); err != nil {
		m.log.Warn("persist running state after restore", "sandbox", s.id, "err", err)
	}
	s.procsOnResume = false
	out := &warrenv1.ResumeResponse{Sandbox: cloneSandbox(s.info), RestoreUs: took.Microseconds(), PausedMs: hibernated.Milliseconds(), Restored: true}
	out.LazyPages, out.EagerReason = memoryRestore(sb, lazy)
	s.mu.Unlock()
	if old != nil {
		old()
	}
	m.dropCheckpoint(s)
	m.watch(s, sb)
	m.adoptProcesses(s, sb)
	m.metrics.ObserveRestore(time.Since(start), out.GetLazyPages())
	m.log.Debug("sandbox restored", "sandbox", s.id, "restore", took, "hibernated", hibernated)
	return out, nil
}

// memoryRestore is how a restore brought sb's memory back: lazily, or
// eagerly and, where lazily was asked, why (backend.MemoryRestorer).
func memoryRestore(sb backend.Sandbox, asked bool) (lazy bool, eagerWhy string) {
	if r, ok := sb.(backend.MemoryRestorer); ok {
		return r.MemoryRestore()
	}
	if asked {
		return false, "the backend restores memory whole"
	}
	return false, ""
}

// restoreSpec is the backend spec that restores sandbox id, whose record
// is info, from the checkpoint of sandbox from (id itself, or a fork's
// source): the layers, limits and settings it was created with, its
// bases above the image's layers.
func (m *Manager) restoreSpec(id string, info *warrenv1.Sandbox, layers []image.LayerRef, bases []string, from string) (backend.Spec, error) {
	rl, err := rlimitsOf(info.GetRlimits())
	if err != nil {
		return backend.Spec{}, withCategory(err, errdefs.Internal, "the record of sandbox "+from)
	}
	pol, err := networkPolicy("network", info.GetNetwork())
	if err != nil {
		return backend.Spec{}, withCategory(err, errdefs.Internal, "the record of sandbox "+from)
	}
	res := info.GetResources()
	return backend.Spec{
		ID:          id,
		Hostname:    info.GetHostname(),
		Layers:      append(baseLayers(bases), specLayers(layers)...),
		CPUMillis:   res.GetCpuMillis(),
		MemoryBytes: res.GetMemoryBytes(),
		PidsMax:     res.GetPidsMax(),
		DiskBytes:   res.GetDiskBytes(),
		Env:         envList(info.GetEnv()),
		Workdir:     info.GetWorkdir(),
		Rlimits:     rl,
		Network:     pol,
		AllowSetuid: info.GetAllowSetuid(),
		UserNS:      info.GetUserNamespace(),
		Restore:     m.checkpointDir(from),
		QoS:         recordedQoS(info),
	}, nil
}

// followRestoredNetwork points the resolv.conf of a restored sandbox
// (or fork) at its resolver where its address changed (a fork's, or one
// whose address another sandbox took meanwhile); s.mu held.
func (m *Manager) followRestoredNetwork(ctx context.Context, s *sandbox) {
	rw := m.followNetwork(context.WithoutCancel(ctx), s.id, s.sb, s.fs, s.info.GetKeepEtc(), s.etcNS)
	if rw.done {
		s.etcNS = rw.to
	}
}

// HibernateByLabel hibernates the RUNNING and PAUSED sandboxes matching
// the labels.
func (m *Manager) HibernateByLabel(ctx context.Context, req *warrenv1.HibernateByLabelRequest, send func(*warrenv1.ByLabelEvent) error) (err error) {
	defer m.observe("HibernateByLabel", &err)
	return m.byLabel(ctx, req.GetLabels(), req.GetParallelism(), []state{stateRunning, statePaused}, send, func(ctx context.Context, id string, ev *warrenv1.ByLabelEvent) error {
		res, err := m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: id})
		ev.Hibernated = res
		return err
	})
}

// dirBytes is the disk space of the files under dir: their allocated
// blocks, not their apparent sizes, as a VM's sparse disk copy (256 MiB
// apparent, 16 written) takes only what was written.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					n += st.Blocks * 512
				} else {
					n += fi.Size()
				}
			}
		}
		return nil
	})
	return n
}

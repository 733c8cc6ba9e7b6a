package daemon

import (
	"context"
	"maps"
	"net/netip"
	"path"
	"slices"
	"sync"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/caller"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/listpage"
	"github.com/warrenrl/warren/internal/metrics"
	"github.com/warrenrl/warren/internal/store"
)

const (
	// destroyTimeout bounds a backend Destroy that no caller waits for
	// (timeouts, dead sandboxes) or whose caller went away.
	destroyTimeout = 2 * time.Minute
	// adoptWorkers is how many sandboxes New adopts in parallel, and how
	// many adopted sandboxes' processes are listed in parallel after it.
	// Adoption waits on /proc reads and agent round trips more than on
	// CPU (the daemon used 40% of a core adopting 3,200 with 8 workers on
	// 2 cores), so more workers than cores.
	adoptWorkers = 32
	// retryDestroy is when a failed deletion of an expired sandbox is
	// tried again.
	retryDestroy = time.Minute
	// A LOST sandbox is adopted again after 1 s, doubling to at most a
	// minute: a transient failure (fds, memory) passes in seconds, and a
	// minute bounds the wasted work of one that does not.
	readoptMin = time.Second
	readoptMax = time.Minute
)

// userNSIDs is how many ids a sandbox's user namespace maps (the
// container backend's IDsPerSandbox).
const userNSIDs = 1 << 16

// userNSFits says whether an image of these layers looks as it is from
// inside a user namespace: every file's owner below userNSIDs (a higher
// one would show as the overflow id, and could not be changed). Layers
// imported before the store recorded their highest id are taken to fit.
func userNSFits(layers []image.LayerRef) error {
	for _, l := range layers {
		if l.MaxID != nil && *l.MaxID >= userNSIDs {
			return errdefs.Invalidf("layer %s has files owned by id %d, above the %d ids a sandbox's user namespace maps: create the sandbox without one (user_namespace false)", l.Digest, *l.MaxID, userNSIDs-1)
		}
	}
	return nil
}

// layerRecords reads the records of layers that are not taken (the
// fncall backend's key, before any refs are), as LayerRefs carries them.
func (m *Manager) layerRecords(digests []string) ([]image.LayerRef, error) {
	out := make([]image.LayerRef, len(digests))
	for i, d := range digests {
		meta, err := m.images.LayerMeta(d)
		if err != nil {
			return nil, err
		}
		out[i] = image.LayerRef{Digest: d, MaxID: meta.MaxID}
	}
	return out, nil
}

// Create validates the request, resolves the image, has the backend create
// the sandbox and persists it as RUNNING.
// On failure everything done is rolled back.
func (m *Manager) Create(ctx context.Context, req *warrenv1.CreateRequest) (_ *warrenv1.Sandbox, err error) {
	if req.GetClaimStep() != warrenv1.ClaimStep_CLAIM_STEP_CREATE {
		return m.claimStep(req) // a gateway's retry protocol: makes nothing
	}
	defer m.observe("Create", &err)
	start := time.Now()
	p, err := m.validateCreate(req)
	if err != nil {
		return nil, err
	}
	if err := m.refuseOnLowDisk(); err != nil {
		return nil, err
	}
	hp, err := m.validateHarness(ctx, req, &p)
	if err != nil {
		return nil, err
	}
	parent, isChild := caller.Harness(ctx)
	var parentInfo *warrenv1.Sandbox
	if isChild {
		if parentInfo, err = m.parentInfo(parent); err != nil {
			return nil, err
		}
		userNS := m.cfg.UserNSDefault
		if req.UserNamespace != nil {
			userNS = req.GetUserNamespace()
		}
		if err := checkChild(parentInfo, p.network, req.GetAllowSetuid(), userNS); err != nil {
			return nil, err
		}
	}
	b := m.cfg.Backends[p.backend]
	info := &warrenv1.Sandbox{
		Id:              p.id,
		Image:           p.image,
		Backend:         p.backend,
		State:           stateCreating,
		Resources:       p.resources,
		Env:             maps.Clone(p.env),
		Workdir:         p.workdir,
		Labels:          maps.Clone(p.labels),
		CreatedAtUnixMs: start.UnixMilli(),
		Hostname:        p.hostname,
		Layers:          slices.Clone(p.layers),
		KeepEtc:         req.GetKeepEtc(),
		AllowSetuid:     req.GetAllowSetuid(),
		NoTrajectory:    req.GetNoTrajectory(),
		UserNamespace:   m.cfg.UserNSDefault,
		Rlimits:         rlimitProtos(p.rlimits),
		Network:         networkProto(p.network),
		Parent:          parent,
		Node:            m.cfg.NodeName,
		IdempotencyKey:  req.GetIdempotencyKey(),
		KeepWhilePaused: req.GetKeepWhilePaused(),
	}
	setQoSInfo(info, p.qos)
	if hp != nil {
		info.Harness = &warrenv1.HarnessOptions{MaxChildren: hp.maxChildren}
	}
	if req.UserNamespace != nil {
		info.UserNamespace = req.GetUserNamespace()
	}
	imageWorkdir := false
	s := &sandbox{
		backendName: p.backend,
		b:           b,
		ready:       make(chan struct{}),
		st:          stateCreating,
		info:        info,
		parent:      parent,
		harness:     hp != nil,
	}
	// A new sandbox's counters start at zero: every rise is an event.
	s.seen.known = true

	// Reserve the id.
	m.mu.Lock()
	for {
		if m.closed {
			m.mu.Unlock()
			return nil, errdefs.Unavailablef("daemon is shutting down")
		}
		if p.id == "" {
			for p.id = m.newID(); m.sandboxes[p.id] != nil; p.id = m.newID() {
			}
			break
		}
		old := m.sandboxes[p.id]
		if old == nil {
			if err := m.heldLocked(p.id, req.GetClaim()); err != nil {
				m.mu.Unlock()
				return nil, err
			}
			break
		}
		m.mu.Unlock()
		if key := req.GetIdempotencyKey(); key == "" || old.createKey() != key {
			return nil, errdefs.AlreadyExistsf("sandbox %s already exists", p.id)
		}
		// A create sent again: the answer is the sandbox the first made,
		// once made; if the first failed, this one tries afresh.
		if sb, err := m.awaitCreated(ctx, old, p.image); sb != nil || err != nil {
			return sb, err
		}
		m.mu.Lock()
	}
	if isChild {
		if err := m.reserveChildLocked(parent); err != nil {
			m.mu.Unlock()
			return nil, err
		}
	}
	if err := m.admitLocked(s, p.resources); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	s.id, info.Id = p.id, p.id
	if info.Hostname == "" {
		info.Hostname = etcfiles.HostnameFor(p.id)
	}
	m.sandboxes[p.id] = s
	m.mu.Unlock()
	m.metrics.SandboxState("", stateLabel(stateCreating))

	var cl cleanup.Cleanup
	defer func() {
		if err != nil {
			if cerr := cl.Clean(); cerr != nil {
				m.log.Warn("rollback of failed create incomplete", "sandbox", p.id, "err", cerr)
			}
		}
	}()
	cl.Add(func() error {
		m.forget(s)
		// A kernel source may have recorded an event of the sandbox
		// while it was being created.
		m.events.Forget(s.id)
		return nil
	})

	// Resolve the image and the named layers on it, and hold the layers
	// for the sandbox's life.
	m.imgMu.RLock()
	var layers []image.LayerRef
	var release func()
	var cfg *image.Config
	rec, digests, err := m.images.Resolve(p.image, p.layers)
	if err == nil {
		img := image.Image{Name: p.image, Layers: digests}
		layers, release, err = m.images.LayerRefs(ctx, img, mountsLayers(b))
	}
	if err == nil {
		cfg = rec.Config
		// Before the lock goes: RemoveImage and RemoveLayer see the
		// sandbox as a user from here on.
		s.mu.Lock()
		s.imageLayers = digests
		s.mu.Unlock()
	}
	m.imgMu.RUnlock()
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "resolve image "+p.image)
	}
	if info.UserNamespace {
		if err := userNSFits(layers); err != nil {
			if req.UserNamespace != nil || parentInfo.GetUserNamespace() {
				release()
				return nil, err
			}
			// The node's default yields to an image it does not fit.
			info.UserNamespace = false
		}
	}
	cl.Add(func() error {
		release()
		return nil
	})
	// The image's config gives the defaults of env and workdir.
	if cfg != nil {
		env := imageEnv(cfg, p.env)
		if err := validateEnv(env); err != nil {
			return nil, errdefs.New(errdefs.Invalid, "env of image %s with the request's: %w", p.image, err)
		}
		p.env = env
		if p.workdir == "" && validateAbsPath("workdir", cfg.WorkingDir) == nil {
			p.workdir = path.Clean(cfg.WorkingDir)
			imageWorkdir = true
		}
		// The image's user is the default of execs, as `docker run` does;
		// one that is malformed is ignored rather than failing the create.
		if p.user == "" && checkUserSpec(cfg.User) == nil {
			p.user = cfg.User
		}
	}
	s.mu.Lock()
	info.Env = maps.Clone(p.env)
	info.Workdir = p.workdir
	info.User = p.user
	s.mu.Unlock()

	// No record is written before the backend call: a crash from here
	// on leaves resources of an id the store does not know, and New's
	// Backend.Sweep removes exactly those. (A CREATING record would cost
	// every create a commit, two fdatasyncs, for no extra safety; records
	// of that state from older daemons are still cleaned up.)

	sb, err := b.Create(ctx, backend.Spec{
		ID:          p.id,
		Hostname:    info.Hostname,
		Layers:      specLayers(layers),
		CPUMillis:   p.resources.CpuMillis,
		MemoryBytes: p.resources.MemoryBytes,
		PidsMax:     p.resources.PidsMax,
		DiskBytes:   p.resources.DiskBytes,
		Env:         envList(p.env),
		Workdir:     p.workdir,
		Etc:         etcFilesOf(info, netip.Addr{}),
		Rlimits:     p.rlimits,
		Network:     p.network,
		AllowSetuid: info.AllowSetuid,
		UserNS:      info.UserNamespace,
		QoS:         p.qos,
	})
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "create sandbox "+p.id)
	}
	cl.Add(func() error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
		defer cancel()
		return sb.Destroy(dctx)
	})
	// A client that gave up (cancelled, timed out, disconnected) will not
	// learn the id: do not leave it a sandbox it cannot delete.
	if err := ctx.Err(); err != nil {
		return nil, ctxError(ctx, "create sandbox "+p.id)
	}
	if hp != nil {
		if err := m.cfg.Router.OpenRoute(p.id, hp.socket); err != nil {
			return nil, withCategory(err, errdefs.Internal, "open the API route of harness "+p.id)
		}
		cl.Add(func() error {
			m.cfg.Router.CloseRoute(p.id)
			return nil
		})
	}

	fs := fsFor(sb)
	if fs != nil {
		if imageWorkdir {
			// As container runtimes do: the image's working directory
			// exists in its sandboxes.
			if err := fs.Mkdir(ctx, p.workdir, 0o755, true); err != nil {
				m.log.Warn("create the image's working directory", "sandbox", p.id, "workdir", p.workdir, "err", err)
			}
		}
	}
	s.mu.Lock()
	s.sb, s.fs, s.backendState, s.release = sb, fs, sb.State(), release
	s.etcNS = nameserverOf(sb, info.GetKeepEtc())
	info.NetworkAddress = networkAddress(sb)
	if d, ok := sb.(backend.Display); ok {
		info.Vnc = d.VNC()
	}
	if im, ok := sb.(backend.IDMapped); ok {
		base, _, mapped := im.IDMap()
		info.UserNamespace, info.UserIdBase = mapped, base
	}
	expires := time.Now().Add(p.timeout)
	info.ExpiresAtUnixMs = expires.UnixMilli()
	// The record says RUNNING; the sandbox is RUNNING once it is written.
	info.State = stateRunning
	if err = m.persist(s); err != nil {
		s.sb, s.fs, s.backendState, s.release, s.etcNS = nil, nil, nil, nil, netip.Addr{}
		info.State = stateCreating
		info.ExpiresAtUnixMs = 0
		s.mu.Unlock()
		return nil, err
	}
	_ = m.setState(s, stateRunning)
	m.armTimerLocked(s, expires)
	out := cloneSandbox(info)
	close(s.ready)
	s.mu.Unlock()
	cl.Release()

	m.watch(s, sb)
	m.metrics.ObserveCreate(time.Since(start).Seconds())
	m.log.Debug("sandbox created", "sandbox", p.id, "image", p.image, "backend", p.backend, "took", time.Since(start))
	return out, nil
}

// forget removes a sandbox from the map and wakes whoever waits on it.
func (m *Manager) forget(s *sandbox) {
	m.mu.Lock()
	if m.sandboxes[s.id] == s {
		delete(m.sandboxes, s.id)
	}
	m.mu.Unlock()
	s.mu.Lock()
	if s.st != stateGone {
		_ = m.setState(s, stateGone)
		if s.timer != nil {
			s.timer.Stop()
		}
		if s.unwatch != nil {
			s.unwatch()
		}
		select {
		case <-s.ready:
		default:
			close(s.ready)
		}
	}
	s.mu.Unlock()
}

// createKey is the idempotency key s was created with.
func (s *sandbox) createKey() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info.GetIdempotencyKey()
}

// awaitCreated waits until the create of s, found by a create with the
// same idempotency key, has ended, and returns s as it is then; nil when
// that create failed (s is gone). A key sent with another image is a
// mistake of the client's: Conflict.
func (m *Manager) awaitCreated(ctx context.Context, s *sandbox, image string) (*warrenv1.Sandbox, error) {
	s.mu.Lock()
	if got := s.info.GetImage(); got != image {
		s.mu.Unlock()
		return nil, errdefs.Conflictf("idempotency key %q already made sandbox %s of image %s, not %s", s.info.GetIdempotencyKey(), s.id, got, image)
	}
	ready := s.ready
	s.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ctxError(ctx, "wait for the creation of sandbox "+s.id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == stateGone {
		return nil, nil
	}
	return cloneSandbox(s.info), nil
}

// Get returns one sandbox.
func (m *Manager) Get(ctx context.Context, req *warrenv1.GetRequest) (_ *warrenv1.Sandbox, err error) {
	defer m.observe("Get", &err)
	s, err := m.find(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allowLocked(opInspect); err != nil {
		return nil, err
	}
	return cloneSandbox(s.info), nil
}

// List returns the sandboxes whose labels include every requested label,
// sorted by creation time, then id.
func (m *Manager) List(ctx context.Context, req *warrenv1.ListRequest) (_ *warrenv1.ListResponse, err error) {
	defer m.observe("List", &err)
	all := m.snapshot()
	want := req.GetLabels()
	parent, scoped := caller.Harness(ctx)
	resp := &warrenv1.ListResponse{Sandboxes: make([]*warrenv1.Sandbox, 0, len(all))}
	for _, s := range all {
		if scoped && s.parent != parent {
			continue // a harness sees its own sandboxes only
		}
		if _, moved := m.movedAway(s); moved {
			continue
		}
		s.mu.Lock()
		if permits(s.st, opInspect) && labelsMatch(s.info.GetLabels(), want) {
			resp.Sandboxes = append(resp.Sandboxes, cloneSandbox(s.info))
		}
		s.mu.Unlock()
	}
	listpage.Sort(resp.Sandboxes)
	return listpage.Cut(resp.Sandboxes, req)
}

// snapshot returns the sandboxes of the manager at this moment, in no
// particular order.
func (m *Manager) snapshot() []*sandbox {
	m.mu.RLock()
	defer m.mu.RUnlock()
	all := make([]*sandbox, 0, len(m.sandboxes))
	for _, s := range m.sandboxes {
		all = append(all, s)
	}
	return all
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// Delete destroys a sandbox and forgets it. Deleting a sandbox that is
// being deleted waits for that deletion; one being created is deleted once
// its creation finished.
func (m *Manager) Delete(ctx context.Context, req *warrenv1.DeleteRequest) (_ *warrenv1.DeleteResponse, err error) {
	defer m.observe("Delete", &err)
	s, err := m.find(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	if err := m.remove(ctx, s, metrics.ReasonUser); err != nil {
		return nil, err
	}
	return &warrenv1.DeleteResponse{}, nil
}

// remove deletes a sandbox: DELETING, kill its processes, Destroy, drop the
// record and the layers. reason is counted when the sandbox was alive.
// A sandbox being created is deleted once its creation finished; one
// being deleted is waited for.
func (m *Manager) remove(ctx context.Context, s *sandbox, reason string) error {
	s.mu.Lock()
	if joined, err := s.settleLocked(ctx); joined {
		return err
	}
	if err := s.allowLocked(opDelete); err != nil {
		s.mu.Unlock()
		return err
	}
	prev := s.st
	done := make(chan struct{})
	s.deleting, s.deleteErr = done, nil
	_ = m.setState(s, stateDeleting)
	if s.timer != nil {
		s.timer.Stop()
	}
	if err := m.persist(s); err != nil {
		m.log.Warn("persist deleting state", "sandbox", s.id, "err", err)
	}
	sb := s.sb
	// Without a handle but with resources held (LOST, or a state this
	// daemon does not drive): reach the sandbox to destroy it.
	reach := sb == nil && s.b != nil && (prev == stateLost || !servedHere(prev))
	blob := s.backendState
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	commit := s.commit
	pausing := s.pausing
	s.mu.Unlock()
	m.ports.CloseAll(s.id)

	if s.isHarness() {
		// First the route, so that the harness makes no more calls, then
		// its children (none is added: it is DELETING), then itself.
		m.closeRoute(s)
		// Not cut short by the caller going away: a child left behind
		// would wait for the next daemon's orphan sweep.
		m.removeChildren(context.WithoutCancel(ctx), s.id, reason)
	}

	// A commit in progress holds the sandbox frozen, and frozen processes
	// cannot die: stop it first. A pause or resume in progress is waited
	// for (bounded by the freeze timeout): the destroy then finds the
	// group frozen or thawed, not half-way.
	if commit != nil {
		commit.cancel()
		<-commit.done
	}
	if pausing != nil {
		<-pausing
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
	var err error
	if reach {
		sb, err = m.reachToDelete(dctx, s, blob)
	}
	if err == nil && sb != nil {
		err = sb.Destroy(dctx)
	}
	cancel()
	for _, p := range procs {
		p.gone()
	}
	if err != nil {
		m.failedRemove(s, sb, prev, withCategory(err, errdefs.Internal, "destroy sandbox "+s.id))
		close(done)
		return s.deleteErrOf()
	}
	if derr := m.store.Delete(s.id); derr != nil {
		// The record comes back after a restart; Delete forgets it.
		m.log.Warn("delete record", "sandbox", s.id, "err", derr)
	}
	// A hibernated sandbox's checkpoint (or one a hibernation racing
	// this delete made): the next daemon removes one left here, since no
	// record names it.
	m.dropCheckpoint(s)
	s.releaseLayers()
	m.idem.dropSandbox(s.id)
	m.forget(s)
	m.events.Forget(s.id)
	if reason != metrics.ReasonMoved { // it stands on them on its new node
		m.dropBases(s.id, s.bases)
	}
	close(done)
	if prev == stateRunning || prev == statePaused || prev == stateHibernated {
		s.mu.Lock()
		created := s.info.GetCreatedAtUnixMs()
		s.mu.Unlock()
		m.ended(reason, created)
	}
	// After forget: a recorded call racing the delete then finds the
	// sandbox gone and cannot make the file again (trajLogs.get).
	if terr := m.traj.remove(s.id); terr != nil {
		m.log.Warn("remove trajectory log", "sandbox", s.id, "err", terr)
	}
	m.log.Debug("sandbox deleted", "sandbox", s.id, "reason", reason)
	return nil
}

// reachToDelete adopts a sandbox without a handle so that it can be
// destroyed: nil when it is proven gone (Adopt released what was left),
// Unavailable while it cannot be reached. A handle that a concurrent
// readopt found meanwhile is used instead.
func (m *Manager) reachToDelete(ctx context.Context, s *sandbox, blob []byte) (backend.Sandbox, error) {
	s.reach.Lock()
	defer s.reach.Unlock()
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb != nil {
		return sb, nil
	}
	sb, err := s.b.Adopt(ctx, s.id, blob)
	switch {
	case errdefs.CategoryOf(err) == errdefs.NotFound:
		return nil, nil
	case err != nil:
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox "+s.id+" cannot be reached to delete it; retry later")
	}
	return sb, nil
}

// settleLocked waits while the sandbox is CREATING or DELETING; s.mu
// held, released while it waits. joined: the wait ended without s.mu
// (a deletion in progress ended, and err is its outcome, or ctx ended).
func (s *sandbox) settleLocked(ctx context.Context) (joined bool, err error) {
	for s.st == stateCreating || s.st == stateDeleting {
		wait, what := s.ready, "creation"
		if s.st == stateDeleting {
			wait, what = s.deleting, "deletion"
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return true, ctxError(ctx, "wait for "+what+" of sandbox "+s.id)
		}
		if what == "deletion" {
			return true, s.deleteErrOf()
		}
		s.mu.Lock()
	}
	return false, nil
}

func (s *sandbox) deleteErrOf() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deleteErr
}

// failedRemove puts a sandbox whose Destroy failed back in the state it
// had, or STOPPED when its init exited meanwhile (a dead sandbox must not
// show as RUNNING), and retries an expired one later.
func (m *Manager) failedRemove(s *sandbox, sb backend.Sandbox, prev state, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	back := prev
	if prev != stateStopped && sb != nil && sb.Exited().Err() != nil {
		back = stateStopped
		s.info.DeadReason = "init exited in a delete that failed: " + err.Error()
		s.fs = nil
		if prev == stateRunning || prev == statePaused {
			m.ended(metrics.ReasonDead, s.info.GetCreatedAtUnixMs())
		}
	}
	_ = m.setState(s, back)
	s.deleting, s.deleteErr = nil, err
	if s.isHarness() && (back == stateRunning || back == statePaused) {
		m.openRoute(s) // it runs on: so does its route
	}
	if perr := m.persist(s); perr != nil {
		m.log.Warn("persist state after failed delete", "sandbox", s.id, "err", perr)
	}
	// Keep the lifetime; an expired sandbox is retried later, not in a
	// tight loop. States without a timer get none.
	if permits(back, opExtend) {
		m.armTimerLocked(s, later(time.UnixMilli(s.info.GetExpiresAtUnixMs()), time.Now().Add(retryDestroy)))
	}
}

// ExtendTimeout sets a sandbox's deadline to now + timeout_seconds (0: the
// node default).
func (m *Manager) ExtendTimeout(ctx context.Context, req *warrenv1.ExtendTimeoutRequest) (_ *warrenv1.Sandbox, err error) {
	defer m.observe("ExtendTimeout", &err)
	s, err := m.find(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	d, err := m.lifetime(req.GetTimeoutSeconds())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allowLocked(opExtend); err != nil {
		return nil, err
	}
	if s.lifetimeStoppedLocked() {
		// Its lifetime is stopped: d is what it gets once it runs again.
		old := s.info.GetLifetimeLeftMs()
		s.info.LifetimeLeftMs = d.Milliseconds()
		if err := m.persist(s); err != nil {
			s.info.LifetimeLeftMs = old
			return nil, err
		}
		return cloneSandbox(s.info), nil
	}
	expires := time.Now().Add(d)
	old := s.info.GetExpiresAtUnixMs()
	s.info.ExpiresAtUnixMs = expires.UnixMilli()
	if err := m.persist(s); err != nil {
		s.info.ExpiresAtUnixMs = old
		return nil, err
	}
	m.armTimerLocked(s, expires)
	return cloneSandbox(s.info), nil
}

// armTimerLocked (re)arms the sandbox's lifetime timer; s.mu held. One
// runtime timer per sandbox: cheap for thousands.
func (m *Manager) armTimerLocked(s *sandbox, expires time.Time) {
	if s.timer != nil {
		s.timer.Stop()
	}
	if m.isClosed() || s.lifetimeStoppedLocked() {
		return
	}
	s.timer = time.AfterFunc(time.Until(expires), func() {
		m.spawn(func() { m.expire(s) })
	})
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// expire deletes a sandbox whose lifetime passed.
func (m *Manager) expire(s *sandbox) {
	if m.isClosed() {
		return
	}
	s.mu.Lock()
	exp := time.UnixMilli(s.info.GetExpiresAtUnixMs())
	stale := s.allowLocked(opDelete) != nil || time.Now().Before(exp) || s.lifetimeStoppedLocked()
	s.mu.Unlock()
	if stale {
		return // deleted, or extended after this timer fired
	}
	m.log.Info("sandbox timed out", "sandbox", s.id)
	if err := m.remove(context.Background(), s, metrics.ReasonTimeout); err != nil &&
		errdefs.CategoryOf(err) != errdefs.NotFound {
		m.log.Error("delete timed-out sandbox", "sandbox", s.id, "err", err)
	}
}

// watch marks the sandbox STOPPED if its init dies on its own. The callback
// hangs on the backend's context rather than a goroutine per sandbox
// (~8 KiB of stack each at thousands of sandboxes); forget unregisters it.
func (m *Manager) watch(s *sandbox, sb backend.Sandbox) {
	stop := context.AfterFunc(sb.Exited(), func() {
		m.spawn(func() { m.died(s, sb, "init exited") })
	})
	s.mu.Lock()
	if s.st == stateGone {
		s.mu.Unlock()
		stop()
		return
	}
	s.unwatch = stop
	s.mu.Unlock()
}

// died marks a running or paused sandbox STOPPED, releases its resources
// and keeps the record until Delete (or its lifetime passes). A sandbox
// being deleted is left to the deletion (failedRemove looks at its init).
func (m *Manager) died(s *sandbox, sb backend.Sandbox, why string) {
	s.mu.Lock()
	if (s.st != stateRunning && s.st != statePaused) || s.sb != sb {
		s.mu.Unlock()
		return
	}
	_ = m.setState(s, stateStopped)
	s.info.DeadReason = why
	m.restartLifetimeLocked(s) // a paused one that died: its record goes in time
	if err := m.persist(s); err != nil {
		m.log.Warn("persist dead state", "sandbox", s.id, "err", err)
	}
	s.fs = nil
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	created := s.info.GetCreatedAtUnixMs()
	s.mu.Unlock()
	m.log.Warn("sandbox died", "sandbox", s.id, "reason", why)
	m.ended(metrics.ReasonDead, created)
	for _, p := range procs {
		p.gone()
	}
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	defer cancel()
	if err := sb.Destroy(ctx); err != nil {
		m.log.Error("release resources of dead sandbox", "sandbox", s.id, "err", err)
	}
	s.releaseLayers()
	m.harnessEnded(s)
}

// adoptAll re-adopts the sandboxes of the store, then sweeps orphans.
func (m *Manager) adoptAll(ctx context.Context) error {
	recs, err := m.store.List()
	if err != nil {
		return err
	}
	recs = m.recoverHibernated(recs)
	m.sweepBases(recs)
	var (
		mu   sync.Mutex
		keep = map[string]map[string]bool{}
		wg   sync.WaitGroup
		work = make(chan store.Record)
	)
	for name := range m.cfg.Backends {
		keep[name] = map[string]bool{}
	}
	for range min(adoptWorkers, max(1, len(recs))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rec := range work {
				if m.adopt(ctx, rec) {
					mu.Lock()
					keep[rec.Backend][rec.ID] = true
					// A nested backend's sandbox keeps its inner one
					// (fncall's: a container sandbox).
					if n, ok := m.cfg.Backends[rec.Backend].(backend.Nested); ok {
						if name, id, ok := n.Inner(rec.BackendState); ok && keep[name] != nil {
							keep[name][id] = true
						}
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, rec := range recs {
		work <- rec
	}
	close(work)
	wg.Wait()
	// Events read back from the audit file of sandboxes deleted while
	// no daemon ran are not listed.
	m.events.Retain(func(id string) bool {
		_, err := m.lookup(id)
		return err == nil
	})
	// Likewise the trajectory logs of sandboxes whose record is gone.
	if err := m.traj.sweep(func(id string) bool {
		_, err := m.lookup(id)
		return err == nil
	}); err != nil {
		m.log.Error("sweep trajectory logs", "err", err)
	}
	for name, b := range m.cfg.Backends {
		if err := b.Sweep(ctx, keep[name]); err != nil {
			m.log.Error("sweep orphaned sandbox resources", "backend", name, "err", err)
		}
	}
	// The adopted sandboxes hold their layers again: collect the rest and
	// unmount the layer mounts no sandbox took back.
	if err := m.images.GC(m.inUseDigests()...); err != nil {
		m.log.Error("collect unused image layers", "err", err)
	}
	m.log.Info("adopted sandboxes", "records", len(recs), "running", m.count(stateRunning), "stopped", m.count(stateStopped), "lost", m.count(stateLost))
	m.spawn(m.adoptAllProcesses)
	m.spawn(m.removeOrphans)
	return nil
}

// adoptAllProcesses rebuilds the background processes of the sandboxes
// adoptAll adopted, adoptWorkers at a time, while the daemon already
// serves: an agent round trip per sandbox (over half of the adoption's
// CPU time with 3,200, profiled under bench restart) need not delay every
// other call. A process call on a
// sandbox not reached yet adopts its processes itself (awaitProcs).
func (m *Manager) adoptAllProcesses() {
	var pending []*sandbox
	for _, s := range m.snapshot() {
		if s.procsAdopted != nil && !isDone(s.procsAdopted) {
			pending = append(pending, s)
		}
	}
	var wg sync.WaitGroup
	work := make(chan *sandbox)
	for range min(adoptWorkers, max(1, len(pending))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				if s.procsClaimed.CompareAndSwap(false, true) {
					m.adoptProcessesOf(s)
				}
			}
		}()
	}
	for _, s := range pending {
		work <- s
	}
	close(work)
	wg.Wait()
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// adopt restores one record; it reports whether the sandbox's backend
// resources must be kept by Sweep (it may be alive).
// A RUNNING sandbox's background processes are left to adoptAllProcesses
// (procsAdopted is closed when they are back).
func (m *Manager) adopt(ctx context.Context, rec store.Record) bool {
	log := m.log.With("sandbox", rec.ID)
	info := rec.Sandbox
	st := info.GetState()
	if st == stateLost {
		st = stateRunning // LOST is never persisted; were it, adopt it again
	}
	info.Id, info.State = rec.ID, st
	if info.Node == "" {
		info.Node = m.cfg.NodeName // made before the node had a name
	}
	s := &sandbox{
		id:           rec.ID,
		backendName:  rec.Backend,
		b:            m.cfg.Backends[rec.Backend],
		ready:        make(chan struct{}),
		st:           st,
		info:         info,
		backendState: rec.BackendState,
		imageLayers:  rec.ImageLayers,
		bases:        rec.Bases,
		etcNS:        parseNameserver(rec.EtcNameserver),
		parent:       info.GetParent(),
		harness:      info.GetHarness() != nil,
	}
	close(s.ready)
	// Before the sandbox is published, its state changes without gauges
	// or transitions: add counts it in the state it ends up in.
	initState := func(st state, why string) {
		s.st, info.State, info.DeadReason = st, st, why
	}
	add := func() {
		m.mu.Lock()
		m.sandboxes[s.id] = s
		m.mu.Unlock()
		m.metrics.SandboxState("", stateLabel(s.st))
	}
	// The timer goes last: an expired one fires at once and needs the
	// sandbox in the map.
	armTimer := func(expires time.Time) {
		s.mu.Lock()
		m.armTimerLocked(s, expires)
		s.mu.Unlock()
	}
	markStopped := func(why string) {
		initState(stateStopped, why)
		if err := m.persist(s); err != nil {
			log.Warn("persist stopped state", "err", err)
		}
		add()
		armTimer(time.UnixMilli(info.GetExpiresAtUnixMs()))
	}
	if s.b == nil {
		// Its resources, if any, are left for a daemon that has the
		// backend; the record is not rewritten, and Delete forgets it.
		log.Warn("sandbox of an unconfigured backend", "backend", rec.Backend)
		if st == stateRunning {
			initState(stateLost, "backend "+rec.Backend+" is not configured")
		}
		add()
		return false
	}

	switch {
	case !servedHere(st):
		// HIBERNATED or a number this daemon does not know: a newer
		// daemon's. Kept as it is, resources and all, with no timer:
		// a rollback to this daemon must not lose it.
		log.Warn("sandbox in a state this daemon does not drive: kept as it is", "state", stateName(st))
		add()
		return true
	case st == stateStopped:
		add()
		armTimer(time.UnixMilli(info.GetExpiresAtUnixMs()))
		return false
	case st == stateHibernated:
		// Nothing of it runs; its layers are held for the restore, and
		// its processes' records come back from the agent then. What its
		// checkpoint holds in the backend (its id range) is held again.
		if h, ok := s.b.(backend.CheckpointHolder); ok && m.ownsCheckpoint(s.id) {
			if err := h.HoldCheckpoint(m.checkpointDir(s.id)); err != nil {
				log.Warn("hold the checkpoint's resources", "err", err)
			}
		}
		s.release = m.holdLayers(ctx, s)
		s.procsOnResume = true
		add()
		armTimer(time.UnixMilli(info.GetExpiresAtUnixMs()))
		return false
	case st != stateRunning && st != statePaused:
		// Half-created or half-deleted: finish the job. Sweep removes
		// whatever Adopt cannot find.
		if len(rec.BackendState) > 0 {
			if sb, err := s.b.Adopt(ctx, rec.ID, rec.BackendState); err == nil {
				if err := sb.Destroy(ctx); err != nil {
					log.Warn("destroy half-created sandbox", "err", err)
				}
			}
		}
		if err := m.store.Delete(rec.ID); err != nil {
			log.Warn("delete record", "err", err)
		}
		log.Info("removed sandbox left in state " + stateName(st))
		return false
	}

	release := m.holdLayers(ctx, s)
	sb, err := s.b.Adopt(ctx, rec.ID, rec.BackendState)
	if errdefs.CategoryOf(err) == errdefs.NotFound {
		if release != nil {
			release()
		}
		m.ended(metrics.ReasonDead, rec.Sandbox.GetCreatedAtUnixMs())
		log.Warn("sandbox died while the daemon was down")
		markStopped("init exited while the daemon was down")
		return false
	}
	if err != nil {
		// Not proven gone: it may run on. LOST keeps its resources and
		// layers, and is adopted again in the background.
		log.Error("adopt sandbox: LOST, retried", "err", err)
		initState(stateLost, "adopt failed after daemon restart: "+err.Error())
		s.release = release
		add()
		armTimer(time.UnixMilli(info.GetExpiresAtUnixMs()))
		m.spawn(func() { m.readopt(s) })
		return true
	}
	s.sb, s.backendState, s.release = sb, sb.State(), release
	s.fs = fsFor(sb)
	expires := time.UnixMilli(info.GetExpiresAtUnixMs())
	if !time.Now().Before(expires) && !(st == statePaused && info.GetKeepWhilePaused() && info.GetExpiresAtUnixMs() == 0) {
		log.Info("sandbox expired while the daemon was down")
		add()
		if err := m.remove(ctx, s, metrics.ReasonTimeout); err != nil {
			log.Error("delete expired sandbox", "err", err)
			return true
		}
		return false
	}
	if st == statePaused {
		// Its agent is frozen: processes are adopted on resume.
		s.procsOnResume = true
	} else {
		s.procsAdopted = make(chan struct{})
	}
	if s.isHarness() {
		// Before the watch: a death it reports closes the route for good.
		m.openRoute(s)
	}
	add()
	armTimer(expires)
	m.watch(s, sb)
	return true
}

// holdLayers holds the image layers of an adopted sandbox again before it
// is re-attached (the image name may have been re-imported since); nil
// when they cannot be resolved.
func (m *Manager) holdLayers(ctx context.Context, s *sandbox) func() {
	img := image.Image{Name: s.info.GetImage(), Layers: s.imageLayers}
	var err error
	var release func()
	m.imgMu.RLock()
	if len(img.Layers) == 0 {
		img, err = m.images.Get(s.info.GetImage())
	}
	if err == nil {
		_, release, err = m.images.LayerRefs(ctx, img, mountsLayers(s.b))
	}
	m.imgMu.RUnlock()
	if err != nil {
		m.log.Warn("resolve image of adopted sandbox", "sandbox", s.id, "image", s.info.GetImage(), "err", err)
		return nil
	}
	return release
}

// readopt adopts a LOST sandbox again, with backoff, until it is RUNNING
// again, proven gone (STOPPED), deleted, or the daemon closes.
func (m *Manager) readopt(s *sandbox) {
	delay := readoptMin
	for {
		select {
		case <-m.closing:
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, readoptMax)
		if done := m.readoptOnce(s, delay); done {
			return
		}
	}
}

// readoptOnce tries one adoption of a LOST sandbox; done when it is
// neither LOST nor being deleted (a failed delete makes it LOST again).
func (m *Manager) readoptOnce(s *sandbox, next time.Duration) (done bool) {
	s.reach.Lock()
	defer s.reach.Unlock()
	s.mu.Lock()
	st, blob := s.st, s.backendState
	s.mu.Unlock()
	if st == stateDeleting {
		return false
	}
	if st != stateLost {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	sb, err := s.b.Adopt(ctx, s.id, blob)
	cancel()
	if err != nil && errdefs.CategoryOf(err) != errdefs.NotFound {
		m.log.Warn("adopt LOST sandbox again", "sandbox", s.id, "err", err, "next", next)
		return false
	}
	m.found(s, sb, err)
	return true
}

// found ends LOST: RUNNING with sb, or STOPPED when Adopt proved the
// sandbox gone (err NotFound).
func (m *Manager) found(s *sandbox, sb backend.Sandbox, err error) {
	s.mu.Lock()
	if s.st != stateLost {
		// Being deleted: hand the handle to the deletion, which waits for
		// reach (reachToDelete) and destroys it.
		if s.st == stateDeleting && s.sb == nil {
			s.sb = sb
		}
		s.mu.Unlock()
		return
	}
	if err != nil {
		_ = m.setState(s, stateStopped)
		s.info.DeadReason = "init exited while the node could not reach it"
		if perr := m.persist(s); perr != nil {
			m.log.Warn("persist stopped state", "sandbox", s.id, "err", perr)
		}
		created := s.info.GetCreatedAtUnixMs()
		s.mu.Unlock()
		s.releaseLayers()
		m.ended(metrics.ReasonDead, created)
		m.log.Warn("LOST sandbox is gone", "sandbox", s.id)
		m.spawn(func() { m.harnessEnded(s) })
		return
	}
	s.sb, s.backendState = sb, sb.State()
	s.fs = fsFor(sb)
	back := stateRunning
	if s.info.GetPausedAtUnixMs() != 0 {
		back = statePaused // it was paused when the node lost it
	}
	_ = m.setState(s, back)
	s.info.DeadReason = ""
	if perr := m.persist(s); perr != nil {
		m.log.Warn("persist running state", "sandbox", s.id, "err", perr)
	}
	paused := back == statePaused
	s.procsOnResume = paused
	s.mu.Unlock()
	if s.isHarness() {
		m.openRoute(s) // before the watch, as in adopt
	}
	m.watch(s, sb)
	if !paused {
		m.adoptProcesses(s, sb)
	}
	m.log.Info("LOST sandbox adopted again", "sandbox", s.id, "state", stateName(back))
}

func (m *Manager) count(st warrenv1.SandboxState) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := 0
	for _, s := range m.sandboxes {
		s.mu.Lock()
		if s.st == st {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// etcFilesOf is the /etc files a sandbox gets over its image's, none with
// keep_etc. Its resolv.conf names nameserver (none for the zero Addr):
// at create mode none's, and a backend that gives the sandbox a network
// names its resolver there (etcfiles.WithNameserver, backend.Resolved);
// after that the sandbox's etcNS, what Warren last wrote (etc.go).
func etcFilesOf(info *warrenv1.Sandbox, nameserver netip.Addr) []etcfiles.File {
	if info.GetKeepEtc() {
		return nil
	}
	return etcfiles.WithNameserver(etcfiles.Files(info.GetHostname(), etcfiles.None), nameserver)
}

package daemon

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/atomicfile"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/store"
	"github.com/warrenrl/warren/internal/treecopy"
)

// Forking (Fork).
//
// A fork is the source's checkpoint restored under a new id. The first
// fork of a checkpoint turns its writable layer into a base: a directory
// under <state>/bases that the source and every fork share read-only as
// their top lower layer, each writing on a fresh upper of its own (layers:
// bases, top first, then the image's). Copy-on-write at the file level, as
// overlayfs does for the image, and nothing is copied up front: a fork
// costs a restore, not a copy of the source's files.
//
// The source's record names the base (synced) before the checkpoint's
// upper is renamed to it; settleBase finishes a rename a crash cut off. A
// base goes once no record names it: on delete (dropBases), and when the
// daemon starts (sweepBases).

// maxForks bounds one Fork call; forkParallelism is how many of its
// forks restore at once.
const (
	maxForks        = 64
	forkParallelism = 4
)

// basesDir holds the bases. On a checkpoint directory other nodes share
// (Config.CheckpointDir) they sit beside the checkpoints, so that a fork
// hibernated on one node restores on another; no one node's records then
// know every sandbox that stands on a base, so each base keeps its own
// list (refBases).
func (m *Manager) basesDir() string {
	if m.sharedCheckpoints() {
		return filepath.Join(m.checkpointRoot(), sharedBasesDir)
	}
	return filepath.Join(m.cfg.StateDir, "bases")
}

const (
	sharedBasesDir = ".bases"
	// refsSuffix names a shared base's list: <base>.refs/<sandbox id>,
	// one empty file per sandbox that stands on it, wherever it runs.
	refsSuffix = ".refs"
)

// sharedBase: b is a base on the shared checkpoint directory.
func (m *Manager) sharedBase(b string) bool {
	return m.sharedCheckpoints() && filepath.Dir(b) == m.basesDir()
}

// refBases enters sandbox id in the lists of the shared bases it stands
// on, durably, before its record names them: a base goes when its list
// is empty, and a sandbox moves between nodes with its entries (its id
// stays). Entries are made only for a sandbox that already stands on the
// base (a fork's source is listed before its forks), so a list that went
// empty stays empty. Each entry holds the name of the node whose records
// hold the sandbox (node; this node when ""), so that a node's sweep can
// tell its own stale entries (a crash between a delete and its entry's
// removal) from the live ones of other nodes.
func (m *Manager) refBases(id string, bases []string) error {
	return m.nameOnBases(id, bases, m.cfg.NodeName, true)
}

// nameOnBases writes node into sandbox id's entries on its shared bases;
// only the entries already there unless create.
func (m *Manager) nameOnBases(id string, bases []string, node string, create bool) error {
	for _, b := range bases {
		if !m.sharedBase(b) {
			continue
		}
		refs := b + refsSuffix
		entry := filepath.Join(refs, id)
		if !create {
			if _, err := os.Stat(entry); err != nil {
				continue
			}
		}
		if err := os.MkdirAll(refs, 0o700); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "list a sandbox on its base")
		}
		if err := atomicfile.Write(entry, ".ref-", []byte(node+"\n"), 0o600); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "list a sandbox on its base")
		}
		if err := atomicfile.SyncDir(refs); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "list a sandbox on its base")
		}
	}
	return nil
}

// baseLayers are bases as the backend's lower layers.
func baseLayers(bases []string) []backend.Layer {
	out := make([]backend.Layer, len(bases))
	for i, b := range bases {
		out[i] = backend.Layer{Digest: "base:" + filepath.Base(b), Dir: b, HostIDs: true}
	}
	return out
}

// settleBase makes sure the top base of sandbox id exists: a crash between
// recording it and renaming the checkpoint's upper to it is finished here.
func (m *Manager) settleBase(id string, bases []string) error {
	if len(bases) == 0 {
		return nil
	}
	top := bases[0]
	if _, err := os.Stat(top); err == nil {
		return nil
	}
	up := filepath.Join(m.checkpointDir(id), "upper")
	// A checkpoint directory on another filesystem (shared by nodes)
	// makes this a copy: into a name of its own first, so that a base
	// is never half there.
	moving := top + movingSuffix
	if _, err := os.Stat(up); err != nil {
		if _, merr := os.Stat(moving); merr == nil {
			// The copy was done and the upper removed: finish it.
			return wrapBase(os.Rename(moving, top))
		}
		return errdefs.Internalf("sandbox %s: its base layer %s is missing", id, top)
	}
	if err := os.MkdirAll(filepath.Dir(top), 0o700); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "create bases directory")
	}
	_ = os.RemoveAll(moving) // a copy cut short
	if err := treecopy.Move(up, moving); err != nil {
		return wrapBase(err)
	}
	return wrapBase(os.Rename(moving, top))
}

// movingSuffix marks a base on its way from a checkpoint (settleBase).
const movingSuffix = ".moving"

func wrapBase(err error) error {
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "make the checkpoint's writable layer a base")
	}
	return nil
}

// Fork makes req.Count copies of a sandbox from its checkpoint.
func (m *Manager) Fork(ctx context.Context, req *warrenv1.ForkRequest) (_ *warrenv1.ForkResponse, err error) {
	defer m.observe("Fork", &err)
	start := time.Now()
	n := int(req.GetCount())
	if n < 1 || n > maxForks {
		return nil, errdefs.Invalidf("count %d is out of range [1, %d]", n, maxForks)
	}
	if err := checkLabels(req.GetLabels()); err != nil {
		return nil, err
	}
	life, err := m.lifetime(req.GetTimeoutSeconds())
	if err != nil {
		return nil, err
	}
	if req.GetId() == "" {
		return nil, errdefs.Invalidf("sandbox id is required")
	}
	s, err := m.find(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	if err := refuseHarness(s); err != nil {
		return nil, err
	}
	s.mu.Lock()
	prev := s.st
	s.mu.Unlock()
	out := &warrenv1.ForkResponse{}
	switch prev {
	case stateRunning, statePaused:
		// Hibernated for the checkpoint, the source still holds its room
		// for admission (qos.go): the forks must fit beside it, or its
		// resume would be refused.
		s.mu.Lock()
		s.admitted = true
		s.mu.Unlock()
		h, herr := m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: s.id})
		if herr != nil {
			s.mu.Lock()
			s.admitted = false
			s.mu.Unlock()
			return nil, herr
		}
		out.CheckpointUs = h.GetCheckpointUs()
		// The source goes back to the state it was in, forks or not. (err
		// is the call's: a source that cannot be resumed fails it.)
		defer func() {
			bctx := context.WithoutCancel(ctx)
			defer func() {
				s.mu.Lock()
				s.admitted = false
				s.mu.Unlock()
			}()
			if _, rerr := m.Resume(bctx, &warrenv1.ResumeRequest{Id: s.id}); rerr != nil {
				m.log.Error("resume the source of a fork", "sandbox", s.id, "err", rerr)
				if err == nil {
					err = withCategory(rerr, errdefs.Internal, "resume sandbox "+s.id+" after forking it")
				}
			} else if prev == statePaused {
				if _, perr := m.Pause(bctx, &warrenv1.PauseRequest{Id: s.id}); perr != nil {
					m.log.Error("pause the source of a fork again", "sandbox", s.id, "err", perr)
				}
			}
			if out != nil {
				if info, gerr := m.Get(bctx, &warrenv1.GetRequest{Id: s.id}); gerr == nil {
					out.Source = info
				}
			}
		}()
	}

	s.mu.Lock()
	if err := s.mayStartLocked(opFork); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	done := s.startPausingLocked()
	defer func() {
		s.mu.Lock()
		s.endPausingLocked(done)
		s.mu.Unlock()
	}()
	// The checkpoint's writable layer becomes a base, recorded first.
	if _, err := os.Stat(filepath.Join(m.checkpointDir(s.id), "upper")); err == nil {
		nb := filepath.Join(m.basesDir(), s.id+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
		old := s.bases
		s.bases = append([]string{nb}, old...)
		if err := m.persistDurable(s); err != nil {
			s.bases = old
			s.mu.Unlock()
			return nil, err
		}
	}
	info := cloneSandbox(s.info)
	digests, bases, etcNS := s.imageLayers, s.bases, s.etcNS
	s.mu.Unlock()
	if err := m.refBases(s.id, bases); err != nil {
		return nil, err
	}
	if err := m.settleBase(s.id, bases); err != nil {
		return nil, err
	}
	if err := m.traj.sync(s.id); err != nil {
		m.log.Warn("sync trajectory log before forking", "sandbox", s.id, "err", err)
	}

	// Forks restore a few at a time: each is mostly CRIU writing the
	// source's memory into its own, which a core or two keep busy.
	type result struct {
		f    *sandbox
		took time.Duration
		err  error
	}
	results := make([]result, n)
	lazy := m.lazyPages(req.LazyPages)
	sem := make(chan struct{}, forkParallelism)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f, took, ferr := m.forkOne(ctx, s, info, digests, bases, etcNS, req.GetLabels(), life, lazy)
			results[i] = result{f, took, ferr}
		}()
	}
	wg.Wait()
	var ferr error
	for _, r := range results {
		if r.err != nil && ferr == nil {
			ferr = r.err
		}
	}
	if ferr != nil {
		// All or nothing: the forks made go.
		for _, r := range results {
			if r.f == nil {
				continue
			}
			if derr := m.remove(context.WithoutCancel(ctx), r.f, "fork_failed"); derr != nil {
				m.log.Warn("delete a fork of a failed fork call", "sandbox", r.f.id, "err", derr)
			}
		}
		return nil, ferr
	}
	for i, r := range results {
		r.f.mu.Lock()
		out.Sandboxes = append(out.Sandboxes, cloneSandbox(r.f.info))
		if i == 0 {
			// One checkpoint, one node, one backend: every fork alike.
			out.LazyPages, out.EagerReason = memoryRestore(r.f.sb, lazy)
		}
		r.f.mu.Unlock()
		out.RestoreUs = append(out.RestoreUs, r.took.Microseconds())
	}
	out.TotalUs = time.Since(start).Microseconds()
	m.log.Debug("sandbox forked", "sandbox", s.id, "forks", n, "took", time.Since(start))
	return out, nil
}

// forkOne restores one fork of src from its checkpoint.
func (m *Manager) forkOne(ctx context.Context, src *sandbox, info *warrenv1.Sandbox, digests, bases []string, etcNS netip.Addr, labels map[string]string, life time.Duration, lazy bool) (_ *sandbox, _ time.Duration, err error) {
	now := time.Now()
	fi := cloneSandbox(info)
	fi.State = stateCreating
	fi.Labels = maps.Clone(info.GetLabels())
	if fi.Labels == nil {
		fi.Labels = map[string]string{}
	}
	maps.Copy(fi.Labels, labels)
	fi.ForkedFrom = src.id
	fi.CreatedAtUnixMs = now.UnixMilli()
	fi.PausedAtUnixMs, fi.PausedTotalMs, fi.HibernatedAtUnixMs, fi.CheckpointBytes = 0, 0, 0, 0
	fi.DeadReason, fi.ExpiresAtUnixMs, fi.LifetimeLeftMs = "", 0, 0
	fi.IdempotencyKey = "" // the source's create's, not this fork's
	s := &sandbox{
		backendName: src.backendName,
		b:           src.b,
		ready:       make(chan struct{}),
		st:          stateCreating,
		info:        fi,
		imageLayers: digests,
		bases:       bases,
		// A fork of a harness's child is the harness's child too.
		parent: src.parent,
	}
	s.seen.known = true
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, 0, errdefs.Unavailablef("daemon is shutting down")
	}
	if s.parent != "" {
		if err := m.reserveChildLocked(s.parent); err != nil {
			m.mu.Unlock()
			return nil, 0, err
		}
	}
	if err := m.admitLocked(s, fi.GetResources()); err != nil {
		m.mu.Unlock()
		return nil, 0, err
	}
	id := m.newID()
	for m.sandboxes[id] != nil {
		id = m.newID()
	}
	s.id, fi.Id = id, id
	m.sandboxes[id] = s
	m.mu.Unlock()
	m.metrics.SandboxState("", stateLabel(stateCreating))
	var cl cleanup.Cleanup
	defer func() {
		if err != nil {
			if cerr := cl.Clean(); cerr != nil {
				m.log.Warn("rollback of failed fork incomplete", "sandbox", id, "err", cerr)
			}
		}
	}()
	cl.Add(func() error {
		m.forget(s)
		m.events.Forget(id)
		return nil
	})
	if err := m.refBases(id, bases); err != nil {
		return nil, 0, err
	}
	cl.Add(func() error { m.dropBases(id, bases); return nil })

	m.imgMu.RLock()
	layers, release, err := m.images.LayerRefs(ctx, image.Image{Name: fi.GetImage(), Layers: digests}, mountsLayers(s.b))
	m.imgMu.RUnlock()
	if err != nil {
		return nil, 0, withCategory(err, errdefs.Internal, "resolve the layers of sandbox "+src.id)
	}
	cl.Add(func() error { release(); return nil })
	spec, err := m.restoreSpec(id, fi, layers, bases, src.id)
	if err != nil {
		return nil, 0, err
	}
	spec.LazyPages = lazy
	t0 := time.Now()
	sb, err := s.b.Create(ctx, spec)
	took := time.Since(t0)
	if err != nil {
		return nil, 0, withCategory(err, errdefs.Internal, "restore a fork of sandbox "+src.id)
	}
	cl.Add(func() error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
		defer cancel()
		return sb.Destroy(dctx)
	})
	// The fork's rollout replays the source's steps before its own.
	if err := copyFile(m.traj.path(src.id), m.traj.path(id)); err != nil {
		return nil, 0, errdefs.Wrap(errdefs.Internal, err, "copy the trajectory log of sandbox "+src.id)
	}
	cl.Add(func() error { return m.traj.remove(id) })

	s.mu.Lock()
	s.sb, s.fs, s.backendState, s.release = sb, fsFor(sb), sb.State(), release
	s.etcNS = etcNS
	fi.NetworkAddress = networkAddress(sb)
	m.followRestoredNetwork(ctx, s)
	expires := time.Now().Add(life)
	fi.ExpiresAtUnixMs = expires.UnixMilli()
	fi.State = stateRunning
	if err = m.persist(s); err != nil {
		s.sb, s.fs, s.backendState, s.release = nil, nil, nil, nil
		fi.State = stateCreating
		s.mu.Unlock()
		return nil, 0, err
	}
	_ = m.setState(s, stateRunning)
	m.armTimerLocked(s, expires)
	close(s.ready)
	s.procsAdopted = make(chan struct{})
	s.mu.Unlock()
	cl.Release()
	m.watch(s, sb)
	// Its background processes (the source's, restored) are listed
	// again from its agent.
	if s.procsClaimed.CompareAndSwap(false, true) {
		m.spawn(func() { m.adoptProcessesOf(s) })
	}
	restoredLazily, _ := memoryRestore(sb, lazy)
	m.metrics.ObserveRestore(took, restoredLazily)
	return s, took, nil
}

// lazyPages is whether a restore restores memory lazily: what the
// request asks, else the daemon's default (Config.LazyPages).
func (m *Manager) lazyPages(asked *bool) bool {
	if asked != nil {
		return *asked
	}
	return m.cfg.LazyPages
}

// dropBases removes the bases of a deleted sandbox that no other sandbox
// names: for a shared base, its list (refBases) is the judge, since the
// other sandboxes may run on other nodes.
func (m *Manager) dropBases(id string, bases []string) {
	if len(bases) == 0 {
		return
	}
	var local []string
	for _, b := range bases {
		if !m.sharedBase(b) {
			local = append(local, b)
			continue
		}
		refs := b + refsSuffix
		if err := os.Remove(filepath.Join(refs, id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("take a deleted sandbox off its base's list", "sandbox", id, "base", b, "err", err)
			continue
		}
		if ents, err := os.ReadDir(refs); err == nil && len(ents) == 0 || errors.Is(err, fs.ErrNotExist) {
			m.removeSharedBase(b)
		}
	}
	if len(local) == 0 {
		return
	}
	bases = local
	used := map[string]bool{}
	for _, o := range m.snapshot() {
		o.mu.Lock()
		for _, b := range o.bases {
			used[b] = true
		}
		o.mu.Unlock()
	}
	for _, b := range bases {
		if !used[b] {
			if err := os.RemoveAll(b); err != nil {
				m.log.Warn("remove a base no sandbox uses", "base", b, "err", err)
			}
		}
	}
}

// removeSharedBase removes a shared base whose list is empty: the base
// first, then the list, so that a removal cut short is found again by
// sweepSharedBases.
func (m *Manager) removeSharedBase(b string) {
	for _, p := range []string{b + movingSuffix, b, b + refsSuffix} {
		if err := os.RemoveAll(p); err != nil {
			m.log.Warn("remove a base no sandbox stands on", "base", p, "err", err)
			return
		}
	}
}

// sweepSharedBases takes this node's stale entries off the shared bases'
// lists (an entry naming this node for a sandbox none of its records
// holds: a crash between a delete and the entry's removal, or between a
// fork's entry and its record), then removes the bases whose list is
// empty (a removal cut short) or missing and older than a fork takes (a
// crash before the first entry). Entries naming other nodes are theirs
// to judge; unnamed ones (of daemons from before names) are kept.
func (m *Manager) sweepSharedBases(recs []store.Record) {
	dir := m.basesDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("read shared bases directory", "err", err)
		}
		return
	}
	here := map[string]bool{}
	for _, r := range recs {
		here[r.ID] = true
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, refsSuffix) || strings.HasSuffix(name, movingSuffix) {
			continue
		}
		b := filepath.Join(dir, name)
		refs, err := os.ReadDir(b + refsSuffix)
		if err == nil {
			live := refs[:0]
			for _, r := range refs {
				p := filepath.Join(b+refsSuffix, r.Name())
				if strings.HasPrefix(r.Name(), ".ref-") {
					_ = os.Remove(p) // a write cut short
					continue
				}
				if !here[r.Name()] && m.refNames(p) == m.cfg.NodeName {
					m.log.Info("take a stale entry off a shared base's list", "sandbox", r.Name(), "base", b)
					if rerr := os.Remove(p); rerr == nil || errors.Is(rerr, fs.ErrNotExist) {
						continue
					}
				}
				live = append(live, r)
			}
			refs = live
		}
		switch {
		case err == nil && len(refs) == 0:
			m.removeSharedBase(b)
		case errors.Is(err, fs.ErrNotExist):
			if fi, serr := os.Stat(b); serr == nil && time.Since(fi.ModTime()) > staleClaim {
				m.removeSharedBase(b)
			}
		}
	}
}

// refNames is the node a base list's entry names ("" for none).
func (m *Manager) refNames(entry string) string {
	b, err := os.ReadFile(entry)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// sweepBases removes the bases no record names (a crash between a fork's
// record and its rename, or a delete whose removal failed).
func (m *Manager) sweepBases(recs []store.Record) {
	if m.sharedCheckpoints() {
		m.sweepSharedBases(recs)
	}
	dir := filepath.Join(m.cfg.StateDir, "bases")
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("read bases directory", "err", err)
		}
		return
	}
	used := map[string]bool{}
	for _, r := range recs {
		for _, b := range r.Bases {
			used[b] = true
		}
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if !used[p] && !used[strings.TrimSuffix(p, movingSuffix)] {
			if err := os.RemoveAll(p); err != nil {
				m.log.Warn("remove a base no record names", "base", p, "err", err)
			}
		}
	}
}

// copyFile copies from to to; nothing when from does not exist.
func copyFile(from, to string) error {
	in, err := os.Open(from)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

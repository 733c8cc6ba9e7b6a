package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/atomicfile"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/caller"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/metrics"
	"github.com/warrenrl/warren/internal/store"
)

// Checkpoints on a directory several nodes share (Config.CheckpointDir).
//
// Each checkpoint names the node that holds its sandbox (ownerFile),
// written before CRIU's first image, so that no node ever takes another's
// checkpoint in progress for an orphan. Restore on another node moves the
// sandbox: under the checkpoint's claim (claimFile, made with O_EXCL,
// which NFS honours too) it rewrites the owner, takes the record and the
// trajectory log kept in the checkpoint, and restores as Resume does. The
// node it left finds the owner changed at its next look at the sandbox
// (any call naming it, List, its expiry timer, a restart) and forgets it
// without touching the checkpoint: NotFound, naming the new node. A
// node's own restore takes the same claim, so two nodes never restore
// one checkpoint. What each node removes (orphans, deleted sandboxes'
// checkpoints) is only what it owns.

const (
	ownerFile = "node"           // the node that holds the checkpoint's sandbox
	claimFile = "claim"          // held while a node takes or restores it
	trajFile  = "trajectory.log" // the sandbox's trajectory log, for the node that takes it
	movedDir  = ".moved"         // tombstones: <id>.<old node> holds the new node's name
	// staleClaim is how old a claim must be to be broken: its node
	// died in a restore (a restore takes well under a second).
	staleClaim = 10 * time.Minute
)

// checkpointRoot is the directory of the checkpoints.
func (m *Manager) checkpointRoot() string {
	if m.cfg.CheckpointDir != "" {
		return m.cfg.CheckpointDir
	}
	return filepath.Join(m.cfg.StateDir, "checkpoints")
}

// sharedCheckpoints: other nodes may use the checkpoint directory.
func (m *Manager) sharedCheckpoints() bool { return m.cfg.CheckpointDir != "" }

// checkpointOwner is the node the checkpoint of id names; "" if it names
// none (none there, or one of a daemon from before owners).
func (m *Manager) checkpointOwner(id string) string {
	b, err := os.ReadFile(filepath.Join(m.checkpointDir(id), ownerFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ownsCheckpoint: this node may remove or restore the checkpoint of id.
func (m *Manager) ownsCheckpoint(id string) bool {
	if !m.sharedCheckpoints() {
		return true
	}
	o := m.checkpointOwner(id)
	return o == "" || o == m.cfg.NodeName
}

// writeOwner names this node as the holder of the checkpoint of id.
func (m *Manager) writeOwner(id string) error {
	return atomicfile.Write(filepath.Join(m.checkpointDir(id), ownerFile), ".node-", []byte(m.cfg.NodeName+"\n"), 0o600)
}

// claimCheckpoint takes the claim on the checkpoint of id; the func lets
// go of it. Conflict while another node holds it.
func (m *Manager) claimCheckpoint(id string) (func(), error) {
	p := filepath.Join(m.checkpointDir(id), claimFile)
	for try := 0; ; try++ {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, werr := fmt.Fprintf(f, "%s %d\n", m.cfg.NodeName, time.Now().Unix())
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				_ = os.Remove(p)
				return nil, errdefs.Wrap(errdefs.Internal, werr, "claim the checkpoint of sandbox "+id)
			}
			return func() { _ = os.Remove(p) }, nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errdefs.NotFoundf("no checkpoint of sandbox %s in %s", id, m.checkpointRoot())
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, errdefs.Wrap(errdefs.Internal, err, "claim the checkpoint of sandbox "+id)
		}
		holder, at := readClaim(p)
		if try == 0 && (holder == m.cfg.NodeName || time.Since(at) > staleClaim) {
			// Ours, from before a crash, or its node died in a restore.
			_ = os.Remove(p)
			continue
		}
		return nil, errdefs.Conflictf("sandbox %s is being restored by node %s; retry later", id, holder)
	}
}

func readClaim(p string) (string, time.Time) {
	b, _ := os.ReadFile(p)
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return "?", time.Now()
	}
	sec, _ := strconv.ParseInt(f[1], 10, 64)
	return f[0], time.Unix(sec, 0)
}

// tombstone is where the node that takes sandbox id from node from
// tells it so, once the checkpoint (and its owner file) is gone.
func (m *Manager) tombstone(id, from string) string {
	return filepath.Join(m.checkpointRoot(), movedDir, id+"."+from)
}

// movedAway forgets sandbox s if it is HIBERNATED and its checkpoint now
// names another node (restored there), and says which node.
func (m *Manager) movedAway(s *sandbox) (string, bool) {
	if !m.sharedCheckpoints() {
		return "", false
	}
	s.mu.Lock()
	hib := s.st == stateHibernated
	s.mu.Unlock()
	if !hib {
		return "", false
	}
	o := m.checkpointOwner(s.id)
	tomb := m.tombstone(s.id, m.cfg.NodeName)
	if o == "" {
		// Restored on another node, which removed the checkpoint: its
		// tombstone for this node says where it went.
		b, err := os.ReadFile(tomb)
		if err != nil {
			return "", false
		}
		o = strings.TrimSpace(string(b))
	}
	if o == "" || o == m.cfg.NodeName {
		return "", false
	}
	// Its entries on shared bases name the node that has it now before
	// this node's record goes, so that no sweep here takes them for
	// stale ones (the taking node names itself too, but may not have got
	// that far).
	s.mu.Lock()
	bases := s.bases
	s.mu.Unlock()
	if err := m.nameOnBases(s.id, bases, o, false); err != nil {
		m.log.Warn("name the new node on a moved sandbox's bases", "sandbox", s.id, "node", o, "err", err)
		return "", false
	}
	defer os.Remove(tomb)
	m.log.Info("hibernated sandbox was restored on another node: forgotten here", "sandbox", s.id, "node", o)
	if err := m.remove(context.Background(), s, metrics.ReasonMoved); err != nil {
		m.log.Warn("forget moved sandbox", "sandbox", s.id, "err", err)
	}
	return o, true
}

// find is lookup for the calls that name a sandbox: a harness finds its
// own children only, and one that moved to another node is forgotten
// (NotFound says where it went).
func (m *Manager) find(ctx context.Context, id string) (*sandbox, error) {
	s, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	// A harness's call was checked against its children before it got
	// here (server/scope.go); the id may since have been deleted and
	// taken by a sandbox of the node's: checked again on the sandbox
	// found.
	if h, scoped := caller.Harness(ctx); scoped && s.parent != h {
		return nil, errdefs.New(errdefs.PermissionDenied, "sandbox %s is not harness %s's", id, h)
	}
	if to, moved := m.movedAway(s); moved {
		return nil, errdefs.NotFoundf("sandbox %s was restored on node %s", id, to)
	}
	return s, nil
}

// Restore restores a HIBERNATED sandbox on this node, taking it from
// another node through a shared checkpoint directory if need be.
func (m *Manager) Restore(ctx context.Context, req *warrenv1.RestoreRequest) (_ *warrenv1.ResumeResponse, err error) {
	defer m.observe("Restore", &err)
	id := req.GetId()
	if !ValidID(id) {
		return nil, errdefs.Invalidf("bad sandbox id %q", id)
	}
	if _, err := m.find(ctx, id); err == nil {
		return m.Resume(ctx, &warrenv1.ResumeRequest{Id: id})
	}
	if !m.sharedCheckpoints() {
		return nil, errdefs.NotFoundf("sandbox %s not found (this node's checkpoint directory is its own: `warren serve --checkpoint-dir` shares one)", id)
	}
	if err := m.take(ctx, id); err != nil {
		return nil, err
	}
	return m.Resume(ctx, &warrenv1.ResumeRequest{Id: id})
}

// take makes the hibernated sandbox id of another node this node's:
// under the checkpoint's claim, its record and trajectory log come here
// and the checkpoint names this node.
func (m *Manager) take(ctx context.Context, id string) error {
	dir := m.checkpointDir(id)
	b, err := os.ReadFile(filepath.Join(dir, hibernatedRecord))
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.NotFoundf("no checkpoint of sandbox %s in %s", id, m.checkpointRoot())
	}
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "read the checkpoint of sandbox "+id)
	}
	rec, err := store.Decode(b)
	if err != nil || rec.ID != id {
		return errdefs.Internalf("the checkpoint of sandbox %s holds no record of it: %v", id, err)
	}
	if rec.State() != stateHibernated {
		return errdefs.Conflictf("the checkpoint of sandbox %s is not a hibernated one (state %s)", id, stateName(rec.State()))
	}
	if m.cfg.Backends[rec.Backend] == nil {
		return errdefs.Unsupportedf("sandbox %s needs backend %s, which this node does not run", id, rec.Backend)
	}
	for _, base := range rec.Bases {
		if _, err := os.Stat(base); err != nil {
			return errdefs.Unsupportedf("sandbox %s is a fork standing on base %s, which only the node that forked it has (it was forked before the checkpoint directory was shared): restore it there", id, base)
		}
	}
	unclaim, err := m.claimCheckpoint(id)
	if err != nil {
		return err
	}
	defer unclaim()
	if o := m.checkpointOwner(id); o != "" && o != m.cfg.NodeName {
		// The owner may have restored it meanwhile (it held the claim):
		// the record is gone then.
		if _, err := os.Stat(filepath.Join(dir, hibernatedRecord)); err != nil {
			return errdefs.NotFoundf("sandbox %s was restored on node %s meanwhile", id, o)
		}
	}
	if _, err := m.lookup(id); err == nil {
		return errdefs.AlreadyExistsf("sandbox %s already exists on this node", id)
	}
	// One rollback stack: a take cut short leaves this node as it was
	// and the checkpoint its old node's.
	var cu cleanup.Cleanup
	defer func() { _ = cu.Clean() }()
	// What the checkpoint needs of this node (its id range) must be free.
	if h, ok := m.cfg.Backends[rec.Backend].(backend.CheckpointHolder); ok {
		if err := h.AdmitCheckpoint(dir); err != nil {
			return err
		}
		cu.Add(func() error { h.ReleaseCheckpoint(dir); return nil })
	}
	if tb, err := os.ReadFile(filepath.Join(dir, trajFile)); err == nil {
		if err := atomicfile.Write(m.traj.path(id), ".take-", tb, 0o600); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "take the trajectory log of sandbox "+id)
		}
		cu.Add(func() error { return m.traj.remove(id) })
	}
	if rec.Sandbox != nil {
		rec.Sandbox.Node = m.cfg.NodeName // Sandbox.node says where it runs now
	}
	if err := m.store.Put(rec); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "record sandbox "+id)
	}
	cu.Add(func() error { return m.store.Delete(id) })
	if err := m.store.Sync(); err != nil {
		m.log.Warn("sync store", "err", err)
	}
	// From here the sandbox is this node's: the old node forgets it at
	// its next look, by the owner file or, once the checkpoint is gone,
	// by its tombstone.
	if from := m.checkpointOwner(id); from != "" && from != m.cfg.NodeName {
		tomb := m.tombstone(id, from)
		err := os.MkdirAll(filepath.Dir(tomb), 0o700)
		if err == nil {
			err = atomicfile.Write(tomb, ".tomb-", []byte(m.cfg.NodeName+"\n"), 0o600)
		}
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "leave a tombstone for the node sandbox "+id+" leaves")
		}
		cu.Add(func() error { return os.Remove(tomb) })
	}
	if err := m.writeOwner(id); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "take the checkpoint of sandbox "+id)
	}
	cu.Release()
	// Its entries on shared bases name this node from now (the old node
	// does the same when it sees the move): this node's sweep then knows
	// them for its own.
	if err := m.nameOnBases(id, rec.Bases, m.cfg.NodeName, false); err != nil {
		m.log.Warn("name this node on a taken sandbox's bases", "sandbox", id, "err", err)
	}
	m.adopt(ctx, rec)
	m.log.Info("hibernated sandbox taken from another node", "sandbox", id)
	return nil
}

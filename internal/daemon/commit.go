package daemon

import (
	"context"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
)

// commitOp is a CommitSandbox in progress; deleting the sandbox cancels
// it and waits for done (the sandbox is thawed by then).
type commitOp struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// CommitSandbox turns the writable layer of a running sandbox into the
// named layer req.Name. The sandbox is frozen while its upper directory
// is read, so the layer is a consistent snapshot of its files; its
// processes resume afterwards. Deleting the sandbox cancels a commit.
// Setuid/setgid bits and file capabilities are stripped unless
// req.KeepSetuid (image.CommitOptions). The /etc files Warren wrote
// (etcFilesOf) are left out unless the sandbox changed them: a layer must
// not carry one sandbox's hostname into every sandbox made from it.
func (m *Manager) CommitSandbox(ctx context.Context, req *warrenv1.CommitSandboxRequest) (_ *warrenv1.Layer, err error) {
	defer m.observe("CommitSandbox", &err)
	name := req.GetName()
	if err := validLayerName(name); err != nil {
		return nil, err
	}
	if !m.images.IsEROFS() {
		return nil, errdefs.Unsupportedf("committing sandboxes needs the EROFS image store (image.OpenStore); this node keeps layer directories")
	}
	s, v, err := m.live(ctx, opCommit, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	c, ok := v.sb.(backend.Committer)
	if !ok {
		return nil, errdefs.Unsupportedf("backend %s cannot commit sandboxes", v.backend)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	op := &commitOp{cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	if err := s.allowLocked(opCommit); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if s.commit != nil {
		s.mu.Unlock()
		return nil, errdefs.Conflictf("sandbox %s is already being committed", s.id)
	}
	s.commit = op
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.commit = nil
		s.mu.Unlock()
		close(op.done)
	}()

	start := time.Now()
	thaw, err := c.Freeze(ctx)
	if err != nil {
		return nil, m.explain(opCommit, s, err, "freeze sandbox "+s.id)
	}
	s.mu.Lock()
	omit := make(map[string][]byte)
	for _, f := range etcFilesOf(s.info, s.etcNS) {
		omit["etc/"+f.Name] = f.Data
	}
	s.mu.Unlock()
	copts := image.CommitOptions{KeepSetuid: req.GetKeepSetuid(), Omit: omit}
	if im, ok := v.sb.(backend.IDMapped); ok {
		if base, size, mapped := im.IDMap(); mapped {
			copts.IDs = &image.IDShift{Base: base, Size: size}
		}
	}
	nl, err := m.images.CommitUpper(ctx, name, c.UpperDir(), copts)
	if terr := thaw(); terr != nil {
		m.log.Error("thaw sandbox after commit", "sandbox", s.id, "err", terr)
		if err == nil {
			err = withCategory(terr, errdefs.Internal, "thaw sandbox "+s.id)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			if why := m.explain(opCommit, s, err, ""); errdefs.CategoryOf(why) == errdefs.Conflict || errdefs.CategoryOf(why) == errdefs.NotFound {
				return nil, why
			}
			return nil, ctxError(ctx, "commit sandbox "+s.id)
		}
		return nil, m.explain(opCommit, s, err, "commit sandbox "+s.id)
	}
	m.log.Info("sandbox committed", "sandbox", s.id, "layer", name, "digest", nl.Digest, "files", nl.Files,
		"setuid_kept", nl.SetuidKept, "setuid_stripped", nl.SetuidStripped, "took", time.Since(start))
	return layerProto(nl), nil
}

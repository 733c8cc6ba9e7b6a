package daemon

import (
	"context"
	"fmt"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// A foreground exec on a pty (ExecStream) has no background record, so
// ResizeProcess finds it here: each sandbox keeps its running PTY execs by
// an "e-N" id (never a background "p-N" one), from the started event until
// the command exits. The resize goes to the pty master the daemon holds.

// registerPTYExec makes a running PTY exec resizable and returns its id,
// and the func that removes it when the exec ends.
func (s *sandbox) registerPTYExec(r backend.Resizer) (string, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptyExecs == nil {
		s.ptyExecs = map[string]backend.Resizer{}
	}
	s.ptySeq++
	id := fmt.Sprintf("e-%d", s.ptySeq)
	s.ptyExecs[id] = r
	return id, func() {
		s.mu.Lock()
		delete(s.ptyExecs, id)
		s.mu.Unlock()
	}
}

// ptyExec returns the running PTY exec with this id, or nil.
func (s *sandbox) ptyExec(id string) backend.Resizer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ptyExecs[id]
}

// resizePTYExec resizes a running PTY exec; ok is false when the sandbox
// has no running PTY exec of that id (it may be a background process).
func (m *Manager) resizePTYExec(ctx context.Context, sandboxID, id string, rows, cols uint16) (ok bool, err error) {
	s, err := m.find(ctx, sandboxID)
	if err != nil {
		return true, err
	}
	r := s.ptyExec(id)
	if r == nil {
		return false, nil
	}
	if err := r.Resize(rows, cols); err != nil {
		if errdefs.CategoryOf(err) == errdefs.Conflict {
			return true, errdefs.Conflictf("exec %s of sandbox %s has exited", id, sandboxID)
		}
		return true, withCategory(err, errdefs.Internal, "resize terminal of exec "+id)
	}
	return true, nil
}

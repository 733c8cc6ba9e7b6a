package e2b

import (
	"context"
	"net/http/httptest"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// pauseManager answers the calls pause makes; the rest of Manager is not
// called (a nil embedded interface panics if it were). The real flows run
// against a daemon in test/e2e; this pins the fallback, which a node with
// CRIU never takes there.
type pauseManager struct {
	Manager
	hibernateErr error
	state        warrenv1.SandboxState
	paused       int
}

func (m *pauseManager) Get(context.Context, *warrenv1.GetRequest) (*warrenv1.Sandbox, error) {
	return &warrenv1.Sandbox{Id: "sb1", State: m.state}, nil
}

func (m *pauseManager) Hibernate(context.Context, *warrenv1.HibernateRequest) (*warrenv1.HibernateResponse, error) {
	return nil, m.hibernateErr
}

func (m *pauseManager) Pause(context.Context, *warrenv1.PauseRequest) (*warrenv1.PauseResponse, error) {
	m.paused++
	return &warrenv1.PauseResponse{}, nil
}

// TestPauseFallsBackToFreeze: pause hibernates; where the sandbox cannot
// be checkpointed now (unsupported, unavailable, conflict) it freezes it
// instead (204 either way); other errors are the answer; an already
// paused sandbox is 409, which the SDKs read as "already paused".
func TestPauseFallsBackToFreeze(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		state  warrenv1.SandboxState
		code   int
		frozen int
	}{
		{"hibernated", nil, warrenv1.SandboxState_SANDBOX_STATE_RUNNING, 204, 0},
		{"no criu", errdefs.Unsupportedf("no CRIU"), warrenv1.SandboxState_SANDBOX_STATE_RUNNING, 204, 1},
		{"busy agent", errdefs.Conflictf("agent busy"), warrenv1.SandboxState_SANDBOX_STATE_RUNNING, 204, 1},
		{"unavailable", errdefs.Unavailablef("later"), warrenv1.SandboxState_SANDBOX_STATE_RUNNING, 204, 1},
		{"internal", errdefs.Internalf("broken"), warrenv1.SandboxState_SANDBOX_STATE_RUNNING, 500, 0},
		{"already", nil, warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED, 409, 0},
	} {
		m := &pauseManager{hibernateErr: c.err, state: c.state}
		s, err := New(Config{Keys: []string{"e2b_0123456789abcdef"}, Manager: m})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("POST", "/sandboxes/sb1/pause", nil)
		req.Header.Set("X-API-Key", "e2b_0123456789abcdef")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != c.code || m.paused != c.frozen {
			t.Errorf("%s: %d, frozen %d times; want %d, %d", c.name, rec.Code, m.paused, c.code, c.frozen)
		}
	}
}

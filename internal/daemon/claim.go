package daemon

import (
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Claims make a retried create exactly-once across a cluster whose
// gateways share nothing (docs/ARCHITECTURE.md, "Retried creates"). A
// gateway retrying a create first asks every node to hold the create's
// id for its claim (CLAIM_STEP_HOLD): a node that has the id's sandbox,
// made or being made, answers it, and the retry goes there; otherwise
// the node holds the id, and until the hold ends it refuses every create
// of that id that does not carry the claim. The earlier attempt, if it
// is still on its way to some node, is refused there (Unavailable, so
// its client sends it again as a retry and finds the sandbox), and two
// retries through two gateways cannot both hold every node.

// claimHoldTTL is how long a hold fences the id. It outlives what an
// earlier attempt can still be on its way (a gateway's request sent
// before its client gave up), and a hold left by a gateway that died
// before releasing it blocks retries of that id for no longer than the
// Go client's create retry window (30 s).
const claimHoldTTL = 20 * time.Second

// maxClaimHolds bounds the holds a node keeps: holds come only from
// retries, so reaching it means expired ones are due for pruning.
const maxClaimHolds = 4096

type claimHold struct {
	claim string
	until time.Time
}

// claimStep serves a create whose claim_step is HOLD or RELEASE: it
// never makes a sandbox.
func (m *Manager) claimStep(req *warrenv1.CreateRequest) (*warrenv1.Sandbox, error) {
	claim := req.GetClaim()
	if claim == "" {
		return nil, errdefs.Invalidf("claim_step %v without a claim", req.GetClaimStep())
	}
	p, err := m.validateCreate(req)
	if err != nil {
		return nil, err
	}
	if p.id == "" {
		return nil, errdefs.Invalidf("a claim needs an id or an idempotency key")
	}
	now := time.Now()
	m.mu.Lock()
	if req.GetClaimStep() == warrenv1.ClaimStep_CLAIM_STEP_RELEASE {
		if h, ok := m.holds[p.id]; ok && h.claim == claim {
			delete(m.holds, p.id)
		}
		m.mu.Unlock()
		return &warrenv1.Sandbox{}, nil
	}
	if s := m.sandboxes[p.id]; s != nil {
		// Found: the retry goes to this node, whose create of the id
		// waits for the one under way (awaitCreated).
		m.mu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		if key := req.GetIdempotencyKey(); key != "" && s.info.GetIdempotencyKey() != key {
			return nil, errdefs.AlreadyExistsf("sandbox %s already exists", p.id)
		}
		return cloneSandbox(s.info), nil
	}
	defer m.mu.Unlock()
	if h, ok := m.holds[p.id]; ok && h.claim != claim && now.Before(h.until) {
		return nil, heldErr(p.id)
	}
	if len(m.holds) >= maxClaimHolds {
		for id, h := range m.holds {
			if !now.Before(h.until) {
				delete(m.holds, id)
			}
		}
		if len(m.holds) >= maxClaimHolds {
			return nil, errdefs.Unavailablef("too many retried creates at once on node %s", m.cfg.NodeName)
		}
	}
	m.holds[p.id] = claimHold{claim: claim, until: now.Add(claimHoldTTL)}
	return &warrenv1.Sandbox{}, nil
}

// heldLocked refuses a create of id that does not carry the claim of a
// live hold on it; the create that does takes the hold's place (the
// sandbox in the map answers later hold steps). m.mu is held.
func (m *Manager) heldLocked(id, claim string) error {
	h, ok := m.holds[id]
	if !ok {
		return nil
	}
	if h.claim != claim && time.Now().Before(h.until) {
		return heldErr(id)
	}
	delete(m.holds, id)
	return nil
}

func heldErr(id string) error {
	return errdefs.Unavailablef("sandbox %s is being created by a retry of this create through a gateway: send it again as a retry", id)
}

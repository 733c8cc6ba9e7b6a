package daemon

import (
	"context"
	"maps"
	"path/filepath"
	"strconv"
	"sync"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/caller"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/metrics"
	"github.com/warrenrl/warren/internal/netpolicy"
)

// Harness sandboxes (docs/ARCHITECTURE.md, "Harness sandboxes"): a
// sandbox created with CreateRequest.harness gets a route to the API, a
// unix socket the server listens on in the sandbox's own socket directory
// (backend.SocketDirs: /dev in the container backend). A call arriving
// there carries the harness's id (internal/caller); the server's scope
// table decides which RPCs it may make and checks that the sandbox they
// name is one of the harness's children (ParentOf). This file keeps the
// rest: the parent of a child, the cap on children, the rule that a child
// is contained at least as tightly as its harness, the route's life
// (open while the harness runs), and the deletion of the children with
// the harness, on its death, and of orphans after a restart.

// Limits of CreateRequest.harness.max_children.
const (
	DefaultMaxChildren = 32
	MaxMaxChildren     = 1024
)

// Environment of a harness: the SDKs and the CLI read WARREN_ADDR.
const (
	HarnessSocketName = "warren.sock"
	EnvHarnessAddr    = "WARREN_ADDR"
	EnvHarnessID      = "WARREN_HARNESS_ID"
)

// Router opens and closes the API routes of harness sandboxes; the
// server implements it (server.Server). OpenRoute listens on the unix
// socket path for calls of harness id; CloseRoute stops that listener,
// removes the socket file and ends the calls in flight.
type Router interface {
	OpenRoute(id, path string) error
	CloseRoute(id string)
}

// harnessParams are a harness create's checked options.
type harnessParams struct {
	maxChildren int32
	socket      string // the route's path on the host
}

// validateHarness checks a create's harness options and the caller's
// right to make the sandbox: a harness makes children only, never another
// harness (one level keeps the cap a bound on the node: a nested harness
// would multiply it). It adds the route's address to env.
func (m *Manager) validateHarness(ctx context.Context, req *warrenv1.CreateRequest, p *createParams) (*harnessParams, error) {
	h := req.GetHarness()
	if h == nil {
		return nil, nil
	}
	if parent, ok := caller.Harness(ctx); ok {
		return nil, errdefs.New(errdefs.PermissionDenied, "harness %s cannot create a harness: harnesses do not nest", parent)
	}
	n := h.GetMaxChildren()
	switch {
	case n < 0 || n > MaxMaxChildren:
		return nil, errdefs.Invalidf("harness.max_children %d out of range [0, %d] (0 = %d)", n, MaxMaxChildren, DefaultMaxChildren)
	case n == 0:
		n = DefaultMaxChildren
	}
	sd, ok := m.cfg.Backends[p.backend].(backend.SocketDirs)
	if !ok || m.cfg.Router == nil {
		return nil, errdefs.Unsupportedf("backend %s cannot route a harness to the API on this daemon", p.backend)
	}
	// The id is generated later when empty; the socket path needs it now.
	if p.id == "" {
		p.id = m.newID()
	}
	host, inside := sd.SocketDir(p.id)
	env := maps.Clone(p.env)
	if env == nil {
		env = map[string]string{}
	}
	// Over the request's: the route is where the harness's SDK must go.
	env[EnvHarnessAddr] = "unix://" + filepath.Join(inside, HarnessSocketName)
	env[EnvHarnessID] = p.id
	p.env = env
	return &harnessParams{maxChildren: n, socket: filepath.Join(host, HarnessSocketName)}, nil
}

// checkChild refuses a child whose containment is weaker than its
// harness's: more network, setuid binaries, or no user namespace where
// the harness has one. Otherwise a harness could hand itself, through a
// child it drives, what its own creator did not give it. Network groups
// are refused outright: a group would join sandboxes of the node that
// are not the harness's.
func checkChild(parent *warrenv1.Sandbox, net netpolicy.Policy, allowSetuid, userNS bool) error {
	id := parent.GetId()
	if allowSetuid && !parent.GetAllowSetuid() {
		return errdefs.New(errdefs.PermissionDenied, "harness %s has no allow_setuid: its sandboxes cannot have it", id)
	}
	if !userNS && parent.GetUserNamespace() {
		return errdefs.New(errdefs.PermissionDenied, "harness %s runs in a user namespace: its sandboxes must too", id)
	}
	return checkChildNetwork(parent, net)
}

// checkChildNetwork refuses a child network policy wider than the
// harness's: an open harness's children may have any mode, an allowlist
// harness's none or a subset of its rules, a none harness's none.
func checkChildNetwork(parent *warrenv1.Sandbox, net netpolicy.Policy) error {
	id := parent.GetId()
	if net.Group != "" {
		return errdefs.New(errdefs.PermissionDenied, "a sandbox of harness %s cannot join network group %q: groups span the node", id, net.Group)
	}
	if net.IsNone() {
		return nil
	}
	pn, err := networkPolicy("network", parent.GetNetwork())
	if err != nil {
		return err
	}
	switch {
	case pn.Mode == netpolicy.Open:
		return nil
	case pn.Mode == netpolicy.Allowlist && net.Mode == netpolicy.Allowlist:
		for _, r := range net.Allow {
			if !ruleIn(r, pn.Allow) {
				return errdefs.New(errdefs.PermissionDenied, "harness %s's allowlist has no rule %s: its sandboxes can reach only what it can", id, ruleString(r))
			}
		}
		return nil
	}
	mode := pn.Mode
	if mode == "" {
		mode = netpolicy.None
	}
	return errdefs.New(errdefs.PermissionDenied, "harness %s has network mode %s: its sandboxes cannot have mode %s", id, mode, net.Mode)
}

func ruleIn(r netpolicy.Rule, rules []netpolicy.Rule) bool {
	for _, x := range rules {
		if x == r {
			return true
		}
	}
	return false
}

func ruleString(r netpolicy.Rule) string {
	s := r.Host
	if s == "" {
		s = r.Prefix.String()
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	if r.Proto != "" {
		s += "/" + r.Proto
	}
	return s
}

// reserveChildLocked checks that harness parent may have one more child
// now: it exists, runs, and is below its cap; m.mu held (the count is of
// the map, so two creates cannot both take the last place). A harness
// being deleted or dead takes no child, which is what lets its deletion
// collect every child: a child is either in the map when the deletion
// looks, or refused here.
func (m *Manager) reserveChildLocked(parent string) error {
	ps := m.sandboxes[parent]
	if ps == nil {
		return errdefs.New(errdefs.PermissionDenied, "harness %s is gone", parent)
	}
	ps.mu.Lock()
	st, max := ps.st, ps.info.GetHarness().GetMaxChildren()
	ps.mu.Unlock()
	if st != stateRunning {
		return errdefs.Conflictf("harness %s is %s: it takes no new sandboxes", parent, stateName(st))
	}
	n := int32(0)
	for _, s := range m.sandboxes {
		if s.parent == parent {
			n++
		}
	}
	if n >= max {
		return errdefs.Exhaustedf("harness %s has %d sandboxes, its max_children", parent, n)
	}
	return nil
}

// parentInfo is a copy of harness id's record, for checkChild.
func (m *Manager) parentInfo(id string) (*warrenv1.Sandbox, error) {
	ps, err := m.lookup(id)
	if err != nil {
		return nil, errdefs.New(errdefs.PermissionDenied, "harness %s is gone", id)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return cloneSandbox(ps.info), nil
}

// ParentOf is the harness that owns sandbox id ("" for none): what the
// server's scope check asks before a harness's call on a sandbox.
func (m *Manager) ParentOf(id string) (string, error) {
	s, err := m.lookup(id)
	if err != nil {
		return "", err
	}
	return s.parent, nil // fixed at create: no lock
}

// openRoute opens harness s's route, logging a failure: the harness runs
// on without one (a restart tries again).
func (m *Manager) openRoute(s *sandbox) {
	if err := m.openRouteErr(s); err != nil {
		m.log.Error("open the API route of harness", "sandbox", s.id, "err", err)
	}
}

func (m *Manager) openRouteErr(s *sandbox) error {
	sd, ok := s.b.(backend.SocketDirs)
	if !ok || m.cfg.Router == nil {
		return errdefs.Unsupportedf("backend %s cannot route a harness to the API on this daemon", s.backendName)
	}
	host, _ := sd.SocketDir(s.id)
	return m.cfg.Router.OpenRoute(s.id, filepath.Join(host, HarnessSocketName))
}

func (m *Manager) closeRoute(s *sandbox) {
	if m.cfg.Router != nil && s.isHarness() {
		m.cfg.Router.CloseRoute(s.id)
	}
}

// isHarness: fixed at create.
func (s *sandbox) isHarness() bool { return s.harness }

// removeChildren deletes every child of harness parent, in parallel; the
// harness is DELETING, STOPPED or gone, so no child is added meanwhile
// (reserveChildLocked).
func (m *Manager) removeChildren(ctx context.Context, parent, reason string) {
	var kids []*sandbox
	m.mu.RLock()
	for _, s := range m.sandboxes {
		if s.parent == parent {
			kids = append(kids, s)
		}
	}
	m.mu.RUnlock()
	if len(kids) == 0 {
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, adoptWorkers)
	for _, k := range kids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := m.remove(ctx, k, reason); err != nil && errdefs.CategoryOf(err) != errdefs.NotFound {
				m.log.Error("delete sandbox of harness", "sandbox", k.id, "harness", parent, "err", err)
			}
		}()
	}
	wg.Wait()
	m.log.Info("deleted the sandboxes of harness", "harness", parent, "count", len(kids))
}

// harnessEnded closes the route of a harness that died and deletes its
// children; the harness's record stays (STOPPED) until it is deleted.
func (m *Manager) harnessEnded(s *sandbox) {
	if !s.isHarness() {
		return
	}
	m.closeRoute(s)
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	defer cancel()
	m.removeChildren(ctx, s.id, metrics.ReasonDead)
}

// removeOrphans deletes the children whose harness is gone or STOPPED:
// after adoption, those of a harness deleted or dead while no daemon ran
// (or whose deletion the daemon's stop cut short); every minute
// (housekeeping), those a harness's deletion failed to delete. A harness
// leaves the map only after its children were tried, and takes no child
// once it is DELETING or STOPPED, so a child of a live harness is never
// taken for an orphan.
func (m *Manager) removeOrphans() {
	live := map[string]bool{}
	var orphans []*sandbox
	all := m.snapshot()
	for _, s := range all {
		if s.isHarness() {
			s.mu.Lock()
			live[s.id] = s.st != stateStopped
			s.mu.Unlock()
		}
	}
	for _, s := range all {
		if s.parent != "" && !live[s.parent] {
			orphans = append(orphans, s)
		}
	}
	for _, s := range orphans {
		m.log.Info("deleting sandbox of a harness that is gone", "sandbox", s.id, "harness", s.parent)
		ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
		if err := m.remove(ctx, s, metrics.ReasonDead); err != nil && errdefs.CategoryOf(err) != errdefs.NotFound {
			m.log.Error("delete sandbox of a harness that is gone", "sandbox", s.id, "err", err)
		}
		cancel()
	}
}

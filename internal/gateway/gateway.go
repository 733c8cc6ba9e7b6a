// Package gateway is the cluster's API endpoint (`warren gateway`): it
// serves the node's API (internal/server over a Manager that forwards),
// places creates on nodes (internal/placement) and routes every call on a
// sandbox to the node its id names. It keeps no per-sandbox state a call
// depends on: an id starts with its node's tag (membership's metadata
// maps the tag to the node's address), so several gateways run side by
// side, and a restarted one serves at once. docs/ARCHITECTURE.md, "The
// cluster".
package gateway

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/membership"
	"github.com/warrenrl/warren/internal/placement"
)

// Members is where a gateway learns the cluster's members: a
// membership.Pool.
type Members interface {
	Members() []membership.Member
}

// Options configure New.
type Options struct {
	Name    string // the gateway's name (VersionResponse.node)
	Members Members
	// NodeToken is the bearer token of the nodes' APIs.
	NodeToken string
	// PullInterval is how often each node's report is pulled (default
	// 1s); a node that has not answered for DownAfter (default 3s) is
	// down. ListInterval (default 5s) is how often each node's sandbox
	// list is pulled, which is what is reported lost when it goes down.
	PullInterval, DownAfter, ListInterval time.Duration
	// Overcommit is placement's CPU and memory over-commit ratio.
	Overcommit float64
	Logger     *slog.Logger
}

// Gateway forwards the API to the cluster's nodes. It implements
// server.Manager.
type Gateway struct {
	o      Options
	log    *slog.Logger
	placer *placement.Placer
	nodes  nodeSet
	images imageCache
	recent recentCreates
	routes routeCache
	// syncMu makes one syncMembers at a time: the loop and the pool's
	// change notifications both call it, and two at once could each add
	// a node object for one new member.
	syncMu sync.Mutex
	// ready is closed at the first node report: before it the gateway
	// knows no node, and would answer NotFound for every sandbox and
	// empty lists (warming).
	ready     chan struct{}
	readyOnce sync.Once

	stop chan struct{}
	wg   sync.WaitGroup
	// spawnMu and closed keep background work from starting once Close
	// waits for it (a WaitGroup must not grow while it is waited on).
	spawnMu sync.Mutex
	closed  bool
}

// New starts a gateway's background pulls; Close stops them.
func New(o Options) *Gateway {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.PullInterval <= 0 {
		o.PullInterval = time.Second
	}
	if o.DownAfter <= 0 {
		o.DownAfter = 3 * o.PullInterval
	}
	if o.ListInterval <= 0 {
		o.ListInterval = 5 * time.Second
	}
	g := &Gateway{
		o: o, log: o.Logger,
		placer: placement.New(placement.Options{Overcommit: o.Overcommit}),
		nodes:  nodeSet{byNm: map[string]*node{}, byTag: map[string]*node{}},
		images: imageCache{m: map[string]imageEntry{}},
		recent: recentCreates{m: map[string]recentCreate{}},
		routes: routeCache{m: map[string]string{}, max: routeCacheMax},
		stop:   make(chan struct{}),
		ready:  make(chan struct{}),
	}
	g.wg.Add(1)
	go g.loop()
	return g
}

// Refresh re-reads the members and pulls every node's report now; the
// membership pool calls it on a change.
func (g *Gateway) Refresh() {
	g.syncMembers()
	ctx, cancel := context.WithTimeout(context.Background(), g.o.DownAfter)
	defer cancel()
	g.pull(ctx)
}

func (g *Gateway) loop() {
	defer g.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-g.stop; cancel() }()
	t := time.NewTicker(g.o.PullInterval)
	defer t.Stop()
	for {
		g.syncMembers()
		g.pull(ctx)
		g.recent.prune(3 * g.o.PullInterval)
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
	}
}

// spawn runs fn in the background, for Close to wait for, unless the
// gateway is closing (then it reports false and fn does not run).
func (g *Gateway) spawn(fn func()) bool {
	g.spawnMu.Lock()
	defer g.spawnMu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
	return true
}

// Ready is closed once the gateway has a report from a node.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// warming fails calls that need the cluster's nodes until the first
// report: Unavailable, which clients retry, rather than the NotFound or
// the empty list a gateway that knows no node yet would answer.
func (g *Gateway) warming() error {
	select {
	case <-g.ready:
		return nil
	default:
		return errdefs.Unavailablef("gateway %s is starting: no node has reported to it yet", g.o.Name)
	}
}

// Close stops the pulls.
func (g *Gateway) Close() error {
	g.spawnMu.Lock()
	g.closed = true
	g.spawnMu.Unlock()
	close(g.stop)
	g.wg.Wait()
	for _, n := range g.nodes.all() {
		_ = n.c.Close()
	}
	return nil
}

// owner finds the node of sandbox id: by its tag, or, for an id without
// one (chosen by a client, or made by a node before it joined) or whose
// tagged node is down (the sandbox may have been restored on another
// node since, `warren sandbox restore`), by asking every up node. It
// fails Unavailable, naming the node, when the sandbox's node is down.
func (g *Gateway) owner(ctx context.Context, id string) (*node, error) {
	if id == "" {
		return nil, errdefs.Invalidf("sandbox id is required")
	}
	if err := g.warming(); err != nil {
		return nil, err
	}
	var tagged *node
	if len(id) == idLen {
		if tagged = g.nodes.tagged(id[:TagLen]); tagged != nil && tagged.isUp() {
			return tagged, nil
		}
	}
	if tagged == nil {
		if name, ok := g.routes.get(id); ok {
			if n := g.nodes.get(name); n != nil && n.isUp() {
				return n, nil
			}
		}
	}
	if n := g.lookup(ctx, id, nil); n != nil {
		if tagged == nil {
			g.routes.put(id, n.name)
		}
		return n, nil
	}
	if tagged != nil {
		return nil, tagged.downErr("sandbox " + id)
	}
	// Down nodes last: one that ran it makes the error say so.
	for _, n := range g.nodes.all() {
		if !n.isUp() && n.knows(id) != nil {
			return nil, n.downErr("sandbox " + id)
		}
	}
	return nil, errdefs.NotFoundf("sandbox %s not found", id)
}

// lookup asks every up node but skip for sandbox id (one Get each, at
// once) and returns the one that has it, or nil.
func (g *Gateway) lookup(ctx context.Context, id string, skip *node) *node {
	ch := make(chan *node, 1)
	var wg sync.WaitGroup
	for _, n := range g.nodes.up() {
		if n == skip {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.sb.Get(ctx, connect.NewRequest(&warrenv1.GetRequest{Id: id})); err == nil {
				select {
				case ch <- n:
				default:
				}
			}
		}()
	}
	wg.Wait()
	select {
	case n := <-ch:
		return n
	default:
		return nil
	}
}

// moved reports whether a call on id that n answered with err should be
// tried again elsewhere: n is the id's tagged node and does not have it,
// so it may have been restored on another node. It returns that node.
func (g *Gateway) moved(ctx context.Context, id string, n *node, err error) *node {
	if connect.CodeOf(err) != connect.CodeNotFound {
		return nil
	}
	byTag := len(id) == idLen && id[:TagLen] == n.tag
	if !byTag {
		name, cached := g.routes.get(id)
		if !cached || name != n.name {
			return nil // found by asking every node: it is not elsewhere
		}
		g.routes.del(id)
	}
	m := g.lookup(ctx, id, n)
	if m != nil && !byTag {
		g.routes.put(id, m.name)
	}
	return m
}

// knows returns the sandbox id as n last listed it (or as this gateway
// made it there since), or nil.
func (n *node) knows(id string) *warrenv1.Sandbox {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.known {
		if s.GetId() == id {
			return s
		}
	}
	if m, ok := n.made[id]; ok {
		return m.sb
	}
	return nil
}

// learn adds a sandbox this gateway just made on n to what it knows n
// runs, so that it is reported lost if n goes down before its next list.
func (n *node) learn(sb *warrenv1.Sandbox) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.made == nil {
		n.made = map[string]madeSandbox{}
	}
	n.made[sb.GetId()] = madeSandbox{sb, time.Now()}
}

// unlearn forgets a sandbox deleted through this gateway that it made
// on n since n's last list.
func (n *node) unlearn(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.made, id)
}

// lastKnown is what n ran at its last list, with what was made on it
// through this gateway since.
func (n *node) lastKnown() []*warrenv1.Sandbox {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.made) == 0 {
		return n.known
	}
	out := slices.Clone(n.known)
	listed := make(map[string]bool, len(n.known))
	for _, s := range n.known {
		listed[s.GetId()] = true
	}
	for id, m := range n.made {
		if !listed[id] {
			out = append(out, m.sb)
		}
	}
	return out
}

// anyNode picks an up node for a call any node answers alike (the image
// store is shared): the least loaded by its last report.
func (g *Gateway) anyNode() (*node, error) {
	var best *node
	bestLoad := 0.0
	for _, n := range g.nodes.up() {
		n.mu.Lock()
		l := n.status.GetLoad() + float64(n.status.GetSandboxes())/1e6
		n.mu.Unlock()
		if best == nil || l < bestLoad || l == bestLoad && n.name < best.name {
			best, bestLoad = n, l
		}
	}
	if best == nil {
		return nil, errdefs.Unavailablef("no node is up")
	}
	return best, nil
}

// imageCache holds the layer digests of images for placement's locality,
// briefly: an image's layers change only when it is imported again.
type imageCache struct {
	mu sync.Mutex
	m  map[string]imageEntry
}

type imageEntry struct {
	layers     []string
	at         time.Time
	refreshing bool
}

const imageCacheTTL = 30 * time.Second

// layersOf returns the layer digests of image (nil if unknown: placement
// then goes without locality, and the node reports the error). Only an
// image's first create waits for them: an entry past its TTL is used
// while one refresh runs in the background, so a create does not pay a
// GetImage round trip every TTL per image.
func (g *Gateway) layersOf(ctx context.Context, image string) []string {
	g.images.mu.Lock()
	e, ok := g.images.m[image]
	stale := ok && time.Since(e.at) >= imageCacheTTL
	if stale && !e.refreshing {
		e.refreshing = true
		g.images.m[image] = e
		g.spawn(func() {
			cctx, cancel := context.WithTimeout(context.Background(), g.o.DownAfter)
			defer cancel()
			if _, ok := g.fetchLayers(cctx, image); !ok {
				// Removed, or no node answered: the next create asks.
				g.images.mu.Lock()
				delete(g.images.m, image)
				g.images.mu.Unlock()
			}
		})
	}
	g.images.mu.Unlock()
	if ok {
		return e.layers
	}
	layers, _ := g.fetchLayers(ctx, image)
	return layers
}

// fetchLayers asks a node for image's layers and caches them; ok is
// false, and nothing cached, when no node answers it.
func (g *Gateway) fetchLayers(ctx context.Context, image string) (_ []string, ok bool) {
	n, err := g.anyNode()
	if err != nil {
		return nil, false
	}
	res, err := n.img.GetImage(ctx, connect.NewRequest(&warrenv1.GetImageRequest{Name: image}))
	if err != nil {
		return nil, false
	}
	g.images.mu.Lock()
	g.images.m[image] = imageEntry{layers: res.Msg.GetLayers(), at: time.Now()}
	g.images.mu.Unlock()
	return res.Msg.GetLayers(), true
}

// recentCreates remembers, briefly and only in this gateway, what each
// sandbox it placed reserved: placement counts a reservation until the
// node's second report after it, so under churn (create, exec, delete at
// hundreds a second) reservations of sandboxes already gone would fill
// the node on paper. A delete through this gateway gives its sandbox's
// reservation back. Losing this map (a restart, a delete through another
// gateway) only over-counts for two report intervals; no call depends on
// it.
type recentCreates struct {
	mu sync.Mutex
	m  map[string]recentCreate
}

type recentCreate struct {
	node string
	req  placement.Request
	at   time.Time
}

func (r *recentCreates) add(id, node string, req placement.Request) {
	r.mu.Lock()
	r.m[id] = recentCreate{node, req, time.Now()}
	r.mu.Unlock()
}

func (r *recentCreates) take(id string) (recentCreate, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.m[id]
	delete(r.m, id)
	return c, ok
}

// prune forgets entries older than d: their reservations have retired.
func (r *recentCreates) prune(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.m {
		if time.Since(c.at) > d {
			delete(r.m, id)
		}
	}
}

// routeCacheMax bounds the route cache: ~100 bytes an entry.
const routeCacheMax = 1 << 20

// routeCache remembers, in this gateway only, the node of sandboxes whose
// id has no node tag (an id the client chose: the Python SDK chooses
// every id, so that a create is safe to retry), learned at create and
// at the first lookup, so that each call on one does not ask every node.
// A miss or a stale entry costs one lookup (owner, moved); nothing
// depends on it being complete, so gateways need not share it.
type routeCache struct {
	mu  sync.Mutex
	m   map[string]string
	max int
}

func (r *routeCache) get(id string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.m[id]
	return n, ok
}

func (r *routeCache) put(id, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.m) >= r.max {
		for k := range r.m { // an arbitrary victim: a miss costs one lookup
			delete(r.m, k)
			break
		}
	}
	r.m[id] = node
}

func (r *routeCache) del(id string) {
	r.mu.Lock()
	delete(r.m, id)
	r.mu.Unlock()
}

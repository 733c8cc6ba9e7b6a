package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"io"
	"maps"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/membership"
	"github.com/warrenrl/warren/internal/placement"
	"github.com/warrenrl/warren/internal/server"
)

// TagLen is the length of a node's id tag: the first TagLen characters
// of every id its sandboxes get, so that a gateway routes a call by the
// id alone. 5 characters of [a-z2-7] are 25 bits: 160 nodes named at
// random share a tag with probability ~4e-4, which the gateway reports
// (and --node-tag settles).
const TagLen = 5

// idLen is the length of an id a tagged node generates.
const idLen = TagLen + 12

var tagEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// TagOf derives a node's tag from its name.
func TagOf(name string) string {
	h := sha256.Sum256([]byte(name))
	return tagEncoding.EncodeToString(h[:])[:TagLen]
}

// node is a gateway's view of one node daemon.
type node struct {
	name, tag, api string
	c              *client.Client
	sb             warrenv1connect.SandboxServiceClient
	img            warrenv1connect.ImageServiceClient
	sys            warrenv1connect.SystemServiceClient

	mu       sync.Mutex
	member   bool      // in the gossip pool now
	up       bool      // member and reporting
	lastOK   time.Time // last answered report
	downWhy  string
	status   *warrenv1.NodeStatus
	known    []*warrenv1.Sandbox // its sandboxes at the last List pulled
	listedAt time.Time
	made     map[string]madeSandbox // by id: made through this gateway since that List began
}

type madeSandbox struct {
	sb *warrenv1.Sandbox
	at time.Time
}

func newNode(name, tag, api, token string) (*node, error) {
	c, err := client.New(api, client.WithToken(token), client.WithUserAgent("warren-gateway"))
	if err != nil {
		return nil, err
	}
	return &node{name: name, tag: tag, api: api, c: c, sb: c.SandboxService(), img: c.ImageService(), sys: c.SystemService()}, nil
}

func (n *node) isUp() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.up
}

// downErr is the error of a call on a sandbox of a down node.
func (n *node) downErr(what string) error {
	n.mu.Lock()
	why := n.downWhy
	n.mu.Unlock()
	return errdefs.Unavailablef("%s is on node %s, which is down (%s); retry when it is back", what, n.name, why)
}

// err turns a failed call to the node into the error the gateway answers
// with: the node's own code, category and message when it answered; an
// Unavailable error naming the node when it could not be reached.
func (n *node) err(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return errdefs.Wrap(errdefs.Unavailable, err, "node "+n.name+" unreachable")
	}
	code := ce.Code()
	cat := ce.Meta().Get(server.CategoryHeader)
	if cat == "" {
		// No category: the node did not answer (a reset, a refused
		// dial, a response cut short), which is the node's absence.
		if code == connect.CodeUnavailable || code == connect.CodeUnknown || code == connect.CodeCanceled && !errors.Is(err, context.Canceled) ||
			code == connect.CodeInternal && errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
			return errdefs.Unavailablef("node %s unreachable: %s", n.name, ce.Message())
		}
	}
	out := connect.NewError(code, errors.New(ce.Message()))
	if cat != "" {
		out.Meta().Set(server.CategoryHeader, cat)
	}
	return out
}

// nodeSet is the gateway's nodes, by name and by tag.
type nodeSet struct {
	mu    sync.RWMutex
	byNm  map[string]*node
	byTag map[string]*node
}

func (s *nodeSet) get(name string) *node {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byNm[name]
}

func (s *nodeSet) tagged(tag string) *node {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byTag[tag]
}

func (s *nodeSet) all() []*node {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*node, 0, len(s.byNm))
	for _, n := range s.byNm {
		out = append(out, n)
	}
	return out
}

func (s *nodeSet) up() []*node {
	var out []*node
	for _, n := range s.all() {
		if n.isUp() {
			out = append(out, n)
		}
	}
	return out
}

// sync brings the set in step with the pool's node members: new ones are
// added, members that left are marked out of the pool (kept, with the
// sandboxes last seen there, which are reported lost until it is back).
func (g *Gateway) syncMembers() {
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	members := g.o.Members.Members()
	seen := map[string]bool{}
	for _, m := range members {
		if m.Meta.Role != membership.RoleNode || m.Meta.API == "" {
			continue
		}
		seen[m.Name] = true
		n := g.nodes.get(m.Name)
		if n != nil && (n.api != m.Meta.API || n.tag != m.Meta.Tag) {
			g.log.Info("node changed its address or tag", "node", m.Name, "api", m.Meta.API, "tag", m.Meta.Tag)
			n = nil
		}
		if n == nil {
			nn, err := newNode(m.Name, m.Meta.Tag, m.Meta.API, g.o.NodeToken)
			if err != nil {
				g.log.Warn("node with a bad API address", "node", m.Name, "api", m.Meta.API, "err", err)
				continue
			}
			g.nodes.mu.Lock()
			if old := g.nodes.byNm[m.Name]; old != nil {
				old.mu.Lock()
				nn.known, nn.listedAt, nn.made = old.known, old.listedAt, old.made
				old.mu.Unlock()
				if g.nodes.byTag[old.tag] == old {
					delete(g.nodes.byTag, old.tag)
				}
			}
			if other := g.nodes.byTag[m.Meta.Tag]; other != nil && other.name != m.Name && m.Meta.Tag != "" {
				g.log.Error("two nodes share an id tag: give one --node-tag", "tag", m.Meta.Tag, "nodes", other.name+","+m.Name)
			} else if m.Meta.Tag != "" {
				g.nodes.byTag[m.Meta.Tag] = nn
			}
			g.nodes.byNm[m.Name] = nn
			g.nodes.mu.Unlock()
			g.log.Info("node joined", "node", m.Name, "api", m.Meta.API, "tag", m.Meta.Tag)
			n = nn
		}
		n.mu.Lock()
		n.member = true
		n.mu.Unlock()
	}
	for _, n := range g.nodes.all() {
		if !seen[n.name] {
			n.mu.Lock()
			was := n.member
			n.member = false
			n.mu.Unlock()
			if was {
				g.markDown(n, "left the gossip pool or failed its probes")
			}
		}
	}
}

// markDown stops placements on n and reports its sandboxes lost.
func (g *Gateway) markDown(n *node, why string) {
	n.mu.Lock()
	was := n.up
	n.up, n.downWhy = false, why
	n.mu.Unlock()
	g.placer.Down(n.name)
	if was {
		g.log.Warn("node down", "node", n.name, "why", why)
	}
}

// pull asks every member node for its report; a node that has not
// answered for DownAfter is down. A node that comes back has its
// sandboxes listed again at once (reconciled: what it still runs is
// reported as it is, what it lost is gone from the list).
func (g *Gateway) pull(ctx context.Context) {
	var wg sync.WaitGroup
	for _, n := range g.nodes.all() {
		n.mu.Lock()
		member := n.member
		n.mu.Unlock()
		if !member {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.pullNode(ctx, n)
		}()
	}
	wg.Wait()
}

func (g *Gateway) pullNode(ctx context.Context, n *node) {
	cctx, cancel := context.WithTimeout(ctx, g.o.DownAfter)
	defer cancel()
	res, err := n.sys.NodeStatus(cctx, connect.NewRequest(&warrenv1.NodeStatusRequest{}))
	now := time.Now()
	if err != nil || len(res.Msg.GetNodes()) != 1 {
		n.mu.Lock()
		stale := now.Sub(n.lastOK) > g.o.DownAfter
		n.mu.Unlock()
		if stale {
			why := "no report for " + g.o.DownAfter.String()
			if err != nil {
				why += ": " + n.err(err).Error()
			}
			g.markDown(n, why)
		}
		return
	}
	st := res.Msg.GetNodes()[0]
	n.mu.Lock()
	back := !n.up
	n.up, n.lastOK, n.status, n.downWhy = true, now, st, ""
	listDue := back || now.Sub(n.listedAt) >= g.o.ListInterval
	n.mu.Unlock()
	g.placer.Update(stateOf(n.name, st))
	g.readyOnce.Do(func() { close(g.ready) })
	if back {
		g.log.Info("node up", "node", n.name)
	}
	if listDue {
		g.relist(ctx, n)
	}
}

// relist refreshes what the gateway knows n runs: the sandboxes it
// reports lost if n goes down.
func (g *Gateway) relist(ctx context.Context, n *node) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	began := time.Now()
	res, err := n.sb.List(cctx, connect.NewRequest(&warrenv1.ListRequest{}))
	if err != nil {
		g.log.Debug("list a node's sandboxes", "node", n.name, "err", err)
		return
	}
	n.mu.Lock()
	n.known, n.listedAt = res.Msg.GetSandboxes(), time.Now()
	// What was made while the list was under way may be missing from it.
	maps.DeleteFunc(n.made, func(_ string, m madeSandbox) bool { return m.at.Before(began) })
	n.mu.Unlock()
}

func stateOf(name string, st *warrenv1.NodeStatus) placement.NodeState {
	s := placement.NodeState{
		Name: name, CPUMillis: st.GetCpuMillis(), MemoryBytes: st.GetMemoryBytes(), MaxSandboxes: int(st.GetMaxSandboxes()),
		AllocCPUMillis: st.GetAllocCpuMillis(), AllocMemoryBytes: st.GetAllocMemoryBytes(), Sandboxes: int(st.GetSandboxes()),
		Load: st.GetLoad(), Layers: st.GetLayers(), QoS: map[string]int{}, LabelCounts: map[string]int{},
	}
	for k, v := range st.GetQos() {
		s.QoS[k] = int(v)
	}
	for k, v := range st.GetLabelCounts() {
		s.LabelCounts[k] = int(v)
	}
	return s
}

func asClientErr(err error, target **client.Error) bool { return errors.As(err, target) }

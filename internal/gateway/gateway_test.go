package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/listpage"
	"github.com/warrenrl/warren/internal/membership"
	"github.com/warrenrl/warren/internal/server"
)

// peer is the node side of the protocol, in process: sandboxes in a map,
// ids with the node's tag, served by the connect handlers over HTTP.
type peer struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	warrenv1connect.UnimplementedSystemServiceHandler
	name, tag string
	mu        sync.Mutex
	sbs       map[string]*warrenv1.Sandbox
	gets      int
	seq       int
	url       string
	srv       *http.Server
	images    map[string][]string
	imageGets int
	refuse    bool // Create answers Exhausted
	creates   int
	imageGate chan struct{}
}

func newPeer(t *testing.T, name string) *peer {
	p := &peer{name: name, tag: TagOf(name), sbs: map[string]*warrenv1.Sandbox{}}
	// The node's own HTTP server: h2c, as the gateway's client speaks.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.url = "http://" + ln.Addr().String()
	p.srv = server.NewHTTPServer(httpMux(p))
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { _ = p.srv.Close() })
	return p
}

func (p *peer) Create(_ context.Context, r *connect.Request[warrenv1.CreateRequest]) (*connect.Response[warrenv1.Sandbox], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.creates++
	if p.refuse {
		return nil, server.ToConnectError(errdefs.Exhaustedf("the node's disk is below its reserve"))
	}
	p.seq++
	id := p.tag + fmt.Sprintf("%012d", p.seq)
	if r.Msg.GetId() != "" {
		id = r.Msg.GetId()
	}
	sb := &warrenv1.Sandbox{Id: id, Node: p.name, Labels: r.Msg.GetLabels(), CreatedAtUnixMs: int64(p.seq), State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING}
	p.sbs[id] = sb
	return connect.NewResponse(sb), nil
}

func (p *peer) Get(_ context.Context, r *connect.Request[warrenv1.GetRequest]) (*connect.Response[warrenv1.Sandbox], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gets++
	if sb := p.sbs[r.Msg.GetId()]; sb != nil {
		return connect.NewResponse(sb), nil
	}
	return nil, server.ToConnectError(errdefs.NotFoundf("sandbox %s not found", r.Msg.GetId()))
}

func (p *peer) Delete(_ context.Context, r *connect.Request[warrenv1.DeleteRequest]) (*connect.Response[warrenv1.DeleteResponse], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sbs[r.Msg.GetId()] == nil {
		return nil, server.ToConnectError(errdefs.NotFoundf("sandbox %s not found", r.Msg.GetId()))
	}
	delete(p.sbs, r.Msg.GetId())
	return connect.NewResponse(&warrenv1.DeleteResponse{}), nil
}

func (p *peer) Exec(_ context.Context, r *connect.Request[warrenv1.ExecRequest]) (*connect.Response[warrenv1.ExecResult], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sbs[r.Msg.GetSandboxId()] == nil {
		return nil, server.ToConnectError(errdefs.NotFoundf("sandbox %s not found", r.Msg.GetSandboxId()))
	}
	return connect.NewResponse(&warrenv1.ExecResult{Stdout: []byte(p.name)}), nil
}

func (p *peer) List(_ context.Context, r *connect.Request[warrenv1.ListRequest]) (*connect.Response[warrenv1.ListResponse], error) {
	p.mu.Lock()
	var all []*warrenv1.Sandbox
	for _, sb := range p.sbs {
		if labelsMatch(sb.GetLabels(), r.Msg.GetLabels()) {
			all = append(all, sb)
		}
	}
	p.mu.Unlock()
	listpage.Sort(all)
	res, err := listpage.Cut(all, r.Msg)
	if err != nil {
		return nil, server.ToConnectError(err)
	}
	return connect.NewResponse(res), nil
}

func (p *peer) NodeStatus(context.Context, *connect.Request[warrenv1.NodeStatusRequest]) (*connect.Response[warrenv1.NodeStatusResponse], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return connect.NewResponse(&warrenv1.NodeStatusResponse{Nodes: []*warrenv1.NodeStatus{{
		Name: p.name, Tag: p.tag, CpuMillis: 4000, MemoryBytes: 8 << 30, Sandboxes: int32(len(p.sbs)), Up: true,
	}}}), nil
}

type staticMembers struct {
	mu sync.Mutex
	m  []membership.Member
}

func (s *staticMembers) Members() []membership.Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]membership.Member(nil), s.m...)
}

func (s *staticMembers) drop(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range s.m {
		if m.Name == name {
			s.m = append(s.m[:i], s.m[i+1:]...)
			return
		}
	}
}

// The gateway routes by the id's tag, merges the nodes' pages into its
// own, and reports a gone node's sandboxes LOST and calls on them
// Unavailable naming the node, while the others' keep working.
func TestRoutingListAndLostNode(t *testing.T) {
	peers := []*peer{newPeer(t, "n0"), newPeer(t, "n1"), newPeer(t, "n2")}
	ms := &staticMembers{}
	for _, p := range peers {
		ms.m = append(ms.m, membership.Member{Name: p.name, Meta: membership.Meta{Role: membership.RoleNode, API: p.url, Tag: p.tag}})
	}
	g := New(Options{Name: "gw", Members: ms, PullInterval: 50 * time.Millisecond, DownAfter: 200 * time.Millisecond, ListInterval: 50 * time.Millisecond})
	defer g.Close()
	ctx := context.Background()
	waitUp(t, g, 3)

	var ids []string
	for i := range 12 {
		sb, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img", Labels: map[string]string{"k": "v", "i": fmt.Sprint(i)}, AntiAffinity: []string{"k"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.GetId())
	}
	for _, id := range ids {
		res, err := g.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		if n := g.nodes.tagged(id[:TagLen]); n == nil || string(res.GetStdout()) != n.name {
			t.Fatalf("exec on %s answered by %s", id, res.GetStdout())
		}
	}
	seen := map[string]bool{}
	tok := ""
	for {
		res, err := g.List(ctx, &warrenv1.ListRequest{Labels: map[string]string{"k": "v"}, PageSize: 5, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range res.GetSandboxes() {
			if seen[sb.GetId()] {
				t.Fatalf("%s listed twice", sb.GetId())
			}
			seen[sb.GetId()] = true
		}
		if tok = res.GetNextPageToken(); tok == "" {
			break
		}
	}
	if len(seen) != 12 {
		t.Fatalf("paged list: %d sandboxes, want 12", len(seen))
	}
	if _, err := g.Exec(ctx, &warrenv1.ExecRequest{SandboxId: peers[0].tag + "zzzzzzzzzzzz"}); errdefs.CategoryOf(err) != errdefs.Unknown && !isCode(err, connect.CodeNotFound) {
		t.Fatalf("exec on an unknown id of a known node: %v, want NotFound", err)
	}

	// n2 goes: it leaves the pool and its API stops answering.
	time.Sleep(100 * time.Millisecond) // a list pull of n2 with its sandboxes
	ms.drop("n2")
	peers[2].srv.Close()
	g.Refresh()
	var lostID string
	res, err := g.List(ctx, &warrenv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range res.GetSandboxes() {
		if sb.GetNode() == "n2" {
			if sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_LOST {
				t.Fatalf("%s of the gone n2 is %v", sb.GetId(), sb.GetState())
			}
			lostID = sb.GetId()
		}
	}
	if lostID == "" {
		t.Fatal("no sandbox of n2 listed (anti-affinity spread 12 over 3 nodes)")
	}
	_, err = g.Exec(ctx, &warrenv1.ExecRequest{SandboxId: lostID})
	if errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "n2") {
		t.Fatalf("exec on a sandbox of a gone node: %v, want Unavailable naming n2", err)
	}
	for range 10 {
		sb, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img"})
		if err != nil {
			t.Fatal(err)
		}
		if sb.GetNode() == "n2" {
			t.Fatal("create placed on the gone n2")
		}
	}
}

func isCode(err error, c connect.Code) bool { return connect.CodeOf(err) == c }

func waitUp(t *testing.T, g *Gateway, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(g.nodes.up()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d nodes up, want %d", len(g.nodes.up()), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitPlaceable waits until placement knows n nodes up: a node is marked
// up just before its report reaches the placer.
func waitPlaceable(t *testing.T, g *Gateway, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		up := 0
		for _, s := range g.placer.Nodes() {
			if !s.Down {
				up++
			}
		}
		if up == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d nodes up in placement, want %d", up, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func httpMux(p *peer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(p))
	mux.Handle(warrenv1connect.NewSystemServiceHandler(p))
	mux.Handle(warrenv1connect.NewImageServiceHandler(peerImages{p: p}))
	return mux
}

// peerImages is a peer's image service: GetImage of the images set in
// p.images, counted, each waiting for p.imageGate when it is set.
type peerImages struct {
	warrenv1connect.UnimplementedImageServiceHandler
	p *peer
}

func (pi peerImages) GetImage(ctx context.Context, r *connect.Request[warrenv1.GetImageRequest]) (*connect.Response[warrenv1.Image], error) {
	p := pi.p
	p.mu.Lock()
	p.imageGets++
	layers, ok := p.images[r.Msg.GetName()]
	gate := p.imageGate
	p.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if !ok {
		return nil, server.ToConnectError(errdefs.NotFoundf("image %s not found", r.Msg.GetName()))
	}
	return connect.NewResponse(&warrenv1.Image{Name: r.Msg.GetName(), Layers: layers}), nil
}

func (p *peer) BatchCreate(ctx context.Context, r *connect.Request[warrenv1.BatchCreateRequest]) (*connect.Response[warrenv1.BatchCreateResponse], error) {
	res := &warrenv1.BatchCreateResponse{}
	for range r.Msg.GetCount() {
		sb, err := p.Create(ctx, connect.NewRequest(r.Msg.GetTemplate()))
		if err != nil {
			return nil, err
		}
		res.Sandboxes = append(res.Sandboxes, sb.Msg)
	}
	return connect.NewResponse(res), nil
}

// A batch is placed at once over the nodes and made by each in one call;
// a node that died since its last report (its port refuses) costs a
// create nothing: it is placed again elsewhere and the node marked down.
func TestBatchCreateAndRefusingNode(t *testing.T) {
	peers := []*peer{newPeer(t, "n0"), newPeer(t, "n1"), newPeer(t, "n2")}
	ms := &staticMembers{}
	for _, p := range peers {
		ms.m = append(ms.m, membership.Member{Name: p.name, Meta: membership.Meta{Role: membership.RoleNode, API: p.url, Tag: p.tag}})
	}
	// Reports every minute: only a refused connection can mark a node
	// down within this test.
	g := New(Options{Name: "gw", Members: ms, PullInterval: time.Minute, DownAfter: time.Hour, Overcommit: 4})
	defer g.Close()
	ctx := context.Background()
	waitUp(t, g, 3)
	res, err := g.BatchCreate(ctx, &warrenv1.BatchCreateRequest{Template: &warrenv1.CreateRequest{Image: "img"}, Count: 30})
	if err != nil || len(res.GetSandboxes()) != 30 || len(res.GetErrors()) != 0 {
		t.Fatalf("batch of 30: %d made, errors %v, %v", len(res.GetSandboxes()), res.GetErrors(), err)
	}
	per := map[string]int{}
	for _, sb := range res.GetSandboxes() {
		per[sb.GetNode()]++
	}
	if len(per) != 3 {
		t.Fatalf("batch of 30 on %v, want all three nodes", per)
	}
	_ = peers[1].srv.Close()
	for i := range 20 {
		sb, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img"})
		if err != nil {
			t.Fatalf("create %d with n1 refusing: %v", i, err)
		}
		if sb.GetNode() == "n1" {
			t.Fatal("created on the refusing n1")
		}
	}
	if n := g.nodes.get("n1"); n.isUp() {
		t.Fatal("n1 refused a create and is still up")
	}
}

// A node's answer keeps its code, category and message through the
// gateway; a node that cannot be reached is Unavailable, naming it.
func TestNodeErrors(t *testing.T) {
	p := newPeer(t, "n0")
	n, err := newNode("n0", p.tag, p.url, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = call(context.Background(), n, n.sb.Get, &warrenv1.GetRequest{Id: "nope"})
	ce := server.ToConnectError(err).(*connect.Error)
	if ce.Code() != connect.CodeNotFound || ce.Meta().Get(server.CategoryHeader) != "not_found" || !strings.Contains(ce.Message(), "nope") {
		t.Fatalf("a node's NotFound through the gateway: %v %v", ce.Code(), ce)
	}
	_ = p.srv.Close()
	_, err = call(context.Background(), n, n.sb.Get, &warrenv1.GetRequest{Id: "nope"})
	if errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "n0") {
		t.Fatalf("an unreachable node: %v, want Unavailable naming n0", err)
	}
}

// A gateway that no node has reported to yet answers Unavailable, which
// clients retry, not NotFound or an empty list.
func TestWarmingIsUnavailable(t *testing.T) {
	g := New(Options{Name: "gw", Members: &staticMembers{}, PullInterval: time.Hour})
	defer g.Close()
	ctx := context.Background()
	_, err := g.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "abcdeabcdeabcdeab"})
	if errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("exec on a warming gateway: %v", err)
	}
	if _, err := g.List(ctx, &warrenv1.ListRequest{}); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("list on a warming gateway: %v", err)
	}
	if _, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img"}); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("create on a warming gateway: %v", err)
	}
}

// A sandbox whose id the client chose (no node tag) is found by asking
// the nodes once at most: the gateway that created it, or found it, goes
// straight to its node after that.
func TestClientChosenIDsRouteWithoutFanOut(t *testing.T) {
	peers := []*peer{newPeer(t, "n0"), newPeer(t, "n1"), newPeer(t, "n2")}
	ms := &staticMembers{}
	for _, p := range peers {
		ms.m = append(ms.m, membership.Member{Name: p.name, Meta: membership.Meta{Role: membership.RoleNode, API: p.url, Tag: p.tag}})
	}
	gets := func() int {
		n := 0
		for _, p := range peers {
			p.mu.Lock()
			n += p.gets
			p.mu.Unlock()
		}
		return n
	}
	opts := Options{Members: ms, PullInterval: time.Minute, DownAfter: time.Hour, Overcommit: 4}
	a, b := New(opts), New(opts)
	defer a.Close()
	defer b.Close()
	waitUp(t, a, 3)
	waitUp(t, b, 3)
	ctx := context.Background()
	if _, err := a.Create(ctx, &warrenv1.CreateRequest{Id: "clientchosenid23", Image: "img"}); err != nil {
		t.Fatal(err)
	}
	before := gets()
	for range 5 {
		if _, err := a.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "clientchosenid23"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := gets() - before; got != 0 {
		t.Fatalf("the creating gateway asked the nodes %d times", got)
	}
	for range 5 {
		if _, err := b.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "clientchosenid23"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := gets() - before; got != 3 {
		t.Fatalf("another gateway asked the nodes %d times for 5 calls, want one lookup (3 Gets)", got)
	}
}

// Only an image's first create waits for its layers (GetImage): past the
// cache's TTL a create places with the layers it has while one refresh
// runs in the background.
func TestImageLayersRefreshedInBackground(t *testing.T) {
	p := newPeer(t, "n0")
	p.images = map[string][]string{"img": {"sha256:a"}}
	ms := &staticMembers{m: []membership.Member{{Name: p.name, Meta: membership.Meta{Role: membership.RoleNode, API: p.url, Tag: p.tag}}}}
	g := New(Options{Name: "gw", Members: ms, PullInterval: 50 * time.Millisecond})
	defer g.Close()
	waitPlaceable(t, g, 1)
	ctx := context.Background()
	gets := func() int { p.mu.Lock(); defer p.mu.Unlock(); return p.imageGets }
	if _, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img"}); err != nil || gets() != 1 {
		t.Fatalf("first create: %v, %d GetImage calls", err, gets())
	}
	g.images.mu.Lock()
	e := g.images.m["img"]
	e.at = time.Now().Add(-2 * imageCacheTTL)
	g.images.m["img"] = e
	g.images.mu.Unlock()
	gate := make(chan struct{})
	p.mu.Lock()
	p.images["img"] = []string{"sha256:a", "sha256:b"}
	p.imageGate = gate
	p.mu.Unlock()
	// The refresh is held at the node: creates go on meanwhile.
	for range 3 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := g.Create(cctx, &warrenv1.CreateRequest{Image: "img"})
		cancel()
		if err != nil {
			t.Fatalf("create past the TTL while the refresh waits: %v", err)
		}
	}
	if gets() != 2 {
		t.Fatalf("%d GetImage calls, want 2 (one refresh)", gets())
	}
	close(gate)
	deadline := time.Now().Add(5 * time.Second)
	for {
		g.images.mu.Lock()
		e := g.images.m["img"]
		g.images.mu.Unlock()
		if len(e.layers) == 2 && !e.refreshing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("layers not refreshed: %+v", e)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A node that refuses creates (Exhausted: its disk below the reserve,
// which its report does not say) costs a create one more placement, not
// the create: the gateway places it elsewhere and skips that node until
// its next report.
func TestCreateRefusedByAFullNodeIsPlacedElsewhere(t *testing.T) {
	full, ok := newPeer(t, "n0"), newPeer(t, "n1")
	full.refuse = true
	ms := &staticMembers{}
	for _, p := range []*peer{full, ok} {
		ms.m = append(ms.m, membership.Member{Name: p.name, Meta: membership.Meta{Role: membership.RoleNode, API: p.url, Tag: p.tag}})
	}
	// Reports far apart: the skip lasts until the next one.
	g := New(Options{Name: "gw", Members: ms, PullInterval: time.Hour})
	defer g.Close()
	waitPlaceable(t, g, 2)
	ctx := context.Background()
	for i := range 10 {
		sb, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img"})
		if err != nil || sb.GetNode() != "n1" {
			t.Fatalf("create %d with n0 refusing: %v %v", i, sb, err)
		}
	}
	full.mu.Lock()
	tried := full.creates
	full.mu.Unlock()
	if tried > 1 {
		t.Fatalf("the refusing node was sent %d creates, want at most 1", tried)
	}
	// Back at its next report.
	full.mu.Lock()
	full.refuse = false
	full.mu.Unlock()
	g.Refresh()
	seen := map[string]bool{}
	for range 20 {
		sb, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img"})
		if err != nil {
			t.Fatal(err)
		}
		seen[sb.GetNode()] = true
	}
	if !seen["n0"] {
		t.Fatalf("n0 got no create after its report: %v", seen)
	}
}

// A sandbox made through the gateway on a node that goes down before the
// gateway lists that node again is reported LOST (List, Get) and calls
// on it fail Unavailable naming the node; one deleted through the
// gateway meanwhile is not reported.
func TestMadeSandboxOfANodeDownBeforeItsListIsLost(t *testing.T) {
	p := newPeer(t, "n0")
	ms := &staticMembers{m: []membership.Member{{Name: p.name, Meta: membership.Meta{Role: membership.RoleNode, API: p.url, Tag: p.tag}}}}
	g := New(Options{Name: "gw", Members: ms, PullInterval: 50 * time.Millisecond, DownAfter: 200 * time.Millisecond, ListInterval: time.Hour})
	defer g.Close()
	ctx := context.Background()
	waitUp(t, g, 1)
	kept, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img"})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := g.Create(ctx, &warrenv1.CreateRequest{Image: "img", Node: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Delete(ctx, &warrenv1.DeleteRequest{Id: gone.GetId()}); err != nil {
		t.Fatal(err)
	}
	ms.drop("n0")
	p.srv.Close()
	g.Refresh()
	res, err := g.List(ctx, &warrenv1.ListRequest{})
	if err != nil || len(res.GetSandboxes()) != 1 || res.GetSandboxes()[0].GetId() != kept.GetId() ||
		res.GetSandboxes()[0].GetState() != warrenv1.SandboxState_SANDBOX_STATE_LOST {
		t.Fatalf("list with n0 down: %v %v, want %s LOST only", res.GetSandboxes(), err, kept.GetId())
	}
	if sb, err := g.Get(ctx, &warrenv1.GetRequest{Id: kept.GetId()}); err != nil || sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_LOST {
		t.Fatalf("get: %v %v, want LOST", sb, err)
	}
	_, err = g.Exec(ctx, &warrenv1.ExecRequest{SandboxId: kept.GetId()})
	if errdefs.CategoryOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "n0") {
		t.Fatalf("exec: %v, want Unavailable naming n0", err)
	}
}

package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
	"github.com/warrenrl/warren/internal/daemon"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/listpage"
	"github.com/warrenrl/warren/internal/placement"
	"github.com/warrenrl/warren/internal/sandboxfs"
	"github.com/warrenrl/warren/internal/server"
)

var _ server.Manager = (*Gateway)(nil)
var _ server.StepRecorder = (*Gateway)(nil)

type unaryFn[Req, Res any] func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error)
type streamFn[Req, Res any] func(context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Res], error)

// call forwards req to n.
func call[Req, Res any](ctx context.Context, n *node, fn unaryFn[Req, Res], req *Req) (*Res, error) {
	res, err := fn(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, n.err(err)
	}
	return res.Msg, nil
}

// stream forwards req to n and each message of its answer to send.
func stream[Req, Res any](ctx context.Context, n *node, fn streamFn[Req, Res], req *Req, send func(*Res) error) error {
	st, err := fn(ctx, connect.NewRequest(req))
	if err != nil {
		return n.err(err)
	}
	defer st.Close()
	for st.Receive() {
		if err := send(st.Msg()); err != nil {
			return err
		}
	}
	if err := st.Err(); err != nil {
		return n.err(err)
	}
	return nil
}

// bySandbox forwards a call on sandbox id to its node.
func bySandbox[Req, Res any](g *Gateway, ctx context.Context, id string, req *Req, pick func(warrenv1connect.SandboxServiceClient) unaryFn[Req, Res]) (*Res, error) {
	n, err := g.owner(ctx, id)
	if err != nil {
		return nil, err
	}
	res, err := call(ctx, n, pick(n.sb), req)
	if m := g.moved(ctx, id, n, err); m != nil {
		return call(ctx, m, pick(m.sb), req)
	}
	return res, err
}

func streamBySandbox[Req, Res any](g *Gateway, ctx context.Context, id string, req *Req, send func(*Res) error, pick func(warrenv1connect.SandboxServiceClient) streamFn[Req, Res]) error {
	n, err := g.owner(ctx, id)
	if err != nil {
		return err
	}
	sent := false
	err = stream(ctx, n, pick(n.sb), req, func(m *Res) error { sent = true; return send(m) })
	if !sent {
		if m := g.moved(ctx, id, n, err); m != nil {
			return stream(ctx, m, pick(m.sb), req, send)
		}
	}
	return err
}

// onAny forwards an image call to any up node: the image store is shared.
func onAny[Req, Res any](g *Gateway, ctx context.Context, req *Req, pick func(warrenv1connect.ImageServiceClient) unaryFn[Req, Res]) (*Res, error) {
	n, err := g.anyNode()
	if err != nil {
		return nil, err
	}
	return call(ctx, n, pick(n.img), req)
}

// defaultMemoryBytes is what a node gives a create that asks for no
// memory limit (daemon.Config.DefaultMemoryBytes), which placement counts.
const defaultMemoryBytes = 512 << 20

func (g *Gateway) placeRequest(ctx context.Context, req *warrenv1.CreateRequest) placement.Request {
	r := placement.Request{
		CPUMillis:   req.GetResources().GetCpuMillis(),
		MemoryBytes: req.GetResources().GetMemoryBytes(),
		Layers:      g.layersOf(ctx, req.GetImage()),
		QoS:         req.GetQos(),
	}
	if r.QoS == "" {
		r.QoS = "be" // the node's default class, which it reports so
	}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = defaultMemoryBytes
	}
	for _, k := range req.GetAntiAffinity() {
		if v, ok := req.GetLabels()[k]; ok {
			r.AntiAffinity = append(r.AntiAffinity, k+"="+v)
		}
	}
	return r
}

// Create places the sandbox (or takes the node the request names) and
// creates it there. A retried create is first claimed on every node
// (claimRetry), so that it makes one sandbox with the attempt before it.
func (g *Gateway) Create(ctx context.Context, req *warrenv1.CreateRequest) (*warrenv1.Sandbox, error) {
	if err := g.warming(); err != nil {
		return nil, err
	}
	if req.GetClaim() != "" || req.GetClaimStep() != warrenv1.ClaimStep_CLAIM_STEP_CREATE {
		return nil, errdefs.Invalidf("claim and claim_step are the gateway's: a client does not set them")
	}
	// The node validates the request: one place decides what is valid.
	if name := req.GetNode(); name != "" {
		n := g.nodes.get(name)
		if n == nil {
			return nil, errdefs.NotFoundf("no node %q in the cluster", name)
		}
		if !n.isUp() {
			return nil, n.downErr("the create")
		}
		sb, err := call(ctx, n, n.sb.Create, req)
		if err == nil {
			n.learn(sb)
		}
		return sb, err
	}
	if !req.GetRetry() || req.GetId() == "" && req.GetIdempotencyKey() == "" {
		return g.place(ctx, req)
	}
	req = proto.Clone(req).(*warrenv1.CreateRequest)
	req.Claim = newClaim()
	n, err := g.claimRetry(ctx, req)
	var sb *warrenv1.Sandbox
	switch {
	case err != nil:
	case n != nil:
		// The node answers with the sandbox the earlier attempt made
		// (or makes it, if that one failed).
		if sb, err = call(ctx, n, n.sb.Create, req); err == nil {
			n.learn(sb)
		}
	default:
		sb, err = g.place(ctx, req)
	}
	if err != nil {
		// The next retry must not find its own id held by this claim.
		g.releaseClaim(req)
		return nil, err
	}
	// The holds stay until they end (daemon.claimHoldTTL): an earlier
	// attempt still on its way to another node is refused there.
	return sb, nil
}

// place places req on a node and creates it there. A node that died
// since its last report refuses the connection: the create never reached
// it, so it is placed again elsewhere (the node is marked down at once
// instead of after --down-after).
func (g *Gateway) place(ctx context.Context, req *warrenv1.CreateRequest) (*warrenv1.Sandbox, error) {
	r := g.placeRequest(ctx, req)
	for try := 0; ; try++ {
		name, err := g.placer.Place(r)
		if err != nil {
			return nil, err
		}
		n := g.nodes.get(name)
		if n == nil {
			g.placer.Release(name, r)
			return nil, errdefs.Unavailablef("node %s left the cluster", name)
		}
		res, err := n.sb.Create(ctx, connect.NewRequest(req))
		if err != nil {
			g.placer.Release(name, r)
			if refused(err) && try < createRetries {
				g.markDown(n, "refused a connection")
				continue
			}
			if full(err) && try < createRetries {
				// The node takes no sandbox now for a reason its report
				// does not carry (its disk below the reserve): placement
				// skips it until its next report, and this create goes
				// elsewhere.
				g.placer.Down(name)
				g.log.Warn("node refused a create: skipped until its next report", "node", name, "err", err)
				continue
			}
			return nil, n.err(err)
		}
		sb := res.Msg
		g.recent.add(sb.GetId(), name, r)
		if len(sb.GetId()) != idLen || sb.GetId()[:TagLen] != n.tag {
			g.routes.put(sb.GetId(), name)
		}
		n.learn(sb)
		return sb, nil
	}
}

// newClaim is a retried create's claim: random, so that two gateways
// (or two retries through one) never share one.
func newClaim() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// claimRetry asks every up node at once to hold the id of req, a retried
// create carrying its claim (daemon/claim.go), and returns the node that
// already has that sandbox (made, or being made by an earlier attempt),
// or nil when every node held the id for the claim: the create may then
// be placed anew, since an earlier attempt still on its way is refused
// wherever it arrives. It fails Unavailable when a node could not answer
// or holds the id for another claim (another retry of the same create),
// or when a down node last listed the sandbox: placing it anew could
// then make a second.
func (g *Gateway) claimRetry(ctx context.Context, req *warrenv1.CreateRequest) (*node, error) {
	idOn := func(n *node) string {
		if req.GetId() != "" {
			return req.GetId()
		}
		if n.tag == "" {
			return ""
		}
		return daemon.IDForKey(n.tag, req.GetIdempotencyKey())
	}
	hold := proto.Clone(req).(*warrenv1.CreateRequest)
	hold.ClaimStep = warrenv1.ClaimStep_CLAIM_STEP_HOLD
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		found *node
		errs  []error
	)
	for _, n := range g.nodes.all() {
		if !n.isUp() {
			if id := idOn(n); id != "" && n.knows(id) != nil {
				return nil, n.downErr("sandbox " + id + " of this create")
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := n.sb.Create(ctx, connect.NewRequest(hold))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, n.err(err))
			case res.Msg.GetId() != "":
				found = n
			}
		}()
	}
	wg.Wait()
	if found != nil {
		return found, nil
	}
	for _, err := range errs {
		if verdict(err) {
			return nil, err // the node's verdict on the request (invalid, the id taken)
		}
	}
	if len(errs) > 0 {
		// That node may have it, or another retry holds it: placing it
		// now could make two.
		return nil, errdefs.Wrap(errdefs.Unavailable, errs[0], "claim the id of a retried create on every node")
	}
	return nil, nil
}

// verdict reports a node's answer on the request itself (invalid, the id
// taken, ...), as opposed to its absence or a transient failure.
func verdict(err error) bool {
	cat := errdefs.CategoryOf(err).String()
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Meta().Get(server.CategoryHeader) != "" {
		cat = ce.Meta().Get(server.CategoryHeader)
	}
	switch cat {
	case errdefs.Unavailable.String(), errdefs.Internal.String(), errdefs.Unknown.String(), "":
		return false
	}
	return true
}

// releaseClaim drops the holds of a retried create that failed, in the
// background: a node that misses it lets the hold end by itself.
func (g *Gateway) releaseClaim(req *warrenv1.CreateRequest) {
	rel := proto.Clone(req).(*warrenv1.CreateRequest)
	rel.ClaimStep = warrenv1.ClaimStep_CLAIM_STEP_RELEASE
	for _, n := range g.nodes.up() {
		g.spawn(func() {
			ctx, cancel := context.WithTimeout(context.Background(), g.o.DownAfter)
			defer cancel()
			_, _ = n.sb.Create(ctx, connect.NewRequest(rel))
		})
	}
}

// createRetries bounds the placements of one create on nodes that
// refuse connections or creates.
const createRetries = 2

// full reports a node's answer that it takes no sandbox now (Exhausted).
func full(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Meta().Get(server.CategoryHeader) == errdefs.Exhausted.String()
}

// refused reports an error of a call that never reached the node: no
// connection, or (EPIPE) a kept-alive one the node closed before the
// request was written, as a node killed since the last call does.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, syscall.EPIPE)
}

// BatchCreate places all count sandboxes at once, then asks each node
// for its share in one call.
func (g *Gateway) BatchCreate(ctx context.Context, req *warrenv1.BatchCreateRequest) (*warrenv1.BatchCreateResponse, error) {
	if err := g.warming(); err != nil {
		return nil, err
	}
	if err := daemon.ValidBatch(req); err != nil {
		return nil, err
	}
	t := req.GetTemplate()
	var names []string
	r := g.placeRequest(ctx, t)
	if t.GetNode() != "" {
		names = slices.Repeat([]string{t.GetNode()}, int(req.GetCount()))
	} else {
		var err error
		if names, err = g.placer.PlaceN(r, int(req.GetCount())); err != nil {
			return nil, err
		}
	}
	share := map[string]int32{}
	for _, nm := range names {
		share[nm]++
	}
	var (
		mu   sync.Mutex
		resp = &warrenv1.BatchCreateResponse{}
		wg   sync.WaitGroup
	)
	for name, k := range share {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := g.nodes.get(name)
			var res *warrenv1.BatchCreateResponse
			var err error
			switch {
			case n == nil:
				err = errdefs.NotFoundf("no node %q in the cluster", name)
			case !n.isUp():
				err = n.downErr("the create")
			default:
				res, err = call(ctx, n, n.sb.BatchCreate, &warrenv1.BatchCreateRequest{Template: t, Count: k})
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				for range k {
					resp.Errors = append(resp.Errors, fmt.Sprintf("node %s: %v", name, err))
				}
				if t.GetNode() == "" {
					for range k {
						g.placer.Release(name, r)
					}
				}
				return
			}
			resp.Sandboxes = append(resp.Sandboxes, res.GetSandboxes()...)
			for _, sb := range res.GetSandboxes() {
				if t.GetNode() == "" {
					g.recent.add(sb.GetId(), name, r)
				}
				n.learn(sb)
			}
			for _, e := range res.GetErrors() {
				resp.Errors = append(resp.Errors, fmt.Sprintf("node %s: %s", name, e))
				if t.GetNode() == "" {
					g.placer.Release(name, r)
				}
			}
		}()
	}
	wg.Wait()
	return resp, nil
}

// Get answers from the owner; a sandbox of a down node is reported as
// last seen, LOST.
func (g *Gateway) Get(ctx context.Context, req *warrenv1.GetRequest) (*warrenv1.Sandbox, error) {
	n, err := g.owner(ctx, req.GetId())
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.Unavailable {
			for _, d := range g.nodes.all() {
				if sb := d.knows(req.GetId()); sb != nil && !d.isUp() {
					return lost(sb, d), nil
				}
			}
		}
		return nil, err
	}
	sb, err := call(ctx, n, n.sb.Get, req)
	if m := g.moved(ctx, req.GetId(), n, err); m != nil {
		return call(ctx, m, m.sb.Get, req)
	}
	return sb, err
}

func lost(sb *warrenv1.Sandbox, n *node) *warrenv1.Sandbox {
	sb = proto.Clone(sb).(*warrenv1.Sandbox)
	sb.State = warrenv1.SandboxState_SANDBOX_STATE_LOST
	n.mu.Lock()
	sb.DeadReason = "node " + n.name + " is down: " + n.downWhy
	n.mu.Unlock()
	return sb
}

// List asks every up node for the page after the token, merges the pages
// (each sorted the same way) with the lost sandboxes of down nodes, and
// cuts the merged list to the page: the page token works the same on a
// node and here, so no state is kept between pages.
func (g *Gateway) List(ctx context.Context, req *warrenv1.ListRequest) (*warrenv1.ListResponse, error) {
	if err := g.warming(); err != nil {
		return nil, err
	}
	var (
		mu   sync.Mutex
		all  []*warrenv1.Sandbox
		wg   sync.WaitGroup
		errs []error
	)
	add := func(n *node) {
		for _, sb := range n.lastKnown() {
			if ok, _ := listpage.After(sb, req.GetPageToken()); ok && labelsMatch(sb.GetLabels(), req.GetLabels()) {
				all = append(all, lost(sb, n))
			}
		}
	}
	for _, n := range g.nodes.all() {
		if !n.isUp() {
			mu.Lock()
			add(n)
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := call(ctx, n, n.sb.List, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if errdefs.CategoryOf(err) == errdefs.Unavailable {
					add(n)
					return
				}
				errs = append(errs, err)
				return
			}
			all = append(all, res.GetSandboxes()...)
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	listpage.Sort(all)
	return listpage.Cut(all, req)
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// Delete gives back the placement reservation of a sandbox this gateway
// placed recently (recentCreates).
func (g *Gateway) Delete(ctx context.Context, req *warrenv1.DeleteRequest) (*warrenv1.DeleteResponse, error) {
	res, err := bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.DeleteRequest, warrenv1.DeleteResponse] {
		return c.Delete
	})
	if err == nil {
		if c, ok := g.recent.take(req.GetId()); ok {
			g.placer.Release(c.node, c.req)
		}
		id := req.GetId()
		var n *node
		if len(id) == idLen {
			n = g.nodes.tagged(id[:TagLen])
		}
		if name, ok := g.routes.get(id); n == nil && ok {
			n = g.nodes.get(name)
		}
		if n != nil {
			n.unlearn(id)
		}
		g.routes.del(id)
	}
	return res, err
}

func (g *Gateway) ExtendTimeout(ctx context.Context, req *warrenv1.ExtendTimeoutRequest) (*warrenv1.Sandbox, error) {
	return bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ExtendTimeoutRequest, warrenv1.Sandbox] {
		return c.ExtendTimeout
	})
}

func (g *Gateway) UpdateSandbox(ctx context.Context, req *warrenv1.UpdateSandboxRequest) (*warrenv1.Sandbox, error) {
	return bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.UpdateSandboxRequest, warrenv1.Sandbox] {
		return c.UpdateSandbox
	})
}

func (g *Gateway) Exec(ctx context.Context, req *warrenv1.ExecRequest) (*warrenv1.ExecResult, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ExecRequest, warrenv1.ExecResult] {
		return c.Exec
	})
}

func (g *Gateway) ExecStream(ctx context.Context, req *warrenv1.ExecRequest, send func(*warrenv1.ExecEvent) error) error {
	return streamBySandbox(g, ctx, req.GetSandboxId(), req, send, func(c warrenv1connect.SandboxServiceClient) streamFn[warrenv1.ExecRequest, warrenv1.ExecEvent] {
		return c.ExecStream
	})
}

func (g *Gateway) StartProcess(ctx context.Context, req *warrenv1.ExecRequest) (*warrenv1.ProcessInfo, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ExecRequest, warrenv1.ProcessInfo] {
		return c.StartProcess
	})
}

func (g *Gateway) ListProcesses(ctx context.Context, req *warrenv1.ListProcessesRequest) (*warrenv1.ListProcessesResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ListProcessesRequest, warrenv1.ListProcessesResponse] {
		return c.ListProcesses
	})
}

func (g *Gateway) WaitProcess(ctx context.Context, req *warrenv1.WaitProcessRequest) (*warrenv1.ExecResult, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.WaitProcessRequest, warrenv1.ExecResult] {
		return c.WaitProcess
	})
}

func (g *Gateway) SignalProcess(ctx context.Context, req *warrenv1.SignalProcessRequest) (*warrenv1.SignalProcessResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.SignalProcessRequest, warrenv1.SignalProcessResponse] {
		return c.SignalProcess
	})
}

func (g *Gateway) WriteStdin(ctx context.Context, req *warrenv1.WriteStdinRequest) (*warrenv1.WriteStdinResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.WriteStdinRequest, warrenv1.WriteStdinResponse] {
		return c.WriteStdin
	})
}

func (g *Gateway) AttachProcess(ctx context.Context, req *warrenv1.AttachProcessRequest, send func(*warrenv1.ProcessEvent) error) error {
	return streamBySandbox(g, ctx, req.GetSandboxId(), req, send, func(c warrenv1connect.SandboxServiceClient) streamFn[warrenv1.AttachProcessRequest, warrenv1.ProcessEvent] {
		return c.AttachProcess
	})
}

func (g *Gateway) ResizeProcess(ctx context.Context, req *warrenv1.ResizeProcessRequest) (*warrenv1.ResizeProcessResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ResizeProcessRequest, warrenv1.ResizeProcessResponse] {
		return c.ResizeProcess
	})
}

func (g *Gateway) WriteFile(ctx context.Context, req *warrenv1.WriteFileRequest) (*warrenv1.WriteFileResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.WriteFileRequest, warrenv1.WriteFileResponse] {
		return c.WriteFile
	})
}

func (g *Gateway) ReadFile(ctx context.Context, req *warrenv1.ReadFileRequest) (*warrenv1.ReadFileResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ReadFileRequest, warrenv1.ReadFileResponse] {
		return c.ReadFile
	})
}

func (g *Gateway) ListFiles(ctx context.Context, req *warrenv1.ListFilesRequest) (*warrenv1.ListFilesResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ListFilesRequest, warrenv1.ListFilesResponse] {
		return c.ListFiles
	})
}

func (g *Gateway) StatFile(ctx context.Context, req *warrenv1.StatFileRequest) (*warrenv1.FileInfo, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.StatFileRequest, warrenv1.FileInfo] {
		return c.StatFile
	})
}

func (g *Gateway) WatchDir(ctx context.Context, req *warrenv1.WatchDirRequest, send func(*warrenv1.WatchDirEvent) error) error {
	return streamBySandbox(g, ctx, req.GetSandboxId(), req, send, func(c warrenv1connect.SandboxServiceClient) streamFn[warrenv1.WatchDirRequest, warrenv1.WatchDirEvent] {
		return c.WatchDir
	})
}

func (g *Gateway) SandboxStats(ctx context.Context, req *warrenv1.SandboxStatsRequest) (*warrenv1.SandboxStatsResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.SandboxStatsRequest, warrenv1.SandboxStatsResponse] {
		return c.SandboxStats
	})
}

func (g *Gateway) MakeDir(ctx context.Context, req *warrenv1.MakeDirRequest) (*warrenv1.MakeDirResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.MakeDirRequest, warrenv1.MakeDirResponse] {
		return c.MakeDir
	})
}

func (g *Gateway) RemoveFile(ctx context.Context, req *warrenv1.RemoveFileRequest) (*warrenv1.RemoveFileResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.RemoveFileRequest, warrenv1.RemoveFileResponse] {
		return c.RemoveFile
	})
}

func (g *Gateway) CommitSandbox(ctx context.Context, req *warrenv1.CommitSandboxRequest) (*warrenv1.Layer, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.CommitSandboxRequest, warrenv1.Layer] {
		return c.CommitSandbox
	})
}

func (g *Gateway) ListSandboxEvents(ctx context.Context, req *warrenv1.ListSandboxEventsRequest) (*warrenv1.ListSandboxEventsResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ListSandboxEventsRequest, warrenv1.ListSandboxEventsResponse] {
		return c.ListSandboxEvents
	})
}

func (g *Gateway) ReadTrajectory(ctx context.Context, req *warrenv1.ReadTrajectoryRequest) (*warrenv1.ReadTrajectoryResponse, error) {
	return bySandbox(g, ctx, req.GetSandboxId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ReadTrajectoryRequest, warrenv1.ReadTrajectoryResponse] {
		return c.ReadTrajectory
	})
}

func (g *Gateway) Pause(ctx context.Context, req *warrenv1.PauseRequest) (*warrenv1.PauseResponse, error) {
	return bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.PauseRequest, warrenv1.PauseResponse] {
		return c.Pause
	})
}

func (g *Gateway) Resume(ctx context.Context, req *warrenv1.ResumeRequest) (*warrenv1.ResumeResponse, error) {
	return bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ResumeRequest, warrenv1.ResumeResponse] {
		return c.Resume
	})
}

func (g *Gateway) Hibernate(ctx context.Context, req *warrenv1.HibernateRequest) (*warrenv1.HibernateResponse, error) {
	return bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.HibernateRequest, warrenv1.HibernateResponse] {
		return c.Hibernate
	})
}

// Restore resumes the sandbox on its node when that is up (Restore is
// Resume there); when it is down, the sandbox's checkpoint (in a
// checkpoint directory the nodes share) is restored on a node placement
// picks. Calls on it then find it by asking the nodes (owner).
func (g *Gateway) Restore(ctx context.Context, req *warrenv1.RestoreRequest) (*warrenv1.ResumeResponse, error) {
	id := req.GetId()
	if n, err := g.owner(ctx, id); err == nil {
		return call(ctx, n, n.sb.Restore, req)
	} else if errdefs.CategoryOf(err) != errdefs.Unavailable && errdefs.CategoryOf(err) != errdefs.NotFound {
		return nil, err
	}
	r := placement.Request{MemoryBytes: defaultMemoryBytes}
	name, err := g.placer.Place(r)
	if err != nil {
		return nil, err
	}
	n := g.nodes.get(name)
	if n == nil {
		g.placer.Release(name, r)
		return nil, errdefs.Unavailablef("node %s left the cluster", name)
	}
	res, err := call(ctx, n, n.sb.Restore, req)
	if err != nil {
		g.placer.Release(name, r)
	}
	return res, err
}

// Fork runs on the source's node: the fork shares its memory image.
func (g *Gateway) Fork(ctx context.Context, req *warrenv1.ForkRequest) (*warrenv1.ForkResponse, error) {
	return bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ForkRequest, warrenv1.ForkResponse] {
		return c.Fork
	})
}

func (g *Gateway) PauseByLabel(ctx context.Context, req *warrenv1.PauseByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error {
	return g.byLabel(ctx, req.GetLabels(), send, func(ctx context.Context, n *node, send func(*warrenv1.ByLabelEvent) error) error {
		return stream(ctx, n, n.sb.PauseByLabel, req, send)
	})
}

func (g *Gateway) ResumeByLabel(ctx context.Context, req *warrenv1.ResumeByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error {
	return g.byLabel(ctx, req.GetLabels(), send, func(ctx context.Context, n *node, send func(*warrenv1.ByLabelEvent) error) error {
		return stream(ctx, n, n.sb.ResumeByLabel, req, send)
	})
}

func (g *Gateway) HibernateByLabel(ctx context.Context, req *warrenv1.HibernateByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error {
	return g.byLabel(ctx, req.GetLabels(), send, func(ctx context.Context, n *node, send func(*warrenv1.ByLabelEvent) error) error {
		return stream(ctx, n, n.sb.HibernateByLabel, req, send)
	})
}

// byLabel runs a by-label call on every up node at once and merges their
// streams into one: each sandbox's event as it comes, counted over the
// cluster, and one last event with the totals. The lost sandboxes of a
// down node that match are failures, Unavailable, naming the node.
func (g *Gateway) byLabel(ctx context.Context, labels map[string]string, send func(*warrenv1.ByLabelEvent) error,
	run func(context.Context, *node, func(*warrenv1.ByLabelEvent) error) error) error {
	if len(labels) == 0 {
		return errdefs.Invalidf("labels are required")
	}
	if err := g.warming(); err != nil {
		return err
	}
	var (
		mu                       sync.Mutex
		total, completed, failed int32
		sendErr                  error
		wg                       sync.WaitGroup
		errs                     []error
	)
	emit := func(ev *warrenv1.ByLabelEvent) {
		if ev.GetError() != "" {
			failed++
		}
		completed++
		ev.Completed, ev.Total = completed, max(total, completed)
		if sendErr == nil {
			sendErr = send(ev)
		}
	}
	for _, n := range g.nodes.all() {
		if n.isUp() {
			continue
		}
		known := n.lastKnown()
		mu.Lock()
		for _, sb := range known {
			if labelsMatch(sb.GetLabels(), labels) {
				total++
				emit(&warrenv1.ByLabelEvent{SandboxId: sb.GetId(), Error: n.downErr("sandbox " + sb.GetId()).Error(), ErrorCode: errdefs.Unavailable.String()})
			}
		}
		mu.Unlock()
	}
	for _, n := range g.nodes.up() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := run(ctx, n, func(ev *warrenv1.ByLabelEvent) error {
				mu.Lock()
				defer mu.Unlock()
				if ev.GetDone() {
					return nil
				}
				if ev.GetCompleted() == 1 {
					total += ev.GetTotal()
				}
				emit(ev)
				return sendErr
			})
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if sendErr != nil {
		return sendErr
	}
	if len(errs) > 0 && completed == 0 {
		return errs[0]
	}
	return send(&warrenv1.ByLabelEvent{Done: true, Total: max(total, completed), Completed: completed, Failed: failed})
}

// Run runs a job on a node placement picks for its image (fncall pools
// are per node and per image: locality keeps them warm).
func (g *Gateway) Run(ctx context.Context, req *warrenv1.RunRequest) (*warrenv1.RunResult, error) {
	n, release, err := g.placeJob(ctx, req.GetImage())
	if err != nil {
		return nil, err
	}
	defer release()
	return call(ctx, n, n.sb.Run, req)
}

func (g *Gateway) RunBatch(ctx context.Context, req *warrenv1.RunBatchRequest, send func(*warrenv1.RunBatchItem) error) error {
	n, release, err := g.placeJob(ctx, req.GetImage())
	if err != nil {
		return err
	}
	defer release()
	return stream(ctx, n, n.sb.RunBatch, req, send)
}

func (g *Gateway) placeJob(ctx context.Context, image string) (*node, func(), error) {
	if err := g.warming(); err != nil {
		return nil, nil, err
	}
	r := placement.Request{Layers: g.layersOf(ctx, image)}
	name, err := g.placer.Place(r)
	if err != nil {
		return nil, nil, err
	}
	n := g.nodes.get(name)
	if n == nil {
		g.placer.Release(name, r)
		return nil, nil, errdefs.Unavailablef("node %s left the cluster", name)
	}
	return n, func() { g.placer.Release(name, r) }, nil
}

// TarOut and the other plain-HTTP calls go through the node's own
// endpoints with the Go client. A download the owner answers NotFound
// before any data follows the sandbox where it moved, as bySandbox does.
func (g *Gateway) TarOut(ctx context.Context, id, path string, w io.Writer, o sandboxfs.TarOptions) error {
	n, err := g.owner(ctx, id)
	if err != nil {
		return err
	}
	download := func(c *client.Client) (io.ReadCloser, error) {
		if o.Sparse {
			return c.DownloadSparse(ctx, id, path)
		}
		return c.Download(ctx, id, path)
	}
	rc, err := download(n.c)
	if err != nil {
		err = clientErr(n, err)
		m := g.moved(ctx, id, n, err)
		if m == nil {
			return err
		}
		n = m
		if rc, err = download(n.c); err != nil {
			return clientErr(n, err)
		}
	}
	defer rc.Close()
	if _, err := io.Copy(w, rc); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "archive from node "+n.name)
	}
	return nil
}

// uploadNode is the node an upload to sandbox id goes to: its owner, or
// the node it moved to. An upload's body is a stream the gateway cannot
// send twice, so the owner is asked first (a Get) rather than after a
// NotFound that may have taken part of the body.
func (g *Gateway) uploadNode(ctx context.Context, id string) (*node, error) {
	n, err := g.owner(ctx, id)
	if err != nil {
		return nil, err
	}
	_, err = call(ctx, n, n.sb.Get, &warrenv1.GetRequest{Id: id})
	if m := g.moved(ctx, id, n, err); m != nil {
		return m, nil
	}
	return n, nil // the upload reports any error of the owner's
}

func (g *Gateway) TarIn(ctx context.Context, id, path string, r io.Reader) error {
	n, err := g.uploadNode(ctx, id)
	if err != nil {
		return err
	}
	return clientErr(n, n.c.Upload(ctx, id, path, r))
}

func (g *Gateway) TarInStep(ctx context.Context, id, path, session string, seq uint64, r io.Reader) (uint64, bool, error) {
	n, err := g.uploadNode(ctx, id)
	if err != nil {
		return 0, false, err
	}
	got, replayed, err := n.c.UploadStep(ctx, id, path, session, seq, r)
	return got, replayed, clientErr(n, err)
}

// clientErr keeps the code and category of a Go client's error.
func clientErr(n *node, err error) error {
	if err == nil {
		return nil
	}
	var ce *client.Error
	if !asClientErr(err, &ce) {
		return n.err(err)
	}
	out := connect.NewError(ce.Code, fmt.Errorf("%s", ce.Message))
	out.Meta().Set(server.CategoryHeader, string(ce.Category))
	if ce.Category == client.CategoryUnavailable && !strings.Contains(ce.Message, n.name) {
		return errdefs.Unavailablef("node %s: %s", n.name, ce.Message)
	}
	return out
}

func (g *Gateway) ListImages(ctx context.Context, req *warrenv1.ListImagesRequest) (*warrenv1.ListImagesResponse, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.ListImagesRequest, warrenv1.ListImagesResponse] {
		return c.ListImages
	})
}

func (g *Gateway) GetImage(ctx context.Context, req *warrenv1.GetImageRequest) (*warrenv1.Image, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.GetImageRequest, warrenv1.Image] {
		return c.GetImage
	})
}

func (g *Gateway) ImportImage(ctx context.Context, req *warrenv1.ImportImageRequest) (*warrenv1.Image, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.ImportImageRequest, warrenv1.Image] {
		return c.ImportImage
	})
}

func (g *Gateway) ImportImageTar(ctx context.Context, name string, r io.Reader) (*warrenv1.Image, error) {
	n, err := g.anyNode()
	if err != nil {
		return nil, err
	}
	img, err := n.c.ImportImageTar(ctx, name, r)
	return img, clientErr(n, err)
}

func (g *Gateway) RemoveImage(ctx context.Context, req *warrenv1.RemoveImageRequest) (*warrenv1.RemoveImageResponse, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.RemoveImageRequest, warrenv1.RemoveImageResponse] {
		return c.RemoveImage
	})
}

func (g *Gateway) PullImage(ctx context.Context, req *warrenv1.PullImageRequest, send func(*warrenv1.PullImageEvent) error) error {
	n, err := g.anyNode()
	if err != nil {
		return err
	}
	return stream(ctx, n, n.img.PullImage, req, send)
}

func (g *Gateway) BuildLayer(ctx context.Context, req *warrenv1.BuildLayerRequest) (*warrenv1.Layer, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.BuildLayerRequest, warrenv1.Layer] {
		return c.BuildLayer
	})
}

func (g *Gateway) BuildLayerTar(ctx context.Context, name string, r io.Reader) (*warrenv1.Layer, error) {
	n, err := g.anyNode()
	if err != nil {
		return nil, err
	}
	l, err := n.c.BuildLayerTar(ctx, name, r)
	return l, clientErr(n, err)
}

func (g *Gateway) ListLayers(ctx context.Context, req *warrenv1.ListLayersRequest) (*warrenv1.ListLayersResponse, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.ListLayersRequest, warrenv1.ListLayersResponse] {
		return c.ListLayers
	})
}

func (g *Gateway) RemoveLayer(ctx context.Context, req *warrenv1.RemoveLayerRequest) (*warrenv1.RemoveLayerResponse, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.RemoveLayerRequest, warrenv1.RemoveLayerResponse] {
		return c.RemoveLayer
	})
}

func (g *Gateway) ImageStats(ctx context.Context, req *warrenv1.ImageStatsRequest) (*warrenv1.ImageStatsResponse, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.ImageStatsRequest, warrenv1.ImageStatsResponse] {
		return c.ImageStats
	})
}

func (g *Gateway) VerifyImage(ctx context.Context, req *warrenv1.VerifyImageRequest) (*warrenv1.VerifyImageResponse, error) {
	return onAny(g, ctx, req, func(c warrenv1connect.ImageServiceClient) unaryFn[warrenv1.VerifyImageRequest, warrenv1.VerifyImageResponse] {
		return c.VerifyImage
	})
}

// Version is the gateway's, with the backends of its up nodes.
func (g *Gateway) Version(ctx context.Context, _ *warrenv1.VersionRequest) (*warrenv1.VersionResponse, error) {
	backends := map[string]bool{}
	v := &warrenv1.VersionResponse{Version: daemon.Version, Commit: daemon.Commit, Node: g.o.Name, CgroupMode: "cluster"}
	for _, n := range g.nodes.up() {
		res, err := call(ctx, n, n.sys.Version, &warrenv1.VersionRequest{})
		if err != nil {
			continue
		}
		for _, b := range res.GetBackends() {
			backends[b] = true
		}
	}
	v.Backends = slices.Sorted(maps.Keys(backends))
	return v, nil
}

// NodeStatus lists the cluster's nodes as this gateway sees them.
func (g *Gateway) NodeStatus(context.Context, *warrenv1.NodeStatusRequest) (*warrenv1.NodeStatusResponse, error) {
	resp := &warrenv1.NodeStatusResponse{}
	for _, n := range g.nodes.all() {
		n.mu.Lock()
		st := &warrenv1.NodeStatus{}
		if n.status != nil {
			st = proto.Clone(n.status).(*warrenv1.NodeStatus)
		}
		st.Name, st.Tag, st.Address, st.Up = n.name, n.tag, n.api, n.up
		n.mu.Unlock()
		resp.Nodes = append(resp.Nodes, st)
	}
	sort.Slice(resp.Nodes, func(i, j int) bool { return resp.Nodes[i].Name < resp.Nodes[j].Name })
	return resp, nil
}

package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	filesystempb "github.com/warrenrl/warren/gen/e2b/filesystem"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Directory watches are the daemon's WatchDir (inotify on the sandbox's
// root, bounded per sandbox and node, ended when the sandbox leaves
// RUNNING). envd's WatchDir stream maps onto one call; its watcher calls
// (the SDKs' synchronous watch_dir polls them) keep one call running
// here, its events buffered until fetched.

var eventTypes = map[warrenv1.FileEventType]filesystempb.EventType{
	warrenv1.FileEventType_FILE_EVENT_TYPE_CREATE: filesystempb.EventType_EVENT_TYPE_CREATE,
	warrenv1.FileEventType_FILE_EVENT_TYPE_WRITE:  filesystempb.EventType_EVENT_TYPE_WRITE,
	warrenv1.FileEventType_FILE_EVENT_TYPE_REMOVE: filesystempb.EventType_EVENT_TYPE_REMOVE,
	warrenv1.FileEventType_FILE_EVENT_TYPE_RENAME: filesystempb.EventType_EVENT_TYPE_RENAME,
	warrenv1.FileEventType_FILE_EVENT_TYPE_CHMOD:  filesystempb.EventType_EVENT_TYPE_CHMOD,
}

func fsEvent(e *warrenv1.FileEvent) *filesystempb.FilesystemEvent {
	return &filesystempb.FilesystemEvent{Name: e.GetPath(), Type: eventTypes[e.GetType()]}
}

// WatchDir streams a start event once the watch is set, then the
// directory's events, with keepalives while it is quiet.
func (f filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystempb.WatchDirRequest], st *connect.ServerStream[filesystempb.WatchDirResponse]) error {
	id := sandboxOf(ctx)
	p, err := f.s.absPath(ctx, id, req.Msg.GetPath())
	if err != nil {
		return rpcErr(err)
	}
	var mu sync.Mutex // connect's ServerStream is not safe for concurrent sends
	send := func(r *filesystempb.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return st.Send(r)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	started := false
	err = f.s.m.WatchDir(ctx, &warrenv1.WatchDirRequest{SandboxId: id, Path: p, Recursive: req.Msg.GetRecursive()}, func(ev *warrenv1.WatchDirEvent) error {
		if ev.GetStarted() != nil {
			started = true
			go keepalive(ctx, cancel, req.Header(), func() error {
				return send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Keepalive{Keepalive: &filesystempb.WatchDirResponse_KeepAlive{}}})
			})
			return send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Start{Start: &filesystempb.WatchDirResponse_StartEvent{}}})
		}
		return send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Filesystem{Filesystem: fsEvent(ev.GetFile())}})
	})
	if err != nil && started && ctx.Err() != nil {
		return nil // the client went
	}
	return rpcErr(err)
}

// keepalive sends a keepalive at the interval the client asked for until
// ctx ends; a failed send cancels the stream.
func keepalive(ctx context.Context, cancel func(), h http.Header, send func() error) {
	t := time.NewTicker(keepaliveEvery(h))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if send() != nil {
				cancel()
				return
			}
		}
	}
}

// Bounds of the watcher calls' state.
const (
	// maxWatcherEvents are buffered per watcher between two fetches;
	// more ends the watcher (Exhausted on the next fetch).
	maxWatcherEvents = 10000
	// watcherIdle: a watcher not fetched for this long is dropped (its
	// daemon watch closed) when the next one is created; so is an ended
	// one not fetched since.
	watcherIdle = 10 * time.Minute
	// maxWatchers bounds the watchers of the server (the daemon bounds
	// the open watches per sandbox and per node far below).
	maxWatchers = 4096
)

// watchers are the watcher calls' watches, by id.
type watchers struct {
	mu sync.Mutex
	by map[string]*watcher
}

type watcher struct {
	sandbox string
	cancel  context.CancelFunc
	done    chan struct{} // closed when its daemon watch ended

	// Under watchers.mu.
	events  []*filesystempb.FilesystemEvent
	err     error // why it ended (nil: the directory was removed)
	ended   bool
	touched time.Time
}

func (ws *watchers) sweepLocked(now time.Time) {
	for id, w := range ws.by {
		if now.Sub(w.touched) > watcherIdle {
			w.cancel()
			delete(ws.by, id)
		}
	}
}

// closeAll ends every watcher (the server closes).
func (ws *watchers) closeAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for id, w := range ws.by {
		w.cancel()
		delete(ws.by, id)
	}
}

func (f filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystempb.CreateWatcherRequest]) (*connect.Response[filesystempb.CreateWatcherResponse], error) {
	id := sandboxOf(ctx)
	p, err := f.s.absPath(ctx, id, req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	ws := &f.s.watchers
	ws.mu.Lock()
	ws.sweepLocked(time.Now())
	full := len(ws.by) >= maxWatchers
	ws.mu.Unlock()
	if full {
		return nil, rpcErr(errdefs.Exhaustedf("%d watchers are open: remove one first", maxWatchers))
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	wid := hex.EncodeToString(b)
	// The watch outlives this call: it runs until RemoveWatcher.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &watcher{sandbox: id, cancel: cancel, done: make(chan struct{}), touched: time.Now()}
	started := make(chan struct{})
	go func() {
		defer close(w.done)
		err := f.s.m.WatchDir(wctx, &warrenv1.WatchDirRequest{SandboxId: id, Path: p, Recursive: req.Msg.GetRecursive()}, func(ev *warrenv1.WatchDirEvent) error {
			if ev.GetStarted() != nil {
				close(started)
				return nil
			}
			ws.mu.Lock()
			defer ws.mu.Unlock()
			e := fsEvent(ev.GetFile())
			// A run of writes to one file is one event to the poller, as
			// the kernel merges them while they are unread.
			if n := len(w.events); n > 0 && w.events[n-1].GetName() == e.GetName() && w.events[n-1].GetType() == e.GetType() {
				return nil
			}
			if len(w.events) >= maxWatcherEvents {
				return errdefs.Exhaustedf("watcher %s: more than %d events were not fetched", wid, maxWatcherEvents)
			}
			w.events = append(w.events, e)
			return nil
		})
		ws.mu.Lock()
		w.ended, w.err = true, err
		ws.mu.Unlock()
	}()
	select {
	case <-started:
	case <-w.done:
		cancel()
		return nil, rpcErr(w.err)
	case <-ctx.Done():
		cancel()
		return nil, rpcErr(errdefs.Wrap(errdefs.DeadlineExceeded, ctx.Err(), "create watcher"))
	}
	ws.mu.Lock()
	if ws.by == nil {
		ws.by = map[string]*watcher{}
	}
	ws.by[wid] = w
	ws.mu.Unlock()
	return connect.NewResponse(&filesystempb.CreateWatcherResponse{WatcherId: wid}), nil
}

// watcher finds a watcher of the request's sandbox.
func (ws *watchers) get(ctx context.Context, wid string) (*watcher, error) {
	w := ws.by[wid]
	if w == nil || w.sandbox != sandboxOf(ctx) {
		return nil, errdefs.NotFoundf("watcher %s not found", wid)
	}
	return w, nil
}

// GetWatcherEvents returns the events since the last fetch. Once they are
// fetched, a watcher that ended says why (and is dropped): the sandbox
// left RUNNING, too many events were left unfetched, or its directory was
// removed.
func (f filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystempb.GetWatcherEventsRequest]) (*connect.Response[filesystempb.GetWatcherEventsResponse], error) {
	ws := &f.s.watchers
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, err := ws.get(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, rpcErr(err)
	}
	w.touched = time.Now()
	if len(w.events) == 0 && w.ended {
		delete(ws.by, req.Msg.GetWatcherId())
		err := w.err
		if err == nil {
			err = errdefs.NotFoundf("watcher %s ended: its directory was removed", req.Msg.GetWatcherId())
		}
		return nil, rpcErr(err)
	}
	out := &filesystempb.GetWatcherEventsResponse{Events: w.events}
	w.events = nil
	return connect.NewResponse(out), nil
}

func (f filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystempb.RemoveWatcherRequest]) (*connect.Response[filesystempb.RemoveWatcherResponse], error) {
	ws := &f.s.watchers
	ws.mu.Lock()
	w, err := ws.get(ctx, req.Msg.GetWatcherId())
	if err == nil {
		delete(ws.by, req.Msg.GetWatcherId())
	}
	ws.mu.Unlock()
	if err != nil {
		return nil, rpcErr(err)
	}
	w.cancel()
	// Its daemon watch is closed before the answer, so that a new one
	// finds its place free.
	select {
	case <-w.done:
	case <-ctx.Done():
	}
	return connect.NewResponse(&filesystempb.RemoveWatcherResponse{}), nil
}

package e2b

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errPaused ends a sandbox's output streams when it is paused or forked:
// E2B's pause drops every connection into the sandbox, and Warren cannot
// checkpoint a sandbox (for a hibernation or a fork) while one of its
// agent's connections (an attach) is open.
var errPaused = errors.New("the sandbox was paused or forked, which ends its streams; commands.connect(pid) follows the command again (after connecting to a paused sandbox)")

// streams are the sandboxes' open process streams, so that pause and
// fork can end them.
type streams struct {
	mu sync.Mutex
	by map[string]map[*openStream]struct{}
}

type openStream struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// open registers a stream of sandbox id; close (deferred by the caller)
// unregisters it once its agent connection is gone.
func (st *streams) open(ctx context.Context, id string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	o := &openStream{cancel: cancel, done: make(chan struct{})}
	st.mu.Lock()
	if st.by == nil {
		st.by = map[string]map[*openStream]struct{}{}
	}
	if st.by[id] == nil {
		st.by[id] = map[*openStream]struct{}{}
	}
	st.by[id][o] = struct{}{}
	st.mu.Unlock()
	return ctx, func() {
		st.mu.Lock()
		delete(st.by[id], o)
		if len(st.by[id]) == 0 {
			delete(st.by, id)
		}
		st.mu.Unlock()
		cancel(nil)
		close(o.done)
	}
}

// end ends every open stream of sandbox id and waits (at most wait) until
// they have let go of the sandbox.
func (st *streams) end(id string, wait time.Duration) {
	st.mu.Lock()
	var open []*openStream
	for o := range st.by[id] {
		open = append(open, o)
	}
	st.mu.Unlock()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for _, o := range open {
		o.cancel(errPaused)
	}
	for _, o := range open {
		select {
		case <-o.done:
		case <-deadline.C:
			return
		}
	}
}

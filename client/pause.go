package client

import (
	"context"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// Pause freezes every process of a RUNNING sandbox where it is; with
// reclaim it also gives back the sandbox's page cache (and its anonymous
// memory where the node has swap). The response has the memory before
// and after, and the timings. The sandbox is PAUSED until Resume: exec
// and file calls fail with CategoryConflict meanwhile, and its lifetime
// keeps counting (ExtendTimeout works).
func (c *Client) Pause(ctx context.Context, sandboxID string, reclaim bool) (*warrenv1.PauseResponse, error) {
	return call(ctx, c.sandboxes.Pause, &warrenv1.PauseRequest{Id: sandboxID, Reclaim: reclaim})
}

// Resume thaws a PAUSED sandbox, or restores a HIBERNATED one from its
// checkpoint: either way its processes continue where they stopped.
func (c *Client) Resume(ctx context.Context, sandboxID string) (*warrenv1.ResumeResponse, error) {
	return call(ctx, c.sandboxes.Resume, &warrenv1.ResumeRequest{Id: sandboxID})
}

// Restore restores a HIBERNATED sandbox on the node the client talks
// to. Through a checkpoint directory several nodes share (`warren serve
// --checkpoint-dir`), the sandbox may have been hibernated on another
// node: it moves here, and that node forgets it. On its own node it is
// Resume.
func (c *Client) Restore(ctx context.Context, sandboxID string) (*warrenv1.ResumeResponse, error) {
	return call(ctx, c.sandboxes.Restore, &warrenv1.RestoreRequest{Id: sandboxID})
}

// Hibernate checkpoints a RUNNING or PAUSED sandbox to disk and releases
// everything it holds on the node; it is HIBERNATED until Resume restores
// it, across daemon restarts and reboots. A sandbox CRIU cannot
// checkpoint fails with CategoryUnsupported (or CategoryConflict while
// calls to it are in flight) and keeps running.
func (c *Client) Hibernate(ctx context.Context, sandboxID string) (*warrenv1.HibernateResponse, error) {
	return call(ctx, c.sandboxes.Hibernate, &warrenv1.HibernateRequest{Id: sandboxID})
}

// HibernateByLabel hibernates every RUNNING or PAUSED sandbox whose labels
// include all of req.Labels, as PauseByLabel pauses them.
func (c *Client) HibernateByLabel(ctx context.Context, req *warrenv1.HibernateByLabelRequest, fn func(*warrenv1.ByLabelEvent) error) (*ByLabelResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.sandboxes.HibernateByLabel(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrapErr(err)
	}
	return byLabel(st, fn)
}

// ByLabelResult is the outcome of a by-label call: one event per
// sandbox, in the order they finished, and the totals.
type ByLabelResult struct {
	Events []*warrenv1.ByLabelEvent // per sandbox, without the last event
	Total  int                      // sandboxes matched
	Failed int                      // of which failed (their events say why)
}

// PauseByLabel pauses every RUNNING sandbox whose labels include all of
// req.Labels, req.Parallelism at a time. fn, if not nil, is called with
// each sandbox's event as it finishes (progress); if it returns an error
// the call is cancelled (sandboxes not started yet are not paused) and
// that error returned.
func (c *Client) PauseByLabel(ctx context.Context, req *warrenv1.PauseByLabelRequest, fn func(*warrenv1.ByLabelEvent) error) (*ByLabelResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.sandboxes.PauseByLabel(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrapErr(err)
	}
	return byLabel(st, fn)
}

// ResumeByLabel resumes every PAUSED or HIBERNATED sandbox whose labels include all of
// req.Labels, as PauseByLabel pauses them.
func (c *Client) ResumeByLabel(ctx context.Context, req *warrenv1.ResumeByLabelRequest, fn func(*warrenv1.ByLabelEvent) error) (*ByLabelResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.sandboxes.ResumeByLabel(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrapErr(err)
	}
	return byLabel(st, fn)
}

func byLabel(st *connect.ServerStreamForClient[warrenv1.ByLabelEvent], fn func(*warrenv1.ByLabelEvent) error) (*ByLabelResult, error) {
	defer st.Close()
	res := &ByLabelResult{}
	done := false
	for st.Receive() {
		ev := st.Msg()
		if ev.GetDone() {
			res.Total, res.Failed, done = int(ev.GetTotal()), int(ev.GetFailed()), true
			continue
		}
		res.Events = append(res.Events, ev)
		if fn != nil {
			if err := fn(ev); err != nil {
				return nil, err
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, wrapErr(err)
	}
	if !done {
		return nil, &Error{Category: CategoryUnavailable, Code: connect.CodeUnavailable, Message: "by-label stream ended without its totals"}
	}
	return res, nil
}

// Fork makes req.Count copies of sandbox req.Id, each a copy of it at its
// checkpoint (processes and files) on its own copy-on-write writable
// layer. A RUNNING or PAUSED source is hibernated for the fork and put
// back; a HIBERNATED one stays hibernated.
func (c *Client) Fork(ctx context.Context, req *warrenv1.ForkRequest) (*warrenv1.ForkResponse, error) {
	return call(ctx, c.sandboxes.Fork, req)
}

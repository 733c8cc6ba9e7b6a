package client

import (
	"context"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/trajectory"
)

// Rollout numbers the exec and file calls of one agent loop on one
// sandbox as the steps 1, 2, 3... of a session of the sandbox's
// trajectory log, so that the loop resumes by running its code again:
// steps the log has return their recorded outcomes, the first one past
// the end runs live.
//
// NewRollout reads the session's recorded steps once, and a call whose
// request hashes (trajectory.RequestHash, the daemon's own canonical
// hash) to its step's recorded hash is answered from them without a round
// trip: a replay costs microseconds, not an API call. Any other call goes
// to the daemon, which decides (replays, refuses a mismatch, or runs live).
// A Rollout is safe for concurrent use; concurrent calls get their
// numbers in the order they are made.
type Rollout struct {
	c       *Client
	sandbox string
	session string

	mu       sync.Mutex
	seq      uint64
	recorded map[uint64]*warrenv1.TrajectoryEntry
	replayed int
	live     int
}

// NewRollout starts (or resumes) session on sandboxID.
func (c *Client) NewRollout(ctx context.Context, sandboxID, session string) (*Rollout, error) {
	ents, err := c.Trajectory(ctx, sandboxID, session)
	if err != nil {
		return nil, err
	}
	r := &Rollout{c: c, sandbox: sandboxID, session: session, recorded: map[uint64]*warrenv1.TrajectoryEntry{}}
	for _, e := range ents {
		// Later entries of a seq supersede earlier ones (a step refused
		// before it ran, run again); only outcomes are replayed here.
		if e.GetNotRun() || e.GetInterrupted() {
			delete(r.recorded, e.GetSeq())
			continue
		}
		r.recorded[e.GetSeq()] = e
	}
	return r, nil
}

// Seq is the last step number given out.
func (r *Rollout) Seq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// Counts are how many calls succeeded answered from the log and how many
// ran (failed calls take a step but are not counted).
func (r *Rollout) Counts() (replayed, live int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.replayed, r.live
}

// next numbers a call and returns its recorded step when the request
// matches it.
func (r *Rollout) next(method string, req proto.Message) (uint64, *warrenv1.TrajectoryEntry) {
	r.mu.Lock()
	r.seq++
	seq := r.seq
	e := r.recorded[seq]
	r.mu.Unlock()
	if e == nil || e.GetMethod() != method || e.GetRequestSha256() != trajectory.RequestHash(method, req) {
		return seq, nil
	}
	return seq, e
}

func (r *Rollout) count(replayed bool) {
	r.mu.Lock()
	if replayed {
		r.replayed++
	} else {
		r.live++
	}
	r.mu.Unlock()
}

// recordedErr is the error a recorded step failed with, as the daemon
// would have returned it.
func recordedErr(e *warrenv1.TrajectoryEntry) error {
	if e.GetErrorCategory() == "" && e.GetError() == "" {
		return nil
	}
	cat, code := Category(e.GetErrorCategory()), connect.CodeUnknown
	if cat == "already_exists" {
		cat, code = CategoryConflict, connect.CodeAlreadyExists
	} else {
		code = categoryCode[cat]
	}
	return &Error{Category: cat, Code: code, Message: e.GetError()}
}

var categoryCode = map[Category]connect.Code{
	CategoryNotFound: connect.CodeNotFound, CategoryInvalid: connect.CodeInvalidArgument,
	CategoryExhausted: connect.CodeResourceExhausted, CategoryConflict: connect.CodeFailedPrecondition,
	CategoryUnavailable: connect.CodeUnavailable, CategoryDeadlineExceeded: connect.CodeDeadlineExceeded,
	CategoryUnauthenticated: connect.CodeUnauthenticated, CategoryPermissionDenied: connect.CodePermissionDenied,
	CategoryInternal: connect.CodeInternal, CategoryUnsupported: connect.CodeUnimplemented,
}

// Exec runs req (its sandbox, session and seq are set) as the next step.
func (r *Rollout) Exec(ctx context.Context, req *warrenv1.ExecRequest) (*warrenv1.ExecResult, error) {
	req = proto.Clone(req).(*warrenv1.ExecRequest)
	req.SandboxId, req.SessionId = r.sandbox, r.session
	seq, e := r.next(trajectory.MethodExec, req)
	req.Seq = seq
	if e != nil {
		if err := recordedErr(e); err != nil {
			return nil, err
		}
		r.count(true)
		res := proto.Clone(e.GetExecResult()).(*warrenv1.ExecResult)
		res.Seq, res.Replayed = seq, true
		return res, nil
	}
	res, err := r.c.Exec(ctx, req)
	if err == nil {
		r.count(res.GetReplayed())
	}
	return res, err
}

// WriteFile writes as the next step.
func (r *Rollout) WriteFile(ctx context.Context, req *warrenv1.WriteFileRequest) error {
	req = proto.Clone(req).(*warrenv1.WriteFileRequest)
	req.SandboxId, req.SessionId = r.sandbox, r.session
	return r.file(ctx, trajectory.MethodWriteFile, req, &req.Seq, func() (bool, error) {
		res, err := call(ctx, r.c.sandboxes.WriteFile, req)
		return res.GetReplayed(), err
	})
}

// MakeDir makes a directory as the next step.
func (r *Rollout) MakeDir(ctx context.Context, req *warrenv1.MakeDirRequest) error {
	req = proto.Clone(req).(*warrenv1.MakeDirRequest)
	req.SandboxId, req.SessionId = r.sandbox, r.session
	return r.file(ctx, trajectory.MethodMakeDir, req, &req.Seq, func() (bool, error) {
		res, err := call(ctx, r.c.sandboxes.MakeDir, req)
		return res.GetReplayed(), err
	})
}

// RemoveFile removes as the next step.
func (r *Rollout) RemoveFile(ctx context.Context, req *warrenv1.RemoveFileRequest) error {
	req = proto.Clone(req).(*warrenv1.RemoveFileRequest)
	req.SandboxId, req.SessionId = r.sandbox, r.session
	return r.file(ctx, trajectory.MethodRemoveFile, req, &req.Seq, func() (bool, error) {
		res, err := call(ctx, r.c.sandboxes.RemoveFile, req)
		return res.GetReplayed(), err
	})
}

func (r *Rollout) file(ctx context.Context, method string, req proto.Message, seqField *uint64, send func() (bool, error)) error {
	seq, e := r.next(method, req)
	*seqField = seq
	if e != nil {
		err := recordedErr(e)
		if err == nil {
			r.count(true)
		}
		return err
	}
	replayed, err := send()
	if err == nil {
		r.count(replayed)
	}
	return err
}

package server

import (
	"context"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
	"github.com/warrenrl/warren/internal/caller"
	"github.com/warrenrl/warren/internal/errdefs"
)

// What a harness sandbox may call through its route (docs/SECURITY.md,
// "Harness sandboxes"). A call carries the harness's id in its context
// (internal/caller) when it arrived on the harness's listener; calls on
// the node's own sockets carry none and are not scoped. The decision is
// made here, once, for every RPC and plain endpoint, by the tables below:
// an RPC missing from harnessRPCs is refused (a new RPC is node-level
// until someone decides otherwise), and TestHarnessRulesCoverEveryRPC
// fails until they do.

// access is what a harness may do with one call.
type access uint8

const (
	// deny: node-level (images, layers, other sandboxes, by-label calls
	// across the node, fncall jobs): refused with PermissionDenied. The
	// zero value, so that a forgotten entry fails closed.
	deny access = iota
	// anyone: harmless for any caller (the daemon's version).
	anyone
	// create: makes a sandbox, which becomes the harness's child; the
	// daemon checks the cap, nesting and containment (daemon/harness.go).
	create
	// list: the daemon lists the harness's children only.
	list
	// child: names one sandbox in field, which must be the harness's
	// child.
	child
)

// rule is a harness's access to one RPC; field names the request's
// sandbox id for access child.
type rule struct {
	access access
	field  protoreflect.Name
}

var (
	byID       = rule{child, "id"}
	bySandbox  = rule{child, "sandbox_id"}
	harnessRPC = map[string]rule{
		warrenv1connect.SandboxServiceCreateProcedure:        {access: create},
		warrenv1connect.SandboxServiceListProcedure:          {access: list},
		warrenv1connect.SandboxServiceGetProcedure:           byID,
		warrenv1connect.SandboxServiceDeleteProcedure:        byID,
		warrenv1connect.SandboxServiceExtendTimeoutProcedure: byID,
		warrenv1connect.SandboxServiceUpdateSandboxProcedure: byID,
		warrenv1connect.SandboxServicePauseProcedure:         byID,
		warrenv1connect.SandboxServiceResumeProcedure:        byID,
		warrenv1connect.SandboxServiceScreenshotProcedure:    byID,
		warrenv1connect.SandboxServiceSendInputProcedure:     byID,
		warrenv1connect.SandboxServiceHibernateProcedure:     byID,
		// Forks of a child are the harness's children too, within its
		// cap (daemon/fork.go).
		warrenv1connect.SandboxServiceForkProcedure: byID,
		// Of its own children only: one of another node is no child of
		// this harness.
		warrenv1connect.SandboxServiceRestoreProcedure:           byID,
		warrenv1connect.SandboxServiceExecProcedure:              bySandbox,
		warrenv1connect.SandboxServiceExecStreamProcedure:        bySandbox,
		warrenv1connect.SandboxServiceStartProcessProcedure:      bySandbox,
		warrenv1connect.SandboxServiceListProcessesProcedure:     bySandbox,
		warrenv1connect.SandboxServiceWaitProcessProcedure:       bySandbox,
		warrenv1connect.SandboxServiceSignalProcessProcedure:     bySandbox,
		warrenv1connect.SandboxServiceWriteStdinProcedure:        bySandbox,
		warrenv1connect.SandboxServiceAttachProcessProcedure:     bySandbox,
		warrenv1connect.SandboxServiceResizeProcessProcedure:     bySandbox,
		warrenv1connect.SandboxServiceWriteFileProcedure:         bySandbox,
		warrenv1connect.SandboxServiceReadFileProcedure:          bySandbox,
		warrenv1connect.SandboxServiceListFilesProcedure:         bySandbox,
		warrenv1connect.SandboxServiceStatFileProcedure:          bySandbox,
		warrenv1connect.SandboxServiceMakeDirProcedure:           bySandbox,
		warrenv1connect.SandboxServiceRemoveFileProcedure:        bySandbox,
		warrenv1connect.SandboxServiceWatchDirProcedure:          bySandbox,
		warrenv1connect.SandboxServiceSandboxStatsProcedure:      bySandbox,
		warrenv1connect.SandboxServiceListSandboxEventsProcedure: bySandbox,
		warrenv1connect.SandboxServiceReadTrajectoryProcedure:    bySandbox,
		// A commit makes a named layer of the node's store, which every
		// sandbox of the node may stack and which replaces a layer of
		// that name: node-level.
		warrenv1connect.SandboxServiceCommitSandboxProcedure: {access: deny},
		// By label across the whole node, not the harness's children.
		warrenv1connect.SandboxServicePauseByLabelProcedure:     {access: deny},
		warrenv1connect.SandboxServiceHibernateByLabelProcedure: {access: deny},
		warrenv1connect.SandboxServiceResumeByLabelProcedure:    {access: deny},
		// Node-wide pools outside any sandbox of the harness.
		warrenv1connect.SandboxServiceRunProcedure:      {access: deny},
		warrenv1connect.SandboxServiceRunBatchProcedure: {access: deny},
		// Its sandboxes would be the harness's children, each checked
		// as a create is: not worth a second path; a harness creates
		// one at a time.
		warrenv1connect.SandboxServiceBatchCreateProcedure: {access: deny},

		// The image store is the node's.
		warrenv1connect.ImageServiceListImagesProcedure:  {access: deny},
		warrenv1connect.ImageServiceGetImageProcedure:    {access: deny},
		warrenv1connect.ImageServiceImportImageProcedure: {access: deny},
		warrenv1connect.ImageServiceRemoveImageProcedure: {access: deny},
		warrenv1connect.ImageServicePullImageProcedure:   {access: deny},
		warrenv1connect.ImageServiceBuildLayerProcedure:  {access: deny},
		warrenv1connect.ImageServiceListLayersProcedure:  {access: deny},
		warrenv1connect.ImageServiceRemoveLayerProcedure: {access: deny},
		warrenv1connect.ImageServiceImageStatsProcedure:  {access: deny},
		warrenv1connect.ImageServiceVerifyImageProcedure: {access: deny},

		warrenv1connect.SystemServiceVersionProcedure: {access: anyone},
		// The node's capacity and its sandboxes' labels: node-level.
		warrenv1connect.SystemServiceNodeStatusProcedure: {access: deny},
	}
)

// Owner is a Manager that knows which harness created a sandbox. Without
// it a harness may call nothing that names a sandbox.
type Owner interface {
	ParentOf(id string) (harness string, err error)
}

// scope enforces the tables for calls that carry a harness.
type scope struct{ m Manager }

// check decides one RPC of harness h; msg is its request (nil before it
// is read, for access decisions that need none).
func (sc scope) check(h, procedure string, msg any) error {
	r := harnessRPC[procedure]
	switch r.access {
	case anyone, create, list:
		return nil
	case child:
		pm, ok := msg.(proto.Message)
		if !ok {
			return errdefs.Internalf("%s: request is not a proto message", procedure)
		}
		md := pm.ProtoReflect()
		fd := md.Descriptor().Fields().ByName(r.field)
		if fd == nil || fd.Kind() != protoreflect.StringKind {
			return errdefs.New(errdefs.PermissionDenied, "harness %s may not call %s", h, procedure)
		}
		return sc.owns(h, md.Get(fd).String())
	}
	return errdefs.New(errdefs.PermissionDenied, "harness %s may not call %s: it is node-level", h, procedure)
}

// owns: nil when sandbox id is harness h's child. A sandbox that does not
// exist is NotFound, as on the node's API, so that a harness can wait for
// its child to be gone (ids are no secret: creating one that exists says
// so too).
func (sc scope) owns(h, id string) error {
	if id == "" {
		return errdefs.New(errdefs.PermissionDenied, "harness %s must name one of its sandboxes", h)
	}
	o, ok := sc.m.(Owner)
	if !ok {
		return errdefs.New(errdefs.PermissionDenied, "this daemon scopes no harness calls")
	}
	parent, err := o.ParentOf(id)
	if err != nil {
		return err
	}
	if parent != h {
		return errdefs.New(errdefs.PermissionDenied, "sandbox %s is not harness %s's", id, h)
	}
	return nil
}

func (sc scope) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if h, ok := caller.Harness(ctx); ok {
			if err := spend(ctx, h); err != nil {
				return nil, ToConnectError(err)
			}
			if err := sc.check(h, req.Spec().Procedure, req.Any()); err != nil {
				return nil, ToConnectError(err)
			}
		}
		return next(ctx, req)
	}
}

func (sc scope) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler checks a streaming call when its request is read:
// the handler reads it first (every streaming RPC of the API is server
// streaming), so nothing runs before the check.
func (sc scope) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		h, ok := caller.Harness(ctx)
		if !ok {
			return next(ctx, conn)
		}
		if err := spend(ctx, h); err != nil {
			return ToConnectError(err)
		}
		procedure := conn.Spec().Procedure
		if r := harnessRPC[procedure]; r.access != child {
			if err := sc.check(h, procedure, nil); err != nil {
				return ToConnectError(err)
			}
			return next(ctx, conn)
		}
		return next(ctx, &checkedConn{StreamingHandlerConn: conn, check: func(msg any) error {
			return sc.check(h, procedure, msg)
		}})
	}
}

// checkedConn checks every request message it reads.
type checkedConn struct {
	connect.StreamingHandlerConn
	check func(any) error
}

func (c *checkedConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if err := c.check(msg); err != nil {
		return ToConnectError(err)
	}
	return nil
}

// scopeHTTP guards a plain HTTP endpoint: for a harness's calls, refused
// unless a is child and the sandbox of the path's {id} is the harness's.
func (sc scope) scopeHTTP(a access, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h, ok := caller.Harness(r.Context()); ok {
			err := spend(r.Context(), h)
			switch {
			case err != nil:
			case a == anyone:
			case a == child:
				err = sc.owns(h, r.PathValue("id"))
			default:
				err = errdefs.New(errdefs.PermissionDenied, "harness %s may not call %s %s: it is node-level", h, r.Method, r.URL.Path)
			}
			if err != nil {
				writeHTTPError(w, err)
				return
			}
		}
		next(w, r)
	}
}

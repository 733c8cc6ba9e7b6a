package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func call[Req, Res any](ctx context.Context, fn func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req) (*Res, error) {
	res, err := fn(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrapErr(err)
	}
	return res.Msg, nil
}

// Create creates a sandbox and returns it once it runs. It is safe to
// retry, and retries itself: the request carries an idempotency key (a
// random one unless req sets its own), and after an Unavailable answer
// (a node or gateway restarting, a connection lost with the answer) the
// same request is sent again, marked a retry, for up to the client's
// create retry window (WithCreateRetry), so a create made by an attempt
// whose answer was lost is answered rather than made twice, whichever
// gateway the retry reaches. req itself is not changed.
func (c *Client) Create(ctx context.Context, req *warrenv1.CreateRequest) (*warrenv1.Sandbox, error) {
	if req.GetIdempotencyKey() == "" {
		req = proto.Clone(req).(*warrenv1.CreateRequest)
		var k [16]byte
		_, _ = rand.Read(k[:])
		req.IdempotencyKey = hex.EncodeToString(k[:])
	}
	deadline := time.Now().Add(c.createRetry)
	wait := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !req.GetRetry() {
			req = proto.Clone(req).(*warrenv1.CreateRequest)
			req.Retry = true
		}
		sb, err := call(ctx, c.sandboxes.Create, req)
		if err == nil || !IsUnavailable(err) || time.Now().Add(wait).After(deadline) {
			return sb, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (*warrenv1.Sandbox, error) {
	return call(ctx, c.sandboxes.Get, &warrenv1.GetRequest{Id: id})
}

// List returns the sandboxes carrying all the given labels (all sandboxes
// for a nil map).
func (c *Client) List(ctx context.Context, labels map[string]string) ([]*warrenv1.Sandbox, error) {
	res, err := call(ctx, c.sandboxes.List, &warrenv1.ListRequest{Labels: labels})
	if err != nil {
		return nil, err
	}
	return res.GetSandboxes(), nil
}

// Delete destroys a sandbox.
func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := call(ctx, c.sandboxes.Delete, &warrenv1.DeleteRequest{Id: id})
	return err
}

// ExtendTimeout sets the sandbox's deadline to now + timeout (rounded up to
// whole seconds).
func (c *Client) ExtendTimeout(ctx context.Context, id string, timeout time.Duration) (*warrenv1.Sandbox, error) {
	return call(ctx, c.sandboxes.ExtendTimeout, &warrenv1.ExtendTimeoutRequest{Id: id, TimeoutSeconds: ceilSeconds(timeout)})
}

// SandboxUpdate is a change of a running sandbox (Client.Update). Nil
// fields are left as they are; a set limit means what it means in
// warrenv1.Resources (CPUMillis 0: no quota; MemoryBytes and PidsMax 0:
// the node default). Timeout sets the lifetime to end that long from now
// (rounded up to whole seconds; 0: the node default). SetLabels adds or
// overwrites labels, RemoveLabels deletes them (absent ones are ignored);
// a key in both is invalid.
type SandboxUpdate struct {
	CPUMillis    *int64
	MemoryBytes  *int64
	PidsMax      *int64
	Timeout      *time.Duration
	SetLabels    map[string]string
	RemoveLabels []string
	// Network replaces the network policy: new connections follow it at
	// once, established ones it forbids are cut. Nil: unchanged; a policy
	// with mode "none" removes the sandbox's interface.
	Network *warrenv1.NetworkPolicy
	// QoS changes the CPU class ("ls" or "be"; docs/ARCHITECTURE.md, "CPU
	// QoS") and QoSCPUs the pinning with it ("ls" only; none: unpinned).
	QoS     *string
	QoSCPUs []int32
}

// Update changes a running sandbox, all or nothing, and returns it as it
// is afterwards: Conflict when the sandbox is not RUNNING, Invalid when
// the node cannot honour the change (nothing changed then).
func (c *Client) Update(ctx context.Context, id string, u SandboxUpdate) (*warrenv1.Sandbox, error) {
	req := &warrenv1.UpdateSandboxRequest{Id: id, CpuMillis: u.CPUMillis, MemoryBytes: u.MemoryBytes, PidsMax: u.PidsMax,
		SetLabels: u.SetLabels, RemoveLabels: u.RemoveLabels, Network: u.Network, Qos: u.QoS, QosCpus: u.QoSCPUs}
	if u.Timeout != nil {
		s := ceilSeconds(*u.Timeout)
		req.TimeoutSeconds = &s
	}
	return call(ctx, c.sandboxes.UpdateSandbox, req)
}

func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// Exec runs a command to completion and returns its captured output.
func (c *Client) Exec(ctx context.Context, req *warrenv1.ExecRequest) (*warrenv1.ExecResult, error) {
	return call(ctx, c.sandboxes.Exec, req)
}

// ExecStream runs a command, calls fn with every output chunk as it arrives
// (events with Stdout or Stderr set; fn may be nil) and returns the result.
// With Pty the first event is Started: its ProcessId resizes the terminal
// with ResizeProcess while the command runs.
// The event is only valid during the call. If fn returns an error the call
// is cancelled, which kills the command, and that error is returned.
func (c *Client) ExecStream(ctx context.Context, req *warrenv1.ExecRequest, fn func(*warrenv1.ExecEvent) error) (*warrenv1.ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.sandboxes.ExecStream(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrapErr(err)
	}
	defer st.Close()
	var result *warrenv1.ExecResult
	for st.Receive() {
		ev := st.Msg()
		if r := ev.GetResult(); r != nil {
			result = r
			continue
		}
		if fn != nil {
			if err := fn(ev); err != nil {
				return nil, err
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, wrapErr(err)
	}
	if result == nil {
		return nil, &Error{Category: CategoryUnavailable, Code: connect.CodeUnavailable, Message: "exec stream ended without a result"}
	}
	return result, nil
}

// StartProcess starts a background process.
func (c *Client) StartProcess(ctx context.Context, req *warrenv1.ExecRequest) (*warrenv1.ProcessInfo, error) {
	return call(ctx, c.sandboxes.StartProcess, req)
}

// ListProcesses lists the background processes of a sandbox.
func (c *Client) ListProcesses(ctx context.Context, sandboxID string) ([]*warrenv1.ProcessInfo, error) {
	res, err := call(ctx, c.sandboxes.ListProcesses, &warrenv1.ListProcessesRequest{SandboxId: sandboxID})
	if err != nil {
		return nil, err
	}
	return res.GetProcesses(), nil
}

// ListSandboxEvents returns one page of a sandbox's security events
// (contained or denied actions), oldest first; pass the response's
// NextPageToken to get the next page ("" on the last one).
func (c *Client) ListSandboxEvents(ctx context.Context, req *warrenv1.ListSandboxEventsRequest) (*warrenv1.ListSandboxEventsResponse, error) {
	return call(ctx, c.sandboxes.ListSandboxEvents, req)
}

// SandboxEvents returns every security event the node keeps of a
// sandbox, oldest first.
func (c *Client) SandboxEvents(ctx context.Context, sandboxID string) ([]*warrenv1.SecurityEvent, error) {
	var out []*warrenv1.SecurityEvent
	req := &warrenv1.ListSandboxEventsRequest{SandboxId: sandboxID, PageSize: 1000}
	for {
		res, err := c.ListSandboxEvents(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, res.GetEvents()...)
		if req.PageToken = res.GetNextPageToken(); req.PageToken == "" {
			return out, nil
		}
	}
}

// ReadTrajectory returns one page of a sandbox's trajectory log: its
// execs and file writes as numbered steps, in the order their outcomes
// were recorded; pass the response's NextPageToken for the next page.
func (c *Client) ReadTrajectory(ctx context.Context, req *warrenv1.ReadTrajectoryRequest) (*warrenv1.ReadTrajectoryResponse, error) {
	return call(ctx, c.sandboxes.ReadTrajectory, req)
}

// Trajectory returns a sandbox's whole trajectory log (of one session,
// or of every session when session is "").
func (c *Client) Trajectory(ctx context.Context, sandboxID, session string) ([]*warrenv1.TrajectoryEntry, error) {
	var out []*warrenv1.TrajectoryEntry
	req := &warrenv1.ReadTrajectoryRequest{SandboxId: sandboxID, SessionId: session, PageSize: 1000}
	for {
		res, err := c.ReadTrajectory(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, res.GetEntries()...)
		if req.PageToken = res.GetNextPageToken(); req.PageToken == "" {
			return out, nil
		}
	}
}

// WaitProcess waits for a background process to exit.
func (c *Client) WaitProcess(ctx context.Context, req *warrenv1.WaitProcessRequest) (*warrenv1.ExecResult, error) {
	return call(ctx, c.sandboxes.WaitProcess, req)
}

// SignalProcess sends a signal to a background process.
func (c *Client) SignalProcess(ctx context.Context, req *warrenv1.SignalProcessRequest) error {
	_, err := call(ctx, c.sandboxes.SignalProcess, req)
	return err
}

// WriteStdin writes to a background process's stdin.
func (c *Client) WriteStdin(ctx context.Context, req *warrenv1.WriteStdinRequest) error {
	_, err := call(ctx, c.sandboxes.WriteStdin, req)
	return err
}

// AttachProcess follows a background process's output from the offsets
// in req (-1 skips a stream), calling fn with each event as it comes;
// the last event carries the exit (ExecResult without output), which
// AttachProcess also returns. Cancelling ctx detaches; the process runs on.
func (c *Client) AttachProcess(ctx context.Context, req *warrenv1.AttachProcessRequest, fn func(*warrenv1.ProcessEvent) error) (*warrenv1.ExecResult, error) {
	st, err := c.sandboxes.AttachProcess(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrapErr(err)
	}
	defer st.Close()
	var exit *warrenv1.ExecResult
	for st.Receive() {
		ev := st.Msg()
		if r := ev.GetExit(); r != nil {
			exit = r
		}
		if fn != nil {
			if err := fn(ev); err != nil {
				return nil, err
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, wrapErr(err)
	}
	if exit == nil {
		return nil, &Error{Category: CategoryUnavailable, Code: connect.CodeUnavailable, Message: "attach stream ended without the exit"}
	}
	return exit, nil
}

// ResizeProcess sets the terminal size of a background process started
// with a pty.
func (c *Client) ResizeProcess(ctx context.Context, req *warrenv1.ResizeProcessRequest) error {
	_, err := call(ctx, c.sandboxes.ResizeProcess, req)
	return err
}

// WriteFile writes a file in a sandbox.
func (c *Client) WriteFile(ctx context.Context, req *warrenv1.WriteFileRequest) error {
	_, err := call(ctx, c.sandboxes.WriteFile, req)
	return err
}

// ReadFile reads (part of) a file in a sandbox.
func (c *Client) ReadFile(ctx context.Context, req *warrenv1.ReadFileRequest) (*warrenv1.ReadFileResponse, error) {
	return call(ctx, c.sandboxes.ReadFile, req)
}

// ListFiles lists a whole directory in a sandbox, paging through it
// (ListFilesPage) until the last page. Entries come in the directory's
// own order, not sorted. A huge directory makes a big slice: page with
// ListFilesPage to hold one page at a time.
func (c *Client) ListFiles(ctx context.Context, sandboxID, path string) ([]*warrenv1.FileInfo, error) {
	req := &warrenv1.ListFilesRequest{SandboxId: sandboxID, Path: path}
	var out []*warrenv1.FileInfo
	for {
		res, err := c.ListFilesPage(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, res.GetFiles()...)
		if res.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = res.GetNextPageToken()
	}
}

// ListFilesPage returns one page of a directory in a sandbox: at most
// req.PageSize entries (0: 1,000; at most 10,000) and, when more follow,
// a NextPageToken to send back as req.PageToken with the same path.
func (c *Client) ListFilesPage(ctx context.Context, req *warrenv1.ListFilesRequest) (*warrenv1.ListFilesResponse, error) {
	return call(ctx, c.sandboxes.ListFiles, req)
}

// StatFile describes a file in a sandbox (symlinks are not followed).
func (c *Client) StatFile(ctx context.Context, sandboxID, path string) (*warrenv1.FileInfo, error) {
	return call(ctx, c.sandboxes.StatFile, &warrenv1.StatFileRequest{SandboxId: sandboxID, Path: path})
}

// MakeDir creates a directory in a sandbox.
func (c *Client) MakeDir(ctx context.Context, req *warrenv1.MakeDirRequest) error {
	_, err := call(ctx, c.sandboxes.MakeDir, req)
	return err
}

// RemoveFile removes a file or directory in a sandbox.
func (c *Client) RemoveFile(ctx context.Context, req *warrenv1.RemoveFileRequest) error {
	_, err := call(ctx, c.sandboxes.RemoveFile, req)
	return err
}

// WatchDir follows the changes of a directory of a running sandbox (and
// of every directory below it with req.Recursive), calling fn with each
// event: first one with Started once the watch is set, then one File
// event per change. It returns nil when the directory is removed, and
// an error when ctx ends, fn fails, or the sandbox leaves RUNNING
// (CategoryUnavailable).
func (c *Client) WatchDir(ctx context.Context, req *warrenv1.WatchDirRequest, fn func(*warrenv1.WatchDirEvent) error) error {
	st, err := c.sandboxes.WatchDir(ctx, connect.NewRequest(req))
	if err != nil {
		return wrapErr(err)
	}
	defer st.Close()
	for st.Receive() {
		if err := fn(st.Msg()); err != nil {
			return err
		}
	}
	return wrapErr(st.Err())
}

// SandboxStats reads a running sandbox's resource use now (cumulative CPU
// time, memory, disk); two reads give a rate.
func (c *Client) SandboxStats(ctx context.Context, sandboxID string) (*warrenv1.SandboxStatsResponse, error) {
	return call(ctx, c.sandboxes.SandboxStats, &warrenv1.SandboxStatsRequest{SandboxId: sandboxID})
}

// CommitSandbox turns the writable layer of a running sandbox into the
// named layer name (replacing one of that name); a sandbox created from
// the same image and layers with name on top sees the same files. The
// sandbox is frozen while its files are read.
// Setuid/setgid bits and file capabilities are stripped from the layer
// (Layer.SetuidStripped counts the files) unless CommitSandboxWith asks
// to keep them.
func (c *Client) CommitSandbox(ctx context.Context, sandboxID, name string) (*warrenv1.Layer, error) {
	return c.CommitSandboxWith(ctx, &warrenv1.CommitSandboxRequest{SandboxId: sandboxID, Name: name})
}

// CommitSandboxWith is CommitSandbox with every field of the request, such
// as KeepSetuid (for a sandbox whose files are trusted; recorded in the
// layer as SetuidKept).
func (c *Client) CommitSandboxWith(ctx context.Context, req *warrenv1.CommitSandboxRequest) (*warrenv1.Layer, error) {
	return call(ctx, c.sandboxes.CommitSandbox, req)
}

// ListImages lists the daemon's images.
func (c *Client) ListImages(ctx context.Context) ([]*warrenv1.Image, error) {
	res, err := call(ctx, c.images.ListImages, &warrenv1.ListImagesRequest{})
	if err != nil {
		return nil, err
	}
	return res.GetImages(), nil
}

// GetImage returns one image.
func (c *Client) GetImage(ctx context.Context, name string) (*warrenv1.Image, error) {
	return call(ctx, c.images.GetImage, &warrenv1.GetImageRequest{Name: name})
}

// ImportImage imports a root filesystem directory or tarball (optionally
// gzip-compressed) that the daemon can read at path. See ImportImageTar to
// upload one instead.
func (c *Client) ImportImage(ctx context.Context, name, path string) (*warrenv1.Image, error) {
	return call(ctx, c.images.ImportImage, &warrenv1.ImportImageRequest{Name: name, Path: path})
}

// RemoveImage removes an image.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	_, err := call(ctx, c.images.RemoveImage, &warrenv1.RemoveImageRequest{Name: name})
	return err
}

// PullImage imports an OCI or Docker image on the daemon (a registry
// reference, oci:DIR[:TAG] or docker-archive:FILE[:REPO:TAG], paths on the
// daemon's host) and returns it. fn, if not nil, is called with every
// progress event; if it returns an error the import is cancelled and that
// error returned.
func (c *Client) PullImage(ctx context.Context, req *warrenv1.PullImageRequest, fn func(*warrenv1.PullImageEvent) error) (*warrenv1.Image, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.images.PullImage(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrapErr(err)
	}
	defer st.Close()
	var img *warrenv1.Image
	for st.Receive() {
		ev := st.Msg()
		if ev.GetImage() != nil {
			img = ev.GetImage()
		}
		if fn != nil {
			if err := fn(ev); err != nil {
				return nil, err
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, wrapErr(err)
	}
	if img == nil {
		return nil, &Error{Category: CategoryUnavailable, Code: connect.CodeUnavailable, Message: "image pull stream ended without the image"}
	}
	return img, nil
}

// BuildLayer makes the directory tree or tarball (optionally
// gzip-compressed) that the daemon can read at path the named layer name.
// See BuildLayerTar to upload one instead.
func (c *Client) BuildLayer(ctx context.Context, name, path string) (*warrenv1.Layer, error) {
	return call(ctx, c.images.BuildLayer, &warrenv1.BuildLayerRequest{Name: name, Path: path})
}

// ListLayers lists the named layers.
func (c *Client) ListLayers(ctx context.Context) ([]*warrenv1.Layer, error) {
	res, err := call(ctx, c.images.ListLayers, &warrenv1.ListLayersRequest{})
	if err != nil {
		return nil, err
	}
	return res.GetLayers(), nil
}

// RemoveLayer removes a named layer (refused while a sandbox uses it).
func (c *Client) RemoveLayer(ctx context.Context, name string) error {
	_, err := call(ctx, c.images.RemoveLayer, &warrenv1.RemoveLayerRequest{Name: name})
	return err
}

// ImageStats reports how much of each layer of the named images (named
// layers as "layer:NAME"; everything when none are given) is in the
// daemon node's page cache, and whether it is mounted.
func (c *Client) ImageStats(ctx context.Context, names ...string) ([]*warrenv1.LayerStat, error) {
	res, err := call(ctx, c.images.ImageStats, &warrenv1.ImageStatsRequest{Names: names})
	if err != nil {
		return nil, err
	}
	return res.GetLayers(), nil
}

// VerifyImage checks the digests of the stored layer blobs of the named
// images (named layers as "layer:NAME"; every blob when none are given).
// Corrupt blobs are reported in the results, not as an error.
func (c *Client) VerifyImage(ctx context.Context, names ...string) ([]*warrenv1.LayerVerification, error) {
	res, err := call(ctx, c.images.VerifyImage, &warrenv1.VerifyImageRequest{Names: names})
	if err != nil {
		return nil, err
	}
	return res.GetLayers(), nil
}

// Version returns the daemon's version and capabilities.
func (c *Client) Version(ctx context.Context) (*warrenv1.VersionResponse, error) {
	return call(ctx, c.system.Version, &warrenv1.VersionRequest{})
}

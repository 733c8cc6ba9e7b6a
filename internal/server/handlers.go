package server

import (
	"context"
	"io"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

// Manager is what the server needs from the daemon: one method per RPC with
// the proto types, plus the streaming and tar helpers of the plain HTTP
// endpoints. *daemon.Manager implements it.
type Manager interface {
	Create(context.Context, *warrenv1.CreateRequest) (*warrenv1.Sandbox, error)
	Get(context.Context, *warrenv1.GetRequest) (*warrenv1.Sandbox, error)
	List(context.Context, *warrenv1.ListRequest) (*warrenv1.ListResponse, error)
	Delete(context.Context, *warrenv1.DeleteRequest) (*warrenv1.DeleteResponse, error)
	ExtendTimeout(context.Context, *warrenv1.ExtendTimeoutRequest) (*warrenv1.Sandbox, error)
	UpdateSandbox(context.Context, *warrenv1.UpdateSandboxRequest) (*warrenv1.Sandbox, error)

	Exec(context.Context, *warrenv1.ExecRequest) (*warrenv1.ExecResult, error)
	ExecStream(ctx context.Context, req *warrenv1.ExecRequest, send func(*warrenv1.ExecEvent) error) error
	StartProcess(context.Context, *warrenv1.ExecRequest) (*warrenv1.ProcessInfo, error)
	ListProcesses(context.Context, *warrenv1.ListProcessesRequest) (*warrenv1.ListProcessesResponse, error)
	WaitProcess(context.Context, *warrenv1.WaitProcessRequest) (*warrenv1.ExecResult, error)
	SignalProcess(context.Context, *warrenv1.SignalProcessRequest) (*warrenv1.SignalProcessResponse, error)
	WriteStdin(context.Context, *warrenv1.WriteStdinRequest) (*warrenv1.WriteStdinResponse, error)
	AttachProcess(ctx context.Context, req *warrenv1.AttachProcessRequest, send func(*warrenv1.ProcessEvent) error) error
	ResizeProcess(context.Context, *warrenv1.ResizeProcessRequest) (*warrenv1.ResizeProcessResponse, error)

	WriteFile(context.Context, *warrenv1.WriteFileRequest) (*warrenv1.WriteFileResponse, error)
	ReadFile(context.Context, *warrenv1.ReadFileRequest) (*warrenv1.ReadFileResponse, error)
	ListFiles(context.Context, *warrenv1.ListFilesRequest) (*warrenv1.ListFilesResponse, error)
	StatFile(context.Context, *warrenv1.StatFileRequest) (*warrenv1.FileInfo, error)
	MakeDir(context.Context, *warrenv1.MakeDirRequest) (*warrenv1.MakeDirResponse, error)
	RemoveFile(context.Context, *warrenv1.RemoveFileRequest) (*warrenv1.RemoveFileResponse, error)
	WatchDir(ctx context.Context, req *warrenv1.WatchDirRequest, send func(*warrenv1.WatchDirEvent) error) error
	SandboxStats(context.Context, *warrenv1.SandboxStatsRequest) (*warrenv1.SandboxStatsResponse, error)
	CommitSandbox(context.Context, *warrenv1.CommitSandboxRequest) (*warrenv1.Layer, error)
	ListSandboxEvents(context.Context, *warrenv1.ListSandboxEventsRequest) (*warrenv1.ListSandboxEventsResponse, error)
	ReadTrajectory(context.Context, *warrenv1.ReadTrajectoryRequest) (*warrenv1.ReadTrajectoryResponse, error)
	Pause(context.Context, *warrenv1.PauseRequest) (*warrenv1.PauseResponse, error)
	Screenshot(context.Context, *warrenv1.ScreenshotRequest) (*warrenv1.ScreenshotResponse, error)
	SendInput(context.Context, *warrenv1.SendInputRequest) (*warrenv1.SendInputResponse, error)
	Resume(context.Context, *warrenv1.ResumeRequest) (*warrenv1.ResumeResponse, error)
	PauseByLabel(ctx context.Context, req *warrenv1.PauseByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error
	Hibernate(context.Context, *warrenv1.HibernateRequest) (*warrenv1.HibernateResponse, error)
	Fork(context.Context, *warrenv1.ForkRequest) (*warrenv1.ForkResponse, error)
	Restore(context.Context, *warrenv1.RestoreRequest) (*warrenv1.ResumeResponse, error)
	HibernateByLabel(ctx context.Context, req *warrenv1.HibernateByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error
	ResumeByLabel(ctx context.Context, req *warrenv1.ResumeByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error
	Run(context.Context, *warrenv1.RunRequest) (*warrenv1.RunResult, error)
	RunBatch(ctx context.Context, req *warrenv1.RunBatchRequest, send func(*warrenv1.RunBatchItem) error) error
	BatchCreate(context.Context, *warrenv1.BatchCreateRequest) (*warrenv1.BatchCreateResponse, error)
	TarOut(ctx context.Context, id, path string, w io.Writer, o sandboxfs.TarOptions) error
	TarIn(ctx context.Context, id, path string, r io.Reader) error

	ListImages(context.Context, *warrenv1.ListImagesRequest) (*warrenv1.ListImagesResponse, error)
	GetImage(context.Context, *warrenv1.GetImageRequest) (*warrenv1.Image, error)
	ImportImage(context.Context, *warrenv1.ImportImageRequest) (*warrenv1.Image, error)
	ImportImageTar(ctx context.Context, name string, r io.Reader) (*warrenv1.Image, error)
	RemoveImage(context.Context, *warrenv1.RemoveImageRequest) (*warrenv1.RemoveImageResponse, error)
	PullImage(ctx context.Context, req *warrenv1.PullImageRequest, send func(*warrenv1.PullImageEvent) error) error
	BuildLayer(context.Context, *warrenv1.BuildLayerRequest) (*warrenv1.Layer, error)
	BuildLayerTar(ctx context.Context, name string, r io.Reader) (*warrenv1.Layer, error)
	ListLayers(context.Context, *warrenv1.ListLayersRequest) (*warrenv1.ListLayersResponse, error)
	RemoveLayer(context.Context, *warrenv1.RemoveLayerRequest) (*warrenv1.RemoveLayerResponse, error)
	ImageStats(context.Context, *warrenv1.ImageStatsRequest) (*warrenv1.ImageStatsResponse, error)
	VerifyImage(context.Context, *warrenv1.VerifyImageRequest) (*warrenv1.VerifyImageResponse, error)

	Version(context.Context, *warrenv1.VersionRequest) (*warrenv1.VersionResponse, error)
	NodeStatus(context.Context, *warrenv1.NodeStatusRequest) (*warrenv1.NodeStatusResponse, error)
}

// unary adapts a Manager method to a connect unary handler body.
func unary[Req, Res any](ctx context.Context, req *connect.Request[Req], fn func(context.Context, *Req) (*Res, error)) (*connect.Response[Res], error) {
	res, err := fn(ctx, req.Msg)
	if err != nil {
		return nil, ToConnectError(err)
	}
	return connect.NewResponse(res), nil
}

// sandboxService implements warrenv1connect.SandboxServiceHandler.
type sandboxService struct{ m Manager }

func (s sandboxService) Create(ctx context.Context, r *connect.Request[warrenv1.CreateRequest]) (*connect.Response[warrenv1.Sandbox], error) {
	return unary(ctx, r, s.m.Create)
}

func (s sandboxService) Get(ctx context.Context, r *connect.Request[warrenv1.GetRequest]) (*connect.Response[warrenv1.Sandbox], error) {
	return unary(ctx, r, s.m.Get)
}

func (s sandboxService) List(ctx context.Context, r *connect.Request[warrenv1.ListRequest]) (*connect.Response[warrenv1.ListResponse], error) {
	return unary(ctx, r, s.m.List)
}

func (s sandboxService) Delete(ctx context.Context, r *connect.Request[warrenv1.DeleteRequest]) (*connect.Response[warrenv1.DeleteResponse], error) {
	return unary(ctx, r, s.m.Delete)
}

func (s sandboxService) UpdateSandbox(ctx context.Context, r *connect.Request[warrenv1.UpdateSandboxRequest]) (*connect.Response[warrenv1.Sandbox], error) {
	return unary(ctx, r, s.m.UpdateSandbox)
}

func (s sandboxService) ExtendTimeout(ctx context.Context, r *connect.Request[warrenv1.ExtendTimeoutRequest]) (*connect.Response[warrenv1.Sandbox], error) {
	return unary(ctx, r, s.m.ExtendTimeout)
}

func (s sandboxService) Exec(ctx context.Context, r *connect.Request[warrenv1.ExecRequest]) (*connect.Response[warrenv1.ExecResult], error) {
	return unary(ctx, r, s.m.Exec)
}

func (s sandboxService) ExecStream(ctx context.Context, r *connect.Request[warrenv1.ExecRequest], st *connect.ServerStream[warrenv1.ExecEvent]) error {
	return ToConnectError(s.m.ExecStream(ctx, r.Msg, st.Send))
}

func (s sandboxService) StartProcess(ctx context.Context, r *connect.Request[warrenv1.ExecRequest]) (*connect.Response[warrenv1.ProcessInfo], error) {
	return unary(ctx, r, s.m.StartProcess)
}

func (s sandboxService) ListProcesses(ctx context.Context, r *connect.Request[warrenv1.ListProcessesRequest]) (*connect.Response[warrenv1.ListProcessesResponse], error) {
	return unary(ctx, r, s.m.ListProcesses)
}

func (s sandboxService) WaitProcess(ctx context.Context, r *connect.Request[warrenv1.WaitProcessRequest]) (*connect.Response[warrenv1.ExecResult], error) {
	return unary(ctx, r, s.m.WaitProcess)
}

func (s sandboxService) SignalProcess(ctx context.Context, r *connect.Request[warrenv1.SignalProcessRequest]) (*connect.Response[warrenv1.SignalProcessResponse], error) {
	return unary(ctx, r, s.m.SignalProcess)
}

func (s sandboxService) WriteStdin(ctx context.Context, r *connect.Request[warrenv1.WriteStdinRequest]) (*connect.Response[warrenv1.WriteStdinResponse], error) {
	return unary(ctx, r, s.m.WriteStdin)
}

func (s sandboxService) AttachProcess(ctx context.Context, r *connect.Request[warrenv1.AttachProcessRequest], st *connect.ServerStream[warrenv1.ProcessEvent]) error {
	return ToConnectError(s.m.AttachProcess(ctx, r.Msg, st.Send))
}

func (s sandboxService) ResizeProcess(ctx context.Context, r *connect.Request[warrenv1.ResizeProcessRequest]) (*connect.Response[warrenv1.ResizeProcessResponse], error) {
	return unary(ctx, r, s.m.ResizeProcess)
}

func (s sandboxService) WriteFile(ctx context.Context, r *connect.Request[warrenv1.WriteFileRequest]) (*connect.Response[warrenv1.WriteFileResponse], error) {
	return unary(ctx, r, s.m.WriteFile)
}

func (s sandboxService) ReadFile(ctx context.Context, r *connect.Request[warrenv1.ReadFileRequest]) (*connect.Response[warrenv1.ReadFileResponse], error) {
	return unary(ctx, r, s.m.ReadFile)
}

func (s sandboxService) ListFiles(ctx context.Context, r *connect.Request[warrenv1.ListFilesRequest]) (*connect.Response[warrenv1.ListFilesResponse], error) {
	return unary(ctx, r, s.m.ListFiles)
}

func (s sandboxService) StatFile(ctx context.Context, r *connect.Request[warrenv1.StatFileRequest]) (*connect.Response[warrenv1.FileInfo], error) {
	return unary(ctx, r, s.m.StatFile)
}

func (s sandboxService) MakeDir(ctx context.Context, r *connect.Request[warrenv1.MakeDirRequest]) (*connect.Response[warrenv1.MakeDirResponse], error) {
	return unary(ctx, r, s.m.MakeDir)
}

func (s sandboxService) RemoveFile(ctx context.Context, r *connect.Request[warrenv1.RemoveFileRequest]) (*connect.Response[warrenv1.RemoveFileResponse], error) {
	return unary(ctx, r, s.m.RemoveFile)
}

func (s sandboxService) WatchDir(ctx context.Context, r *connect.Request[warrenv1.WatchDirRequest], st *connect.ServerStream[warrenv1.WatchDirEvent]) error {
	return ToConnectError(s.m.WatchDir(ctx, r.Msg, st.Send))
}

func (s sandboxService) SandboxStats(ctx context.Context, r *connect.Request[warrenv1.SandboxStatsRequest]) (*connect.Response[warrenv1.SandboxStatsResponse], error) {
	return unary(ctx, r, s.m.SandboxStats)
}

func (s sandboxService) CommitSandbox(ctx context.Context, r *connect.Request[warrenv1.CommitSandboxRequest]) (*connect.Response[warrenv1.Layer], error) {
	return unary(ctx, r, s.m.CommitSandbox)
}

func (s sandboxService) Run(ctx context.Context, r *connect.Request[warrenv1.RunRequest]) (*connect.Response[warrenv1.RunResult], error) {
	return unary(ctx, r, s.m.Run)
}

func (s sandboxService) RunBatch(ctx context.Context, r *connect.Request[warrenv1.RunBatchRequest], st *connect.ServerStream[warrenv1.RunBatchItem]) error {
	return ToConnectError(s.m.RunBatch(ctx, r.Msg, st.Send))
}

func (s sandboxService) ListSandboxEvents(ctx context.Context, r *connect.Request[warrenv1.ListSandboxEventsRequest]) (*connect.Response[warrenv1.ListSandboxEventsResponse], error) {
	return unary(ctx, r, s.m.ListSandboxEvents)
}

func (s sandboxService) ReadTrajectory(ctx context.Context, r *connect.Request[warrenv1.ReadTrajectoryRequest]) (*connect.Response[warrenv1.ReadTrajectoryResponse], error) {
	return unary(ctx, r, s.m.ReadTrajectory)
}

// StepRecorder is a Manager that records archive uploads in the
// sandbox's trajectory log: PUT /v1/sandboxes/{id}/archive takes the
// step as query parameters session and seq, and answers the step it was
// recorded as in the headers HeaderTrajectorySeq and
// HeaderTrajectoryReplayed.
type StepRecorder interface {
	TarInStep(ctx context.Context, id, path, session string, seq uint64, r io.Reader) (gotSeq uint64, replayed bool, err error)
}

// Headers of an archive upload's answer (StepRecorder).
const (
	HeaderTrajectorySeq      = "Warren-Trajectory-Seq"
	HeaderTrajectoryReplayed = "Warren-Trajectory-Replayed"
)

func (s sandboxService) Pause(ctx context.Context, r *connect.Request[warrenv1.PauseRequest]) (*connect.Response[warrenv1.PauseResponse], error) {
	return unary(ctx, r, s.m.Pause)
}

func (s sandboxService) Screenshot(ctx context.Context, r *connect.Request[warrenv1.ScreenshotRequest]) (*connect.Response[warrenv1.ScreenshotResponse], error) {
	return unary(ctx, r, s.m.Screenshot)
}

func (s sandboxService) SendInput(ctx context.Context, r *connect.Request[warrenv1.SendInputRequest]) (*connect.Response[warrenv1.SendInputResponse], error) {
	return unary(ctx, r, s.m.SendInput)
}

func (s sandboxService) Resume(ctx context.Context, r *connect.Request[warrenv1.ResumeRequest]) (*connect.Response[warrenv1.ResumeResponse], error) {
	return unary(ctx, r, s.m.Resume)
}

func (s sandboxService) Hibernate(ctx context.Context, r *connect.Request[warrenv1.HibernateRequest]) (*connect.Response[warrenv1.HibernateResponse], error) {
	return unary(ctx, r, s.m.Hibernate)
}

func (s sandboxService) Fork(ctx context.Context, r *connect.Request[warrenv1.ForkRequest]) (*connect.Response[warrenv1.ForkResponse], error) {
	return unary(ctx, r, s.m.Fork)
}

func (s sandboxService) Restore(ctx context.Context, r *connect.Request[warrenv1.RestoreRequest]) (*connect.Response[warrenv1.ResumeResponse], error) {
	return unary(ctx, r, s.m.Restore)
}

func (s sandboxService) HibernateByLabel(ctx context.Context, r *connect.Request[warrenv1.HibernateByLabelRequest], st *connect.ServerStream[warrenv1.ByLabelEvent]) error {
	return ToConnectError(s.m.HibernateByLabel(ctx, r.Msg, st.Send))
}

func (s sandboxService) PauseByLabel(ctx context.Context, r *connect.Request[warrenv1.PauseByLabelRequest], st *connect.ServerStream[warrenv1.ByLabelEvent]) error {
	return ToConnectError(s.m.PauseByLabel(ctx, r.Msg, st.Send))
}

func (s sandboxService) ResumeByLabel(ctx context.Context, r *connect.Request[warrenv1.ResumeByLabelRequest], st *connect.ServerStream[warrenv1.ByLabelEvent]) error {
	return ToConnectError(s.m.ResumeByLabel(ctx, r.Msg, st.Send))
}

// imageService implements warrenv1connect.ImageServiceHandler.
type imageService struct{ m Manager }

func (s imageService) ListImages(ctx context.Context, r *connect.Request[warrenv1.ListImagesRequest]) (*connect.Response[warrenv1.ListImagesResponse], error) {
	return unary(ctx, r, s.m.ListImages)
}

func (s imageService) GetImage(ctx context.Context, r *connect.Request[warrenv1.GetImageRequest]) (*connect.Response[warrenv1.Image], error) {
	return unary(ctx, r, s.m.GetImage)
}

func (s imageService) ImportImage(ctx context.Context, r *connect.Request[warrenv1.ImportImageRequest]) (*connect.Response[warrenv1.Image], error) {
	return unary(ctx, r, s.m.ImportImage)
}

func (s imageService) RemoveImage(ctx context.Context, r *connect.Request[warrenv1.RemoveImageRequest]) (*connect.Response[warrenv1.RemoveImageResponse], error) {
	return unary(ctx, r, s.m.RemoveImage)
}

func (s imageService) PullImage(ctx context.Context, r *connect.Request[warrenv1.PullImageRequest], st *connect.ServerStream[warrenv1.PullImageEvent]) error {
	return ToConnectError(s.m.PullImage(ctx, r.Msg, st.Send))
}

func (s imageService) BuildLayer(ctx context.Context, r *connect.Request[warrenv1.BuildLayerRequest]) (*connect.Response[warrenv1.Layer], error) {
	return unary(ctx, r, s.m.BuildLayer)
}

func (s imageService) ListLayers(ctx context.Context, r *connect.Request[warrenv1.ListLayersRequest]) (*connect.Response[warrenv1.ListLayersResponse], error) {
	return unary(ctx, r, s.m.ListLayers)
}

func (s imageService) RemoveLayer(ctx context.Context, r *connect.Request[warrenv1.RemoveLayerRequest]) (*connect.Response[warrenv1.RemoveLayerResponse], error) {
	return unary(ctx, r, s.m.RemoveLayer)
}

func (s imageService) ImageStats(ctx context.Context, r *connect.Request[warrenv1.ImageStatsRequest]) (*connect.Response[warrenv1.ImageStatsResponse], error) {
	return unary(ctx, r, s.m.ImageStats)
}

func (s imageService) VerifyImage(ctx context.Context, r *connect.Request[warrenv1.VerifyImageRequest]) (*connect.Response[warrenv1.VerifyImageResponse], error) {
	return unary(ctx, r, s.m.VerifyImage)
}

// systemService implements warrenv1connect.SystemServiceHandler.
type systemService struct{ m Manager }

func (s sandboxService) BatchCreate(ctx context.Context, r *connect.Request[warrenv1.BatchCreateRequest]) (*connect.Response[warrenv1.BatchCreateResponse], error) {
	return unary(ctx, r, s.m.BatchCreate)
}

func (s systemService) NodeStatus(ctx context.Context, r *connect.Request[warrenv1.NodeStatusRequest]) (*connect.Response[warrenv1.NodeStatusResponse], error) {
	return unary(ctx, r, s.m.NodeStatus)
}

func (s systemService) Version(ctx context.Context, r *connect.Request[warrenv1.VersionRequest]) (*connect.Response[warrenv1.VersionResponse], error) {
	return unary(ctx, r, s.m.Version)
}

package server

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"strings"
	"sync"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

// fakeManager is an in-memory Manager: sandboxes are a map, Exec echoes
// argv, and errors are injected through err.
type fakeManager struct {
	mu        sync.Mutex
	sandboxes map[string]*warrenv1.Sandbox
	files     map[string][]byte // "id:path" -> content, for TarIn/TarOut
	err       error             // returned by Get when set
}

func newFake() *fakeManager {
	return &fakeManager{sandboxes: map[string]*warrenv1.Sandbox{}, files: map[string][]byte{}}
}

func (f *fakeManager) Create(_ context.Context, r *warrenv1.CreateRequest) (*warrenv1.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Image == "" {
		return nil, errdefs.Invalidf("image is required")
	}
	if _, ok := f.sandboxes[r.Id]; ok {
		return nil, errdefs.AlreadyExistsf("sandbox %s already exists", r.Id)
	}
	sb := &warrenv1.Sandbox{Id: r.Id, Image: r.Image, State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING, Labels: r.Labels}
	f.sandboxes[r.Id] = sb
	return sb, nil
}

func (f *fakeManager) Get(_ context.Context, r *warrenv1.GetRequest) (*warrenv1.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	sb, ok := f.sandboxes[r.Id]
	if !ok {
		return nil, errdefs.NotFoundf("sandbox %s not found", r.Id)
	}
	return sb, nil
}

func (f *fakeManager) List(context.Context, *warrenv1.ListRequest) (*warrenv1.ListResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := &warrenv1.ListResponse{}
	for _, sb := range f.sandboxes {
		res.Sandboxes = append(res.Sandboxes, sb)
	}
	return res, nil
}

func (f *fakeManager) Delete(_ context.Context, r *warrenv1.DeleteRequest) (*warrenv1.DeleteResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sandboxes[r.Id]; !ok {
		return nil, errdefs.NotFoundf("sandbox %s not found", r.Id)
	}
	delete(f.sandboxes, r.Id)
	return &warrenv1.DeleteResponse{}, nil
}

func (f *fakeManager) UpdateSandbox(ctx context.Context, r *warrenv1.UpdateSandboxRequest) (*warrenv1.Sandbox, error) {
	return f.Get(ctx, &warrenv1.GetRequest{Id: r.Id})
}

func (f *fakeManager) ExtendTimeout(ctx context.Context, r *warrenv1.ExtendTimeoutRequest) (*warrenv1.Sandbox, error) {
	return f.Get(ctx, &warrenv1.GetRequest{Id: r.Id})
}

func (f *fakeManager) Exec(_ context.Context, r *warrenv1.ExecRequest) (*warrenv1.ExecResult, error) {
	if r.Shell == "panic" {
		panic("boom")
	}
	return &warrenv1.ExecResult{Stdout: []byte(strings.Join(r.Argv, " ")), ExitCode: int32(len(r.Argv))}, nil
}

func (f *fakeManager) ExecStream(ctx context.Context, r *warrenv1.ExecRequest, send func(*warrenv1.ExecEvent) error) error {
	for _, a := range r.Argv {
		if err := send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Stdout{Stdout: []byte(a)}}); err != nil {
			return err
		}
		if err := send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Stderr{Stderr: []byte("e")}}); err != nil {
			return err
		}
	}
	if r.Shell == "block" {
		<-ctx.Done()
		return ctx.Err()
	}
	return send(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Result{Result: &warrenv1.ExecResult{ExitCode: 7}}})
}

func (f *fakeManager) StartProcess(context.Context, *warrenv1.ExecRequest) (*warrenv1.ProcessInfo, error) {
	return &warrenv1.ProcessInfo{ProcessId: "p-1"}, nil
}

func (f *fakeManager) ListProcesses(context.Context, *warrenv1.ListProcessesRequest) (*warrenv1.ListProcessesResponse, error) {
	return &warrenv1.ListProcessesResponse{}, nil
}

func (f *fakeManager) WaitProcess(ctx context.Context, r *warrenv1.WaitProcessRequest) (*warrenv1.ExecResult, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (f *fakeManager) SignalProcess(context.Context, *warrenv1.SignalProcessRequest) (*warrenv1.SignalProcessResponse, error) {
	return &warrenv1.SignalProcessResponse{}, nil
}

func (f *fakeManager) AttachProcess(context.Context, *warrenv1.AttachProcessRequest, func(*warrenv1.ProcessEvent) error) error {
	return nil
}

func (f *fakeManager) ResizeProcess(context.Context, *warrenv1.ResizeProcessRequest) (*warrenv1.ResizeProcessResponse, error) {
	return &warrenv1.ResizeProcessResponse{}, nil
}

func (f *fakeManager) WriteStdin(context.Context, *warrenv1.WriteStdinRequest) (*warrenv1.WriteStdinResponse, error) {
	return &warrenv1.WriteStdinResponse{}, nil
}

func (f *fakeManager) WriteFile(_ context.Context, r *warrenv1.WriteFileRequest) (*warrenv1.WriteFileResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[r.SandboxId+":"+r.Path] = r.Content
	return &warrenv1.WriteFileResponse{}, nil
}

func (f *fakeManager) ReadFile(_ context.Context, r *warrenv1.ReadFileRequest) (*warrenv1.ReadFileResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[r.SandboxId+":"+r.Path]
	if !ok {
		return nil, errdefs.NotFoundf("%s: no such file", r.Path)
	}
	return &warrenv1.ReadFileResponse{Content: b, Size: int64(len(b)), Eof: true}, nil
}

func (f *fakeManager) ListFiles(context.Context, *warrenv1.ListFilesRequest) (*warrenv1.ListFilesResponse, error) {
	return &warrenv1.ListFilesResponse{}, nil
}

func (f *fakeManager) StatFile(_ context.Context, r *warrenv1.StatFileRequest) (*warrenv1.FileInfo, error) {
	return &warrenv1.FileInfo{Path: r.Path, IsDir: true, Type: "dir"}, nil
}

func (f *fakeManager) MakeDir(context.Context, *warrenv1.MakeDirRequest) (*warrenv1.MakeDirResponse, error) {
	return &warrenv1.MakeDirResponse{}, nil
}

func (f *fakeManager) RemoveFile(context.Context, *warrenv1.RemoveFileRequest) (*warrenv1.RemoveFileResponse, error) {
	return &warrenv1.RemoveFileResponse{}, nil
}

func (f *fakeManager) WatchDir(context.Context, *warrenv1.WatchDirRequest, func(*warrenv1.WatchDirEvent) error) error {
	return nil
}

func (f *fakeManager) SandboxStats(context.Context, *warrenv1.SandboxStatsRequest) (*warrenv1.SandboxStatsResponse, error) {
	return &warrenv1.SandboxStatsResponse{}, nil
}

// TarOut writes one-entry tar of the stored file; path "/fail-mid" fails
// after writing some bytes.
func (f *fakeManager) TarOut(_ context.Context, id, path string, w io.Writer, _ sandboxfs.TarOptions) error {
	if path == "/fail-mid" {
		if _, err := w.Write(bytes.Repeat([]byte{'x'}, 4096)); err != nil {
			return err
		}
		return errdefs.Internalf("disk on fire")
	}
	f.mu.Lock()
	b, ok := f.files[id+":"+path]
	f.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("%s: no such file", path)
	}
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(b); err != nil {
		return err
	}
	return tw.Close()
}

// TarIn stores the first entry of the tar at path/<name>.
func (f *fakeManager) TarIn(_ context.Context, id, path string, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errdefs.Wrap(errdefs.Invalid, err, "read tar")
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return errdefs.Wrap(errdefs.Invalid, err, "read tar")
		}
		f.mu.Lock()
		f.files[id+":"+path+"/"+h.Name] = b
		f.mu.Unlock()
	}
}

func (f *fakeManager) ListImages(context.Context, *warrenv1.ListImagesRequest) (*warrenv1.ListImagesResponse, error) {
	return &warrenv1.ListImagesResponse{Images: []*warrenv1.Image{{Name: "busybox"}}}, nil
}

func (f *fakeManager) GetImage(_ context.Context, r *warrenv1.GetImageRequest) (*warrenv1.Image, error) {
	return nil, errdefs.NotFoundf("image %s not found", r.Name)
}

func (f *fakeManager) ImportImage(_ context.Context, r *warrenv1.ImportImageRequest) (*warrenv1.Image, error) {
	return &warrenv1.Image{Name: r.Name, Id: "sha256:x"}, nil
}

func (f *fakeManager) ImportImageTar(_ context.Context, name string, r io.Reader) (*warrenv1.Image, error) {
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, err, "read image")
	}
	return &warrenv1.Image{Name: name, SizeBytes: n}, nil
}

func (f *fakeManager) RemoveImage(context.Context, *warrenv1.RemoveImageRequest) (*warrenv1.RemoveImageResponse, error) {
	return &warrenv1.RemoveImageResponse{}, nil
}

func (f *fakeManager) CommitSandbox(_ context.Context, r *warrenv1.CommitSandboxRequest) (*warrenv1.Layer, error) {
	if _, err := f.Get(context.Background(), &warrenv1.GetRequest{Id: r.SandboxId}); err != nil {
		return nil, err
	}
	return &warrenv1.Layer{Name: r.Name, Digest: "sha256:c"}, nil
}

// PullImage sends three events; ref "fail" fails after the first.
func (f *fakeManager) PullImage(_ context.Context, r *warrenv1.PullImageRequest, send func(*warrenv1.PullImageEvent) error) error {
	if err := send(&warrenv1.PullImageEvent{Phase: "resolve", Message: "resolving " + r.Ref}); err != nil {
		return err
	}
	if r.Ref == "fail" {
		return errdefs.NotFoundf("manifest unknown")
	}
	if err := send(&warrenv1.PullImageEvent{Phase: "layer", Layers: 1, Status: "done", Current: 5, Total: 5}); err != nil {
		return err
	}
	return send(&warrenv1.PullImageEvent{Phase: "done", Image: &warrenv1.Image{Name: r.Name, Source: r.Ref}})
}

func (f *fakeManager) BuildLayer(_ context.Context, r *warrenv1.BuildLayerRequest) (*warrenv1.Layer, error) {
	return &warrenv1.Layer{Name: r.Name, Digest: "sha256:l"}, nil
}

func (f *fakeManager) BuildLayerTar(_ context.Context, name string, r io.Reader) (*warrenv1.Layer, error) {
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, err, "read layer")
	}
	return &warrenv1.Layer{Name: name, SizeBytes: n}, nil
}

func (f *fakeManager) ListLayers(context.Context, *warrenv1.ListLayersRequest) (*warrenv1.ListLayersResponse, error) {
	return &warrenv1.ListLayersResponse{Layers: []*warrenv1.Layer{{Name: "ws"}}}, nil
}

func (f *fakeManager) RemoveLayer(_ context.Context, r *warrenv1.RemoveLayerRequest) (*warrenv1.RemoveLayerResponse, error) {
	if r.Name == "busy" {
		return nil, errdefs.Conflictf("layer busy is used by sandbox sb")
	}
	return &warrenv1.RemoveLayerResponse{}, nil
}

func (f *fakeManager) ImageStats(_ context.Context, r *warrenv1.ImageStatsRequest) (*warrenv1.ImageStatsResponse, error) {
	return &warrenv1.ImageStatsResponse{Layers: []*warrenv1.LayerStat{{Digest: "sha256:a", Owner: strings.Join(r.Names, ","), Size: 8192, Resident: 4096}}}, nil
}

func (f *fakeManager) VerifyImage(context.Context, *warrenv1.VerifyImageRequest) (*warrenv1.VerifyImageResponse, error) {
	return &warrenv1.VerifyImageResponse{Layers: []*warrenv1.LayerVerification{{Digest: "sha256:a", Ok: true}, {Digest: "sha256:b", Error: "corrupt"}}}, nil
}

func (f *fakeManager) BatchCreate(context.Context, *warrenv1.BatchCreateRequest) (*warrenv1.BatchCreateResponse, error) {
	return nil, errdefs.New(errdefs.Unsupported, "not in the fake")
}

func (f *fakeManager) NodeStatus(context.Context, *warrenv1.NodeStatusRequest) (*warrenv1.NodeStatusResponse, error) {
	return &warrenv1.NodeStatusResponse{}, nil
}

func (f *fakeManager) Version(context.Context, *warrenv1.VersionRequest) (*warrenv1.VersionResponse, error) {
	return &warrenv1.VersionResponse{Version: "test", Backends: []string{"container"}}, nil
}

func (f *fakeManager) ReadTrajectory(_ context.Context, r *warrenv1.ReadTrajectoryRequest) (*warrenv1.ReadTrajectoryResponse, error) {
	return &warrenv1.ReadTrajectoryResponse{Entries: []*warrenv1.TrajectoryEntry{{Index: 1, Seq: 1, Method: "exec"}}}, nil
}

func (f *fakeManager) Run(_ context.Context, r *warrenv1.RunRequest) (*warrenv1.RunResult, error) {
	return nil, errdefs.Unsupportedf("fake: no fncall backend")
}

func (f *fakeManager) RunBatch(context.Context, *warrenv1.RunBatchRequest, func(*warrenv1.RunBatchItem) error) error {
	return errdefs.Unsupportedf("fake: no fncall backend")
}

func (f *fakeManager) ListSandboxEvents(_ context.Context, r *warrenv1.ListSandboxEventsRequest) (*warrenv1.ListSandboxEventsResponse, error) {
	if _, err := f.Get(context.Background(), &warrenv1.GetRequest{Id: r.SandboxId}); err != nil {
		return nil, err
	}
	return &warrenv1.ListSandboxEventsResponse{Events: []*warrenv1.SecurityEvent{{Seq: 1, Kind: "oom_kill", Count: 1}}}, nil
}

func (f *fakeManager) Pause(_ context.Context, r *warrenv1.PauseRequest) (*warrenv1.PauseResponse, error) {
	sb, err := f.Get(context.Background(), &warrenv1.GetRequest{Id: r.Id})
	if err != nil {
		return nil, err
	}
	return &warrenv1.PauseResponse{Sandbox: sb, Before: &warrenv1.Memory{Bytes: 2}, After: &warrenv1.Memory{Bytes: 1}}, nil
}

func (f *fakeManager) Resume(_ context.Context, r *warrenv1.ResumeRequest) (*warrenv1.ResumeResponse, error) {
	sb, err := f.Get(context.Background(), &warrenv1.GetRequest{Id: r.Id})
	if err != nil {
		return nil, err
	}
	return &warrenv1.ResumeResponse{Sandbox: sb}, nil
}

func (f *fakeManager) PauseByLabel(_ context.Context, r *warrenv1.PauseByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error {
	return send(&warrenv1.ByLabelEvent{Done: true})
}

func (f *fakeManager) ResumeByLabel(_ context.Context, r *warrenv1.ResumeByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error {
	return send(&warrenv1.ByLabelEvent{Done: true})
}

func (f *fakeManager) Hibernate(_ context.Context, r *warrenv1.HibernateRequest) (*warrenv1.HibernateResponse, error) {
	return nil, errdefs.Unsupportedf("fake")
}

func (f *fakeManager) Restore(_ context.Context, r *warrenv1.RestoreRequest) (*warrenv1.ResumeResponse, error) {
	return nil, errdefs.Unsupportedf("fake")
}

func (f *fakeManager) HibernateByLabel(_ context.Context, r *warrenv1.HibernateByLabelRequest, send func(*warrenv1.ByLabelEvent) error) error {
	return send(&warrenv1.ByLabelEvent{Done: true})
}

func (f *fakeManager) Fork(_ context.Context, r *warrenv1.ForkRequest) (*warrenv1.ForkResponse, error) {
	return nil, errdefs.Unsupportedf("fake")
}

// ParentOf implements Owner from the sandboxes' parent field.
func (f *fakeManager) ParentOf(id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[id]
	if !ok {
		return "", errdefs.NotFoundf("sandbox %s not found", id)
	}
	return sb.GetParent(), nil
}

package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"os"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
	"github.com/warrenrl/warren/internal/trajectory"
)

// MaxReadFile caps one ReadFile response.
const MaxReadFile = 64 << 20

// fsFor is how the daemon reaches a sandbox's files: the backend's own
// (backend.Files, for sandboxes without a host-visible root), or
// sandboxfs over the host path of its root (the container backend), or
// nil: file calls and user names are then Unsupported.
func fsFor(sb backend.Sandbox) backend.FileSystem {
	if f, ok := sb.(backend.Files); ok {
		if fs := f.Files(); fs != nil {
			return fs
		}
	}
	if root := sb.Root(); root != "" {
		if im, ok := sb.(backend.IDMapped); ok {
			if base, size, mapped := im.IDMap(); mapped {
				return sandboxfs.NewMapped(root, sandboxfs.IDMap{Base: base, Size: size})
			}
		}
		return sandboxfs.New(root)
	}
	return nil
}

// fsOf returns the file system of a running sandbox.
func (m *Manager) fsOf(ctx context.Context, id string) (backend.FileSystem, error) {
	_, v, err := m.live(ctx, opFiles, id)
	if err != nil {
		return nil, err
	}
	if v.fs == nil {
		return nil, errdefs.Unsupportedf("file operations not supported by backend %s", v.backend)
	}
	return v.fs, nil
}

func fileInfoProto(fi sandboxfs.FileInfo) *warrenv1.FileInfo {
	return &warrenv1.FileInfo{
		Name:        fi.Name,
		Path:        fi.Path,
		Size:        fi.Size,
		Mode:        fi.UnixPerm(),
		IsDir:       fi.IsDir,
		IsSymlink:   fi.IsSymlink,
		LinkTarget:  fi.LinkTarget,
		MtimeUnixMs: unixMs(fi.MTime),
		Type:        fi.Type,
	}
}

// fileStep runs a file call as a step of the sandbox's trajectory log.
// do is the call: its error, and whether it was refused before it
// touched the sandbox's files.
func (m *Manager) fileStep(ctx context.Context, method, session string, seq uint64, req interface {
	proto.Message
	GetSandboxId() string
}, do func() (notRun bool, err error)) (stepOutcome, error) {
	st := step{sandbox: req.GetSandboxId(), session: session, seq: seq, method: method, req: req}
	return m.recorded(ctx, st, func(uint64) (*warrenv1.ExecResult, bool, *trajectory.Late, error) {
		notRun, err := do()
		return nil, notRun, nil, err
	})
}

// WriteFile writes (or appends to) a file in the sandbox.
func (m *Manager) WriteFile(ctx context.Context, req *warrenv1.WriteFileRequest) (_ *warrenv1.WriteFileResponse, err error) {
	defer m.observe("WriteFile", &err)
	out, err := m.fileStep(ctx, trajectory.MethodWriteFile, req.GetSessionId(), req.GetSeq(), req, func() (bool, error) {
		fs, err := m.fsOf(ctx, req.GetSandboxId())
		if err != nil {
			return true, err
		}
		mode := os.FileMode(req.GetMode())
		if mode == 0 {
			mode = 0o644
		}
		if mode&^os.FileMode(0o7777) != 0 {
			return true, errdefs.Invalidf("invalid mode %#o: permission bits only", req.GetMode())
		}
		err = fs.WriteFile(ctx, req.GetPath(), bytes.NewReader(req.GetContent()), mode, req.GetAppend(), req.GetMakeParents())
		return false, withCategory(err, errdefs.Internal, "write "+req.GetPath())
	})
	if err != nil {
		return nil, err
	}
	return &warrenv1.WriteFileResponse{Seq: out.seq, Replayed: out.replayed}, nil
}

// ReadFile reads length bytes (0: to the end, capped at 64 MiB) from
// offset of a file in the sandbox.
func (m *Manager) ReadFile(ctx context.Context, req *warrenv1.ReadFileRequest) (_ *warrenv1.ReadFileResponse, err error) {
	defer m.observe("ReadFile", &err)
	if req.GetOffset() < 0 || req.GetLength() < 0 {
		return nil, errdefs.Invalidf("offset and length must not be negative")
	}
	fs, err := m.fsOf(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	length := req.GetLength()
	if length == 0 || length > MaxReadFile {
		length = MaxReadFile
	}
	data, size, eof, err := fs.ReadFile(ctx, req.GetPath(), req.GetOffset(), length)
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "read "+req.GetPath())
	}
	return &warrenv1.ReadFileResponse{Content: data, Size: size, Eof: eof}, nil
}

// ListFiles returns one page of a directory of the sandbox (page_size
// entries, default 1,000, at most 10,000, in directory order) and the
// token of the next page; see sandboxfs.FS.List.
func (m *Manager) ListFiles(ctx context.Context, req *warrenv1.ListFilesRequest) (_ *warrenv1.ListFilesResponse, err error) {
	defer m.observe("ListFiles", &err)
	fs, err := m.fsOf(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	list, next, err := fs.List(ctx, req.GetPath(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "list "+req.GetPath())
	}
	resp := &warrenv1.ListFilesResponse{Files: make([]*warrenv1.FileInfo, 0, len(list)), NextPageToken: next}
	for _, fi := range list {
		resp.Files = append(resp.Files, fileInfoProto(fi))
	}
	return resp, nil
}

// StatFile describes one path of the sandbox (a symlink itself, not its
// target).
func (m *Manager) StatFile(ctx context.Context, req *warrenv1.StatFileRequest) (_ *warrenv1.FileInfo, err error) {
	defer m.observe("StatFile", &err)
	fs, err := m.fsOf(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	fi, err := fs.Stat(ctx, req.GetPath())
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "stat "+req.GetPath())
	}
	return fileInfoProto(fi), nil
}

// MakeDir creates a directory (mode default 0755) in the sandbox.
func (m *Manager) MakeDir(ctx context.Context, req *warrenv1.MakeDirRequest) (_ *warrenv1.MakeDirResponse, err error) {
	defer m.observe("MakeDir", &err)
	out, err := m.fileStep(ctx, trajectory.MethodMakeDir, req.GetSessionId(), req.GetSeq(), req, func() (bool, error) {
		fs, err := m.fsOf(ctx, req.GetSandboxId())
		if err != nil {
			return true, err
		}
		mode := os.FileMode(req.GetMode())
		if mode == 0 {
			mode = 0o755
		}
		if mode&^os.FileMode(0o7777) != 0 {
			return true, errdefs.Invalidf("invalid mode %#o: permission bits only", req.GetMode())
		}
		return false, withCategory(fs.Mkdir(ctx, req.GetPath(), mode, req.GetParents()), errdefs.Internal, "mkdir "+req.GetPath())
	})
	if err != nil {
		return nil, err
	}
	return &warrenv1.MakeDirResponse{Seq: out.seq, Replayed: out.replayed}, nil
}

// RemoveFile removes a file, or a directory tree when recursive.
func (m *Manager) RemoveFile(ctx context.Context, req *warrenv1.RemoveFileRequest) (_ *warrenv1.RemoveFileResponse, err error) {
	defer m.observe("RemoveFile", &err)
	out, err := m.fileStep(ctx, trajectory.MethodRemoveFile, req.GetSessionId(), req.GetSeq(), req, func() (bool, error) {
		fs, err := m.fsOf(ctx, req.GetSandboxId())
		if err != nil {
			return true, err
		}
		return false, withCategory(fs.Remove(ctx, req.GetPath(), req.GetRecursive()), errdefs.Internal, "remove "+req.GetPath())
	})
	if err != nil {
		return nil, err
	}
	return &warrenv1.RemoveFileResponse{Seq: out.seq, Replayed: out.replayed}, nil
}

// TarOut writes the tree at path of the sandbox to w as a tar stream.
func (m *Manager) TarOut(ctx context.Context, id, path string, w io.Writer, o sandboxfs.TarOptions) (err error) {
	defer m.observe("TarOut", &err)
	fs, err := m.fsOf(ctx, id)
	if err != nil {
		return err
	}
	cw := &countingWriter{w: w}
	err = fs.TarOut(ctx, path, cw, o)
	m.metrics.Archive("out", cw.n)
	return withCategory(err, errdefs.Internal, "archive "+path)
}

// TarIn extracts the tar stream r under path of the sandbox, recorded as
// the next step of the sandbox's trajectory log.
func (m *Manager) TarIn(ctx context.Context, id, path string, r io.Reader) (err error) {
	_, _, err = m.TarInStep(ctx, id, path, "", 0, r)
	return err
}

// TarInStep is TarIn as step seq of session (server.StepRecorder). The
// upload's request hash covers its body, which is read once: while it is
// extracted (live), or to compare it with the recorded step (replay).
func (m *Manager) TarInStep(ctx context.Context, id, path, session string, seq uint64, r io.Reader) (gotSeq uint64, replayed bool, err error) {
	defer m.observe("TarIn", &err)
	h := sha256.New()
	st := step{sandbox: id, session: session, seq: seq, method: trajectory.MethodUpload,
		req: &warrenv1.TrajectoryUpload{SandboxId: id, Path: path},
		hashNow: func() (*trajectory.Late, error) {
			n, err := io.Copy(h, r)
			if err != nil {
				return nil, errdefs.Wrap(errdefs.Unavailable, err, "read the upload")
			}
			return trajectory.UploadLate(path, n, h.Sum(nil)), nil
		}}
	out, err := m.recorded(ctx, st, func(uint64) (*warrenv1.ExecResult, bool, *trajectory.Late, error) {
		fs, err := m.fsOf(ctx, id)
		if err != nil {
			return nil, true, nil, err
		}
		cr := &countingReader{r: io.TeeReader(r, h)}
		err = fs.TarIn(ctx, path, cr)
		// What the extraction left unread is part of the request too.
		_, _ = io.Copy(io.Discard, cr)
		m.metrics.Archive("in", cr.n)
		return nil, false, trajectory.UploadLate(path, cr.n, h.Sum(nil)), withCategory(err, errdefs.Internal, "extract into "+path)
	})
	return out.seq, out.replayed, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

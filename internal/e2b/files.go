package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	filesystempb "github.com/warrenrl/warren/gen/e2b/filesystem"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/server"
)

// filesystemService serves envd's filesystem.Filesystem over the
// Manager's file calls (sandboxfs: every path resolved inside the
// sandbox's root). Move, which Warren's file API lacks, runs the image's
// mv through Warren's exec.
type filesystemService struct{ s *Server }

// absPath resolves a path the way envd does: relative to the home of the
// user, which for Warren is the sandbox's working directory.
func (s *Server) absPath(ctx context.Context, id, p string) (string, error) {
	if p == "" {
		return "", errdefs.Invalidf("path is empty")
	}
	if path.IsAbs(p) {
		return path.Clean(p), nil
	}
	sb, err := s.m.Get(ctx, &warrenv1.GetRequest{Id: id})
	if err != nil {
		return "", err
	}
	wd := sb.GetWorkdir()
	if wd == "" {
		wd = "/"
	}
	return path.Join(wd, p), nil
}

// permString is the ls -l form of a mode.
func permString(mode uint32, typ string) string {
	fm := fs.FileMode(mode & 0o7777)
	switch typ {
	case "dir":
		fm |= fs.ModeDir
	case "symlink":
		fm |= fs.ModeSymlink
	}
	return fm.String()
}

func entryInfo(fi *warrenv1.FileInfo) *filesystempb.EntryInfo {
	e := &filesystempb.EntryInfo{
		Name:         fi.GetName(),
		Path:         fi.GetPath(),
		Size:         fi.GetSize(),
		Mode:         fi.GetMode(),
		Permissions:  permString(fi.GetMode(), fi.GetType()),
		ModifiedTime: timestamppb.New(time.UnixMilli(fi.GetMtimeUnixMs())),
	}
	switch fi.GetType() {
	case "file":
		e.Type = filesystempb.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type = filesystempb.FileType_FILE_TYPE_DIRECTORY
	case "symlink":
		e.Type = filesystempb.FileType_FILE_TYPE_SYMLINK
		t := fi.GetLinkTarget()
		e.SymlinkTarget = &t
	}
	return e
}

// stat describes p with its full path (Warren's FileInfo.path may be
// relative to the listed directory).
func (f filesystemService) stat(ctx context.Context, id, p string) (*filesystempb.EntryInfo, error) {
	fi, err := f.s.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: id, Path: p})
	if err != nil {
		return nil, err
	}
	e := entryInfo(fi)
	e.Path, e.Name = p, path.Base(p)
	return e, nil
}

func (f filesystemService) Stat(ctx context.Context, req *connect.Request[filesystempb.StatRequest]) (*connect.Response[filesystempb.StatResponse], error) {
	id := sandboxOf(ctx)
	p, err := f.s.absPath(ctx, id, req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	e, err := f.stat(ctx, id, p)
	if err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&filesystempb.StatResponse{Entry: e}), nil
}

// MakeDir makes the directory and its parents; an existing one is
// AlreadyExists, which the SDKs read as "not created".
func (f filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystempb.MakeDirRequest]) (*connect.Response[filesystempb.MakeDirResponse], error) {
	id := sandboxOf(ctx)
	p, err := f.s.absPath(ctx, id, req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	if _, err := f.s.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: id, Path: p}); err == nil {
		return nil, rpcErr(errdefs.AlreadyExistsf("%s exists", p))
	} else if server.CategoryOf(err) != errdefs.NotFound {
		return nil, rpcErr(err)
	}
	if _, err := f.s.m.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: id, Path: p, Mode: 0o755, Parents: true}); err != nil {
		return nil, rpcErr(err)
	}
	e, err := f.stat(ctx, id, p)
	if err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&filesystempb.MakeDirResponse{Entry: e}), nil
}

func (f filesystemService) Move(ctx context.Context, req *connect.Request[filesystempb.MoveRequest]) (*connect.Response[filesystempb.MoveResponse], error) {
	id := sandboxOf(ctx)
	src, err := f.s.absPath(ctx, id, req.Msg.GetSource())
	if err != nil {
		return nil, rpcErr(err)
	}
	dst, err := f.s.absPath(ctx, id, req.Msg.GetDestination())
	if err != nil {
		return nil, rpcErr(err)
	}
	if _, err := f.s.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: id, Path: src}); err != nil {
		return nil, rpcErr(err)
	}
	res, err := f.s.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"mv", "-f", "--", src, dst}, User: execUser(req.Header())})
	if err != nil {
		return nil, rpcErr(err)
	}
	if res.GetExitCode() != 0 {
		return nil, rpcErr(errdefs.Invalidf("move %s to %s: %s", src, dst, strings.TrimSpace(string(res.GetStderr()))))
	}
	e, err := f.stat(ctx, id, dst)
	if err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&filesystempb.MoveResponse{Entry: e}), nil
}

// listPage is how many entries one ListFiles call asks for.
const listPage = 1000

// ListDir lists to the given depth (1: the directory's own entries);
// symlinks to directories are not followed.
func (f filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystempb.ListDirRequest]) (*connect.Response[filesystempb.ListDirResponse], error) {
	id := sandboxOf(ctx)
	p, err := f.s.absPath(ctx, id, req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	fi, err := f.s.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: id, Path: p})
	if err != nil {
		return nil, rpcErr(err)
	}
	if fi.GetType() != "dir" {
		return nil, rpcErr(errdefs.Invalidf("%s is not a directory", p))
	}
	out := &filesystempb.ListDirResponse{}
	if err := f.walk(ctx, id, p, depth, &out.Entries); err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(out), nil
}

func (f filesystemService) walk(ctx context.Context, id, dir string, depth int, out *[]*filesystempb.EntryInfo) error {
	tok := ""
	for {
		res, err := f.s.m.ListFiles(ctx, &warrenv1.ListFilesRequest{SandboxId: id, Path: dir, PageSize: listPage, PageToken: tok})
		if err != nil {
			return err
		}
		for _, fi := range res.GetFiles() {
			e := entryInfo(fi)
			e.Path = path.Join(dir, fi.GetName())
			*out = append(*out, e)
			if depth > 1 && fi.GetType() == "dir" {
				if err := f.walk(ctx, id, e.Path, depth-1, out); err != nil {
					return err
				}
			}
		}
		if tok = res.GetNextPageToken(); tok == "" {
			return nil
		}
	}
}

func (f filesystemService) Remove(ctx context.Context, req *connect.Request[filesystempb.RemoveRequest]) (*connect.Response[filesystempb.RemoveResponse], error) {
	id := sandboxOf(ctx)
	p, err := f.s.absPath(ctx, id, req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	if _, err := f.s.m.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: id, Path: p, Recursive: true}); err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&filesystempb.RemoveResponse{}), nil
}

// readChunk is how much of a file one ReadFile call fetches for GET /files.
const readChunk = 4 << 20

// getFile serves GET /files?path=: the file's bytes, read in chunks.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	ctx, id := r.Context(), sandboxOf(r.Context())
	p, err := s.absPath(ctx, id, r.URL.Query().Get("path"))
	if err != nil {
		s.fail(w, err)
		return
	}
	var off int64
	for {
		res, err := s.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: p, Offset: off, Length: readChunk})
		if err != nil {
			if off == 0 {
				s.fail(w, err)
			}
			// Past the headers an error can only cut the body short.
			return
		}
		if off == 0 {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
		}
		if _, err := w.Write(res.GetContent()); err != nil {
			return
		}
		off += int64(len(res.GetContent()))
		if res.GetEof() || len(res.GetContent()) == 0 {
			return
		}
	}
}

// writeInfo is one written file in a POST /files answer.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// writeFrom writes r to p (parents made), in chunks appended one after
// the other so that no file is held whole in memory.
func (s *Server) writeFrom(ctx context.Context, id, p string, r io.Reader) error {
	buf := make([]byte, readChunk)
	first := true
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 || first {
			if _, err := s.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: p, Content: buf[:n], Append: !first, MakeParents: true}); err != nil {
				return err
			}
			first = false
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return nil
		}
		if rerr != nil {
			return errdefs.Wrap(errdefs.Invalid, rerr, "read upload")
		}
	}
}

// postFiles serves POST /files: one file as application/octet-stream at
// ?path=, or multipart/form-data parts named "file", each written at its
// filename (or at ?path= for a single part).
func (s *Server) postFiles(w http.ResponseWriter, r *http.Request) {
	ctx, id := r.Context(), sandboxOf(r.Context())
	q := r.URL.Query().Get("path")
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var written []writeInfo
	record := func(p string) { written = append(written, writeInfo{Name: path.Base(p), Type: "file", Path: p}) }
	if ct != "multipart/form-data" {
		p, err := s.absPath(ctx, id, q)
		if err != nil {
			s.fail(w, err)
			return
		}
		body := io.Reader(r.Body)
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				s.fail(w, errdefs.Wrap(errdefs.Invalid, err, "gzip body"))
				return
			}
			body = zr
		}
		if err := s.writeFrom(ctx, id, p, body); err != nil {
			s.fail(w, err)
			return
		}
		record(p)
		writeJSON(w, http.StatusOK, written)
		return
	}
	mr, err := r.MultipartReader()
	if err != nil {
		s.fail(w, errdefs.Wrap(errdefs.Invalid, err, "multipart body"))
		return
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			s.fail(w, errdefs.Wrap(errdefs.Invalid, err, "multipart body"))
			return
		}
		if part.FormName() != "file" {
			continue
		}
		// The filename is a whole path: read it raw (FileName keeps only
		// its base).
		_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		name := params["filename"]
		if q != "" {
			name = q
		}
		p, err := s.absPath(ctx, id, name)
		if err != nil {
			s.fail(w, err)
			return
		}
		if err := s.writeFrom(ctx, id, p, part); err != nil {
			s.fail(w, err)
			return
		}
		record(p)
	}
	if len(written) == 0 {
		s.fail(w, errdefs.Invalidf("no part named file in the upload"))
		return
	}
	writeJSON(w, http.StatusOK, written)
}

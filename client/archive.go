package client

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/untrusted"
)

func (c *Client) archiveURL(id, path string) string {
	return c.baseURL + "/v1/sandboxes/" + url.PathEscape(id) + "/archive?" + url.Values{"path": {path}}.Encode()
}

// Upload extracts the tar stream r into the directory path of a sandbox.
func (c *Client) Upload(ctx context.Context, sandboxID, path string, r io.Reader) error {
	resp, err := c.put(ctx, c.archiveURL(sandboxID, path), r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// put sends the tar stream r to target with a PUT request. A failure, or an
// answer that is not 2xx, is its error; otherwise the caller closes the
// answer's body.
func (c *Client) put(ctx context.Context, target string, r io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, r)
	if err != nil {
		return nil, transportError(err)
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transportError(err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, httpError(resp)
	}
	return resp, nil
}

// Download returns path of a sandbox (a file or a directory tree) as a tar
// stream. The caller must close it. A failure in the middle of the stream
// surfaces as a read error.
func (c *Client) Download(ctx context.Context, sandboxID, path string) (io.ReadCloser, error) {
	return c.download(ctx, c.archiveURL(sandboxID, path))
}

// DownloadSparse is Download with files that have holes written as PAX
// sparse entries (format 1.0, as GNU tar writes them): only their data
// crosses the wire. GNU tar, bsdtar, Go's archive/tar and Python's
// tarfile read them; busybox tar does not.
func (c *Client) DownloadSparse(ctx context.Context, sandboxID, path string) (io.ReadCloser, error) {
	return c.download(ctx, c.archiveURL(sandboxID, path)+"&sparse=1")
}

func (c *Client) download(ctx context.Context, target string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, transportError(err)
	}
	req.Header.Set("Accept", "application/x-tar")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transportError(err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, httpError(resp)
	}
	return resp.Body, nil
}

// ImportImageTar uploads a root filesystem tarball (optionally
// gzip-compressed) as image name.
func (c *Client) ImportImageTar(ctx context.Context, name string, r io.Reader) (*warrenv1.Image, error) {
	img := &warrenv1.Image{}
	if err := c.putTar(ctx, "/v1/images/"+url.PathEscape(name), r, img); err != nil {
		return nil, err
	}
	return img, nil
}

// BuildLayerTar uploads a tarball (optionally gzip-compressed) as the
// named layer name. Entries ".wh.X" are whiteouts hiding X of the layers
// below, ".wh..wh..opq" hides a whole directory below.
func (c *Client) BuildLayerTar(ctx context.Context, name string, r io.Reader) (*warrenv1.Layer, error) {
	l := &warrenv1.Layer{}
	if err := c.putTar(ctx, "/v1/layers/"+url.PathEscape(name), r, l); err != nil {
		return nil, err
	}
	return l, nil
}

// putTar uploads a tarball to path and decodes the JSON answer into out.
func (c *Client) putTar(ctx context.Context, path string, r io.Reader, out proto.Message) error {
	resp, err := c.put(ctx, c.baseURL+path, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return transportError(err)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, out); err != nil {
		return &Error{Category: CategoryInternal, Code: connect.CodeInternal, Message: "decode response: " + err.Error(), err: err}
	}
	return nil
}

// DownloadOptions bound and shape what DownloadTo writes on the host. The
// zero value (or a nil pointer) is the safe default.
type DownloadOptions struct {
	// MaxBytes bounds the total apparent size of the regular files
	// written: 0 means 1 GiB, a negative value no limit.
	MaxBytes int64
	// MaxEntries bounds the number of archive entries: 0 means 1,000,000,
	// a negative value no limit.
	MaxEntries int64
	// Preserve keeps the permission bits the sandbox set (setuid, setgid,
	// sticky and group/other write included) instead of masking them with
	// 0o755.
	Preserve bool
	// SymlinksAsIs keeps symlinks whose target could lead outside
	// localPath (absolute, or climbing above it); by default such a link
	// fails the download (Invalid), so that opening files of the copy
	// stays inside it. No link is followed by the copy either way.
	SymlinksAsIs bool
	// XattrAllow lists extended-attribute name prefixes (e.g. "user.") to
	// restore; every other xattr and every ACL is dropped.
	XattrAllow []string
}

// DownloadStats counts what DownloadTo wrote and what it refused to carry
// over from the sandbox.
type DownloadStats struct {
	Entries, Files, Dirs, Symlinks, Hardlinks int64
	Bytes                                     int64 // apparent size of the files written
	Skipped                                   int64 // device nodes and FIFOs, never created
	ModesMasked                               int64 // entries whose permission bits the 0o755 mask changed
	SpecialBits                               int64 // of those, entries that had setuid, setgid or sticky
	XattrsDropped                             int64 // extended attributes and ACLs not restored
}

// DownloadTo copies remotePath of a sandbox (a file or a directory tree)
// to localPath on this host, like cp -r: a directory goes to localPath,
// or into it under its own name when localPath is an existing directory;
// a file goes to localPath, or into it when localPath is a directory (or
// ends in a slash).
//
// Everything in a sandbox is written by its agent, so the tree is treated
// as hostile: no symlink is ever followed, neither one the tree brings nor
// one already on the host (a symlink in localPath itself is refused: pass
// a resolved path, e.g. from realpath); symlinks are recreated as links,
// and one whose target could lead outside localPath is refused (see
// DownloadOptions.SymlinksAsIs);
// hard links only to files of the same copy; no owners, ACLs or xattrs
// (see DownloadOptions.XattrAllow); permission bits masked with 0o755;
// devices and FIFOs skipped; holes kept as holes; and the MaxBytes and
// MaxEntries budgets apply. On any error, what the copy created is
// removed. Errors carry categories: Invalid for a refused entry or
// destination, Exhausted for a budget, Conflict for a directory that
// would be replaced.
func (c *Client) DownloadTo(ctx context.Context, sandboxID, remotePath, localPath string, opts *DownloadOptions) (*DownloadStats, error) {
	if opts == nil {
		opts = &DownloadOptions{}
	}
	uo := untrusted.Options{MaxBytes: opts.MaxBytes, MaxEntries: opts.MaxEntries, Preserve: opts.Preserve,
		SymlinksAsIs: opts.SymlinksAsIs, XattrAllow: opts.XattrAllow}
	localIsDir, err := untrusted.IsDir(localPath)
	if err != nil {
		return nil, localError(err)
	}
	// Sparse: holes stay holes on the wire too, not only on this disk.
	rc, err := c.DownloadSparse(ctx, sandboxID, remotePath)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 1<<20)
	tree, err := isTree(br)
	if err != nil {
		return nil, localError(err)
	}
	var st untrusted.Stats
	switch {
	case tree:
		target := localPath
		if localIsDir {
			target = filepath.Join(localPath, path.Base(path.Clean("/"+remotePath)))
		}
		st, err = untrusted.Extract(ctx, target, br, uo)
	case localIsDir || strings.HasSuffix(localPath, "/"):
		st, err = untrusted.Extract(ctx, localPath, br, uo)
	default:
		st, err = untrusted.ExtractFile(ctx, localPath, br, uo)
	}
	ds := DownloadStats(st)
	if err != nil {
		return &ds, localError(err)
	}
	return &ds, nil
}

// isTree peeks at the first header of the archive: a directory tree starts
// with its "./" entry, a single file with the file.
func isTree(br *bufio.Reader) (bool, error) {
	head, perr := br.Peek(br.Size())
	first, err := tar.NewReader(bytes.NewReader(head)).Next()
	if err != nil {
		if perr != nil && perr != io.EOF && perr != bufio.ErrBufferFull {
			return false, fmt.Errorf("reading archive: %w", perr)
		}
		return false, errdefs.New(errdefs.Invalid, "reading archive: %w", err)
	}
	name := strings.Trim(first.Name, "/")
	return first.Typeflag == tar.TypeDir && (name == "." || name == ""), nil
}

// localError gives an error met on this host the category the extractor
// decided; a failure without one is the stream from the daemon breaking.
func localError(err error) error {
	cat := errdefs.CategoryOf(err)
	if cat == errdefs.Unknown {
		return transportError(err)
	}
	codes := map[errdefs.Category]connect.Code{
		errdefs.NotFound: connect.CodeNotFound, errdefs.Invalid: connect.CodeInvalidArgument,
		errdefs.Exhausted: connect.CodeResourceExhausted, errdefs.Conflict: connect.CodeFailedPrecondition,
		errdefs.Unavailable: connect.CodeUnavailable, errdefs.DeadlineExceeded: connect.CodeDeadlineExceeded,
		errdefs.PermissionDenied: connect.CodePermissionDenied, errdefs.Internal: connect.CodeInternal,
	}
	return &Error{Category: Category(cat.String()), Code: codes[cat], Message: err.Error(), err: err}
}

// UploadStep is Upload as step seq of session of the sandbox's trajectory
// log (seq 0: the session's next step). It returns the step the upload
// was recorded as (0: not recorded) and whether it was replayed: the
// step was recorded with the same tar, so nothing was extracted again.
func (c *Client) UploadStep(ctx context.Context, sandboxID, path, session string, seq uint64, r io.Reader) (uint64, bool, error) {
	q := url.Values{"path": {path}}
	if session != "" {
		q.Set("session", session)
	}
	if seq != 0 {
		q.Set("seq", strconv.FormatUint(seq, 10))
	}
	resp, err := c.put(ctx, c.baseURL+"/v1/sandboxes/"+url.PathEscape(sandboxID)+"/archive?"+q.Encode(), r)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	got, _ := strconv.ParseUint(resp.Header.Get("Warren-Trajectory-Seq"), 10, 64)
	return got, resp.Header.Get("Warren-Trajectory-Replayed") == "true", nil
}

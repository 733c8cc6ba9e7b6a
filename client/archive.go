package client

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.archiveURL(sandboxID, path), nil)
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

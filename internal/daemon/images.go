package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/oci"
)

func imageProto(img image.Image) *warrenv1.Image {
	out := &warrenv1.Image{
		Name:            img.Name,
		Id:              img.ID,
		Layers:          slices.Clone(img.Layers),
		SizeBytes:       img.SizeBytes,
		CreatedAtUnixMs: unixMs(img.CreatedAt),
		DiffIds:         slices.Clone(img.DiffIDs),
		Source:          img.Source,
	}
	if c := img.Config; c != nil {
		out.Env = slices.Clone(c.Env)
		out.Entrypoint = slices.Clone(c.Entrypoint)
		out.Cmd = slices.Clone(c.Cmd)
		out.WorkingDir = c.WorkingDir
		out.User = c.User
		out.Platform = c.Platform
	}
	return out
}

func layerProto(nl image.NamedLayer) *warrenv1.Layer {
	return &warrenv1.Layer{
		Name:            nl.Name,
		Digest:          nl.Digest,
		DiffId:          nl.DiffID,
		SizeBytes:       nl.SizeBytes,
		BlobSizeBytes:   nl.BlobSize,
		Files:           nl.Files,
		CreatedAtUnixMs: unixMs(nl.CreatedAt),
		SetuidKept:      nl.SetuidKept,
		SetuidStripped:  nl.SetuidStripped,
	}
}

// ListImages lists the node's images by name.
func (m *Manager) ListImages(ctx context.Context, req *warrenv1.ListImagesRequest) (_ *warrenv1.ListImagesResponse, err error) {
	defer m.observe("ListImages", &err)
	imgs, err := m.images.List()
	if err != nil {
		return nil, err
	}
	resp := &warrenv1.ListImagesResponse{Images: make([]*warrenv1.Image, 0, len(imgs))}
	for _, img := range imgs {
		resp.Images = append(resp.Images, imageProto(img))
	}
	return resp, nil
}

// GetImage returns one image.
func (m *Manager) GetImage(ctx context.Context, req *warrenv1.GetImageRequest) (_ *warrenv1.Image, err error) {
	defer m.observe("GetImage", &err)
	img, err := m.images.Get(req.GetName())
	if err != nil {
		return nil, err
	}
	return imageProto(img), nil
}

// ImportImage imports the root filesystem directory or tarball at path
// (on the daemon's host) as image name.
func (m *Manager) ImportImage(ctx context.Context, req *warrenv1.ImportImageRequest) (_ *warrenv1.Image, err error) {
	m.fnForget()
	defer m.fnForget()
	defer m.observe("ImportImage", &err)
	name, path := req.GetName(), req.GetPath()
	if err := image.ValidName(name); err != nil {
		return nil, err
	}
	img, err := fromHostPath("import image "+name, path,
		func(dir string) (image.Image, error) { return m.images.ImportDir(ctx, name, dir) },
		func(r io.Reader) (image.Image, error) { return m.images.ImportTar(ctx, name, r) })
	if err != nil {
		return nil, err
	}
	m.log.Info("image imported", "image", name, "id", img.ID, "from", path)
	return imageProto(img), nil
}

// fromHostPath reads the directory tree or tarball at path (on the
// daemon's host) with byDir or byTar, for op ("import image NAME"): a
// missing path is NotFound, one that is neither a directory nor a regular
// file Invalid, and a failure of byDir or byTar without a category
// Internal.
func fromHostPath[T any](op, path string, byDir func(dir string) (T, error), byTar func(r io.Reader) (T, error)) (T, error) {
	var zero T
	if err := validateAbsPath("path", path); err != nil {
		return zero, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return zero, errdefs.NotFoundf("%s: %s does not exist", op, path)
		}
		return zero, errdefs.New(errdefs.Invalid, "%s: %w", op, err)
	}
	var v T
	switch {
	case fi.IsDir():
		v, err = byDir(path)
	case fi.Mode().IsRegular():
		f, oerr := os.Open(path)
		if oerr != nil {
			return zero, errdefs.New(errdefs.Invalid, "%s: %w", op, oerr)
		}
		defer f.Close()
		v, err = byTar(f)
	default:
		return zero, errdefs.Invalidf("%s: %s is neither a directory nor a regular file", op, path)
	}
	if err != nil {
		return zero, withCategory(err, errdefs.Internal, op)
	}
	return v, nil
}

// ImportImageTar imports a tarball (optionally gzip-compressed) read from r
// as image name.
func (m *Manager) ImportImageTar(ctx context.Context, name string, r io.Reader) (_ *warrenv1.Image, err error) {
	m.fnForget()
	defer m.fnForget()
	defer m.observe("ImportImageTar", &err)
	if err := image.ValidName(name); err != nil {
		return nil, err
	}
	img, err := m.images.ImportTar(ctx, name, r)
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "import image "+name)
	}
	m.log.Info("image imported", "image", name, "id", img.ID, "from", "upload")
	return imageProto(img), nil
}

// RemoveImage removes an image; it refuses (Conflict) while a sandbox that
// is not dead uses it.
func (m *Manager) RemoveImage(ctx context.Context, req *warrenv1.RemoveImageRequest) (_ *warrenv1.RemoveImageResponse, err error) {
	m.fnForget()
	defer m.fnForget()
	defer func() {
		if err == nil {
			m.fnRemoved(req.GetName())
		}
	}()
	defer m.observe("RemoveImage", &err)
	name := req.GetName()
	if err := image.ValidName(name); err != nil {
		return nil, err
	}
	m.imgMu.Lock()
	defer m.imgMu.Unlock()
	if users := m.imageUsers(name); len(users) > 0 {
		more := ""
		if len(users) > 1 {
			more = " and others"
		}
		return nil, errdefs.Conflictf("image %s is used by sandbox %s%s", name, users[0], more)
	}
	// The layers of sandboxes deleted since adoption are no longer kept.
	m.images.SetKeep(m.inUseDigests()...)
	if err := m.images.Remove(name); err != nil {
		return nil, err
	}
	m.log.Info("image removed", "image", name)
	return &warrenv1.RemoveImageResponse{}, nil
}

// imageUsers lists the ids of live sandboxes created from image name.
func (m *Manager) imageUsers(name string) []string {
	var ids []string
	m.eachLive(func(s *sandbox) {
		if s.info.GetImage() == name {
			ids = append(ids, s.id)
		}
	})
	slices.Sort(ids)
	return ids
}

// inUseDigests returns the layer digests of the sandboxes that are not
// dead: the keep set for image.Store.GC (call m.images.GC(m.inUseDigests()...)
// after adoption; an empty result must still be passed as a non-nil slice).
func (m *Manager) inUseDigests() []string {
	seen := map[string]bool{}
	out := []string{}
	m.eachLive(func(s *sandbox) {
		for _, d := range s.imageLayers {
			if !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
	})
	slices.Sort(out)
	return out
}

// digestUsers lists the ids of live sandboxes whose layer stack holds
// digest (for removing a named layer: RemoveLayer refuses while used).
func (m *Manager) digestUsers(digest string) []string {
	var ids []string
	m.eachLive(func(s *sandbox) {
		if slices.Contains(s.imageLayers, digest) {
			ids = append(ids, s.id)
		}
	})
	slices.Sort(ids)
	return ids
}

// eachLive calls f, with s.mu held, for every sandbox that is neither gone
// nor dead.
func (m *Manager) eachLive(f func(s *sandbox)) {
	for _, s := range m.snapshot() {
		s.mu.Lock()
		if s.st != stateGone && s.st != stateStopped {
			f(s)
		}
		s.mu.Unlock()
	}
}

// ImportOCI imports an OCI image (registry reference, oci:DIR[:TAG] or
// docker-archive:FILE) into the node's store, reporting progress; the
// server streams the events of a PullImage call from it.
func (m *Manager) ImportOCI(ctx context.Context, ref, name, platform string, progress func(oci.Event)) (_ *warrenv1.Image, err error) {
	defer m.observe("ImportOCI", &err)
	return m.importOCI(ctx, ref, name, platform, progress)
}

func (m *Manager) importOCI(ctx context.Context, ref, name, platform string, progress func(oci.Event)) (*warrenv1.Image, error) {
	m.fnForget()
	defer m.fnForget()
	if !m.images.IsEROFS() {
		return nil, errdefs.Unsupportedf("OCI imports need the EROFS image store (image.OpenStore)")
	}
	if ref == "" {
		return nil, errdefs.Invalidf("image reference is required")
	}
	img, err := oci.Import(ctx, m.images, ref, oci.Options{Name: name, Platform: platform, Progress: progress})
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "import image "+ref)
	}
	m.log.Info("image imported", "image", img.Name, "id", img.ID, "from", img.Source)
	return imageProto(img), nil
}

// pullThrottle is the least time between two progress events of one layer
// in the same status.
const pullThrottle = 100 * time.Millisecond

// PullImage imports an OCI image and sends its progress, one event per
// oci.Event (progress of a layer in the same status at most every
// 100 ms); the last event has phase "done" and carries the image.
func (m *Manager) PullImage(ctx context.Context, req *warrenv1.PullImageRequest, send func(*warrenv1.PullImageEvent) error) (err error) {
	defer m.observe("PullImage", &err)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sendErr error
	type seen struct {
		status string
		at     time.Time
	}
	last := map[int]seen{}
	// oci.Import calls progress one event at a time.
	progress := func(e oci.Event) {
		if sendErr != nil {
			return
		}
		if e.Phase == "layer" {
			l := last[e.Layer]
			if l.status == e.Status && time.Since(l.at) < pullThrottle {
				return
			}
			last[e.Layer] = seen{e.Status, time.Now()}
		}
		if sendErr = send(pullEventProto(e)); sendErr != nil {
			cancel() // the client is gone: stop importing
		}
	}
	img, err := m.importOCI(ctx, req.GetRef(), req.GetName(), req.GetPlatform(), progress)
	if sendErr != nil {
		return withCategory(sendErr, errdefs.Unavailable, "send progress")
	}
	if err != nil {
		return err
	}
	return withCategory(send(&warrenv1.PullImageEvent{Phase: "done", Layers: int32(len(img.GetLayers())), Message: "imported " + img.GetName(), Image: img}), errdefs.Unavailable, "send result")
}

func pullEventProto(e oci.Event) *warrenv1.PullImageEvent {
	return &warrenv1.PullImageEvent{
		Phase:   e.Phase,
		Layer:   int32(e.Layer),
		Layers:  int32(e.Layers),
		Digest:  e.Digest,
		Status:  e.Status,
		Current: e.Current,
		Total:   e.Total,
		Message: e.Message,
	}
}

// BuildLayer makes the directory tree or tarball at path (on the daemon's
// host) the named layer name.
func (m *Manager) BuildLayer(ctx context.Context, req *warrenv1.BuildLayerRequest) (_ *warrenv1.Layer, err error) {
	defer m.observe("BuildLayer", &err)
	name, p := req.GetName(), req.GetPath()
	if err := validLayerName(name); err != nil {
		return nil, err
	}
	nl, err := fromHostPath("build layer "+name, p,
		func(dir string) (image.NamedLayer, error) { return m.images.BuildLayerDir(ctx, name, dir) },
		func(r io.Reader) (image.NamedLayer, error) { return m.images.BuildLayerTar(ctx, name, r) })
	if err != nil {
		return nil, err
	}
	m.log.Info("layer built", "layer", name, "digest", nl.Digest, "from", p)
	return layerProto(nl), nil
}

// BuildLayerTar makes the tarball (plain or gzip) read from r the named
// layer name.
func (m *Manager) BuildLayerTar(ctx context.Context, name string, r io.Reader) (_ *warrenv1.Layer, err error) {
	defer m.observe("BuildLayerTar", &err)
	if err := validLayerName(name); err != nil {
		return nil, err
	}
	nl, err := m.images.BuildLayerTar(ctx, name, r)
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "build layer "+name)
	}
	m.log.Info("layer built", "layer", name, "digest", nl.Digest, "from", "upload")
	return layerProto(nl), nil
}

func validLayerName(name string) error {
	if image.ValidName(name) != nil {
		return errdefs.Invalidf("invalid layer name %q: want [a-z0-9][a-z0-9._:/-]{0,127}", name)
	}
	if strings.HasPrefix(name, "sha256:") {
		return errdefs.Invalidf("invalid layer name %q: sha256: names digests", name)
	}
	return nil
}

// ListLayers lists the named layers by name.
func (m *Manager) ListLayers(ctx context.Context, req *warrenv1.ListLayersRequest) (_ *warrenv1.ListLayersResponse, err error) {
	defer m.observe("ListLayers", &err)
	ls, err := m.images.ListLayers()
	if err != nil {
		return nil, err
	}
	resp := &warrenv1.ListLayersResponse{Layers: make([]*warrenv1.Layer, 0, len(ls))}
	for _, nl := range ls {
		resp.Layers = append(resp.Layers, layerProto(nl))
	}
	return resp, nil
}

// RemoveLayer removes a named layer; it refuses (Conflict) while a sandbox
// that is not dead has its blob in its layer stack.
func (m *Manager) RemoveLayer(ctx context.Context, req *warrenv1.RemoveLayerRequest) (_ *warrenv1.RemoveLayerResponse, err error) {
	m.fnForget()
	defer m.fnForget()
	defer m.observe("RemoveLayer", &err)
	name := req.GetName()
	if err := validLayerName(name); err != nil {
		return nil, err
	}
	m.imgMu.Lock()
	defer m.imgMu.Unlock()
	nl, err := m.images.GetLayer(name)
	if err != nil {
		return nil, err
	}
	if users := m.digestUsers(nl.Digest); len(users) > 0 {
		more := ""
		if len(users) > 1 {
			more = fmt.Sprintf(" and %d others", len(users)-1)
		}
		return nil, errdefs.Conflictf("layer %s is used by sandbox %s%s", name, users[0], more)
	}
	m.images.SetKeep(m.inUseDigests()...)
	if err := m.images.RemoveLayer(name); err != nil {
		return nil, err
	}
	m.log.Info("layer removed", "layer", name, "digest", nl.Digest)
	return &warrenv1.RemoveLayerResponse{}, nil
}

// ownedLayers are the layer digests of an image or named layer.
type ownedLayers struct {
	owner   string // image name, "layer:NAME", or "" for any stored blob
	digests []string
}

// layersOf resolves names (images, "layer:NAME" for named layers) to
// their layers; no names means every image and named layer.
func (m *Manager) layersOf(names []string) ([]ownedLayers, error) {
	var out []ownedLayers
	if len(names) == 0 {
		imgs, err := m.images.List()
		if err != nil {
			return nil, err
		}
		for _, im := range imgs {
			out = append(out, ownedLayers{im.Name, im.Layers})
		}
		ls, err := m.images.ListLayers()
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			out = append(out, ownedLayers{layerPrefix + l.Name, []string{l.Digest}})
		}
		return out, nil
	}
	for _, n := range names {
		if ln, ok := strings.CutPrefix(n, layerPrefix); ok {
			l, err := m.images.GetLayer(ln)
			if err != nil {
				return nil, err
			}
			out = append(out, ownedLayers{n, []string{l.Digest}})
			continue
		}
		im, err := m.images.Get(n)
		if err != nil {
			return nil, err
		}
		out = append(out, ownedLayers{n, im.Layers})
	}
	return out, nil
}

// layerPrefix marks a named layer among image names (ImageStats,
// VerifyImage).
const layerPrefix = "layer:"

// ImageStats reports the on-demand loading state of the layers of the
// given images and named layers (all when none are given).
func (m *Manager) ImageStats(ctx context.Context, req *warrenv1.ImageStatsRequest) (_ *warrenv1.ImageStatsResponse, err error) {
	defer m.observe("ImageStats", &err)
	owned, err := m.layersOf(req.GetNames())
	if err != nil {
		return nil, err
	}
	resp := &warrenv1.ImageStatsResponse{}
	for _, o := range owned {
		if err := ctx.Err(); err != nil {
			return nil, ctxError(ctx, "image stats")
		}
		st, err := m.images.Stats(ctx, o.digests)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.owner, withCategory(err, errdefs.Internal, "layer stats"))
		}
		for _, x := range st {
			resp.Layers = append(resp.Layers, &warrenv1.LayerStat{
				Digest: x.Digest, DiffId: x.DiffID, Format: x.Format, Size: x.Size, Resident: x.Resident,
				Files: x.Files, Mounted: x.Mounted, Refs: int32(x.Refs), Owner: o.owner,
				BlobResident: x.BlobResident, FilesResident: x.FilesResident, DirectIo: x.DirectIO, ReadAheadKb: int32(x.ReadAheadKB),
			})
		}
	}
	return resp, nil
}

// VerifyImage hashes the blobs of the given images and named layers
// (every stored blob when none are given) and reports each result.
func (m *Manager) VerifyImage(ctx context.Context, req *warrenv1.VerifyImageRequest) (_ *warrenv1.VerifyImageResponse, err error) {
	defer m.observe("VerifyImage", &err)
	var owned []ownedLayers
	if len(req.GetNames()) == 0 {
		all, err := m.images.Blobs()
		if err != nil {
			return nil, err
		}
		owned = []ownedLayers{{"", all}}
	} else if owned, err = m.layersOf(req.GetNames()); err != nil {
		return nil, err
	}
	resp := &warrenv1.VerifyImageResponse{}
	for _, o := range owned {
		for _, d := range o.digests {
			v := &warrenv1.LayerVerification{Digest: d, Owner: o.owner, Ok: true}
			if err := m.images.Verify(ctx, d); err != nil {
				if ctx.Err() != nil {
					return nil, ctxError(ctx, "verify "+d)
				}
				v.Ok, v.Error = false, err.Error()
				m.log.Warn("layer verification failed", "digest", d, "owner", o.owner, "err", err)
			}
			resp.Layers = append(resp.Layers, v)
		}
	}
	return resp, nil
}

// mountsLayers reports whether backend b wants its layers mounted
// (backend.LayerMounts; yes unless it says otherwise).
func mountsLayers(b backend.Backend) bool {
	lm, ok := b.(backend.LayerMounts)
	return !ok || lm.MountLayers()
}

// specLayers turns the image store's layer references into the backend's.
func specLayers(refs []image.LayerRef) []backend.Layer {
	out := make([]backend.Layer, len(refs))
	for i, r := range refs {
		out[i] = backend.Layer{Digest: r.Digest, Blob: r.Blob, Dir: r.Dir}
	}
	return out
}

package daemon

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/oci"
)

func imageProto(img image.Image) *warrenv1.Image {
	return &warrenv1.Image{
		Name:            img.Name,
		Id:              img.ID,
		Layers:          slices.Clone(img.Layers),
		SizeBytes:       img.SizeBytes,
		CreatedAtUnixMs: unixMs(img.CreatedAt),
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
	defer m.observe("ImportImage", &err)
	name, path := req.GetName(), req.GetPath()
	if err := image.ValidName(name); err != nil {
		return nil, err
	}
	if err := validateAbsPath("path", path); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.NotFoundf("import image %s: %s does not exist", name, path)
		}
		return nil, errdefs.New(errdefs.Invalid, "import image %s: %w", name, err)
	}
	var img image.Image
	switch {
	case fi.IsDir():
		img, err = m.images.ImportDir(ctx, name, path)
	case fi.Mode().IsRegular():
		f, oerr := os.Open(path)
		if oerr != nil {
			return nil, errdefs.New(errdefs.Invalid, "import image %s: %w", name, oerr)
		}
		defer f.Close()
		img, err = m.images.ImportTar(ctx, name, f)
	default:
		return nil, errdefs.Invalidf("import image %s: %s is neither a directory nor a regular file", name, path)
	}
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "import image "+name)
	}
	m.log.Info("image imported", "image", name, "id", img.ID, "from", path)
	return imageProto(img), nil
}

// ImportImageTar imports a tarball (optionally gzip-compressed) read from r
// as image name.
func (m *Manager) ImportImageTar(ctx context.Context, name string, r io.Reader) (_ *warrenv1.Image, err error) {
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
	if err := m.images.Remove(name); err != nil {
		return nil, err
	}
	m.log.Info("image removed", "image", name)
	return &warrenv1.RemoveImageResponse{}, nil
}

// imageUsers lists the ids of live sandboxes created from image name.
func (m *Manager) imageUsers(name string) []string {
	m.mu.RLock()
	all := make([]*sandbox, 0, len(m.sandboxes))
	for _, s := range m.sandboxes {
		all = append(all, s)
	}
	m.mu.RUnlock()
	var ids []string
	for _, s := range all {
		s.mu.Lock()
		if !s.gone && s.info.GetImage() == name && s.info.GetState() != stateDead {
			ids = append(ids, s.id)
		}
		s.mu.Unlock()
	}
	slices.Sort(ids)
	return ids
}

// inUseDigests returns the layer digests of the sandboxes that are not
// dead: the keep set for image.Store.GC (call m.images.GC(m.inUseDigests()...)
// after adoption; an empty result must still be passed as a non-nil slice).
func (m *Manager) inUseDigests() []string {
	m.mu.RLock()
	all := make([]*sandbox, 0, len(m.sandboxes))
	for _, s := range m.sandboxes {
		all = append(all, s)
	}
	m.mu.RUnlock()
	seen := map[string]bool{}
	out := []string{}
	for _, s := range all {
		s.mu.Lock()
		if !s.gone && s.info.GetState() != stateDead {
			for _, d := range s.imageLayers {
				if !seen[d] {
					seen[d] = true
					out = append(out, d)
				}
			}
		}
		s.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// digestUsers lists the ids of live sandboxes whose layer stack holds
// digest (for removing a named layer: RemoveLayer refuses while used).
func (m *Manager) digestUsers(digest string) []string {
	m.mu.RLock()
	all := make([]*sandbox, 0, len(m.sandboxes))
	for _, s := range m.sandboxes {
		all = append(all, s)
	}
	m.mu.RUnlock()
	var ids []string
	for _, s := range all {
		s.mu.Lock()
		if !s.gone && s.info.GetState() != stateDead && slices.Contains(s.imageLayers, digest) {
			ids = append(ids, s.id)
		}
		s.mu.Unlock()
	}
	slices.Sort(ids)
	return ids
}

// resolveLayers returns the layer digests (bottom first) of a sandbox of
// imageName with the named layers on top, later ones higher. Create uses
// it in place of images.Get: img := image.Image{Name: name, Layers: digests}.
func (m *Manager) resolveLayers(imageName string, layers []string) ([]string, error) {
	return m.images.Resolve(imageName, layers)
}

// ImportOCI imports an OCI image (registry reference, oci:DIR[:TAG] or
// docker-archive:FILE) into the node's store, reporting progress; the
// server streams the events of a PullImage call from it.
func (m *Manager) ImportOCI(ctx context.Context, ref, name, platform string, progress func(oci.Event)) (_ *warrenv1.Image, err error) {
	defer m.observe("ImportOCI", &err)
	if !m.images.IsEROFS() {
		return nil, errdefs.Unavailablef("OCI imports need the EROFS image store (image.OpenStore)")
	}
	img, err := oci.Import(ctx, m.images, ref, oci.Options{Name: name, Platform: platform, Progress: progress})
	if err != nil {
		return nil, withCategory(err, errdefs.Internal, "import image "+ref)
	}
	m.log.Info("image imported", "image", img.Name, "id", img.ID, "from", img.Source)
	return imageProto(img), nil
}

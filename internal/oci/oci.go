// Package oci imports OCI and Docker images into the image store: from a
// registry, an OCI image layout directory or a `docker save` tarball.
//
// Each layer is streamed — download, decompression (gzip or zstd), tar
// parsing — into an EROFS conversion (image.Store.ImportLayer), checked
// against both its compressed digest and its diffID, and published as a
// content-addressed blob. Layers already stored (same diffID) are not
// downloaded again. The image record is written last, so a failed import
// leaves no record; its orphaned blobs are collected by the store's GC.
//
// References (ParseRef):
//
//	registry/repo:tag, registry/repo@sha256:..., docker://...   a registry
//	oci:DIR, oci:DIR:TAG                                         an OCI layout
//	docker-archive:FILE.tar, docker-archive:FILE.tar:REPO:TAG    docker save
//
// Registry credentials come from the Docker config (authn.DefaultKeychain:
// ~/.docker/config.json, $DOCKER_CONFIG, credential helpers).
package oci

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
)

// Source kinds.
const (
	KindRegistry      = "registry"
	KindLayout        = "oci"
	KindDockerArchive = "docker-archive"
)

// Ref is a parsed image reference.
type Ref struct {
	Kind string // KindRegistry, KindLayout or KindDockerArchive
	// Registry: the reference ("index.docker.io/library/python:3.12").
	// Layout: the directory. Archive: the file.
	Location string
	Tag      string // layout and archive: the tag to pick ("" if one image)
}

func (r Ref) String() string {
	switch r.Kind {
	case KindRegistry:
		return r.Location
	case KindLayout, KindDockerArchive:
		if r.Tag != "" {
			return r.Kind + ":" + r.Location + ":" + r.Tag
		}
		return r.Kind + ":" + r.Location
	}
	return r.Location
}

// IsRef reports whether s looks like an image reference rather than a
// local path: it has a transport prefix, or it is not an existing path
// and parses as a registry reference.
func IsRef(s string) bool {
	if strings.HasPrefix(s, "docker://") || strings.HasPrefix(s, "oci:") || strings.HasPrefix(s, "docker-archive:") {
		return true
	}
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") || s == "-" {
		return false
	}
	if _, err := os.Lstat(s); err == nil {
		return false
	}
	_, err := name.ParseReference(s)
	return err == nil
}

// ParseRef parses an image reference (see the package doc).
func ParseRef(s string) (Ref, error) {
	switch {
	case strings.HasPrefix(s, "oci:"):
		dir, tag := splitPathTag(strings.TrimPrefix(s, "oci:"), true)
		if dir == "" {
			return Ref{}, errdefs.Invalidf("invalid reference %q: want oci:DIR[:TAG]", s)
		}
		return Ref{Kind: KindLayout, Location: dir, Tag: tag}, nil
	case strings.HasPrefix(s, "docker-archive:"):
		file, tag := splitPathTag(strings.TrimPrefix(s, "docker-archive:"), false)
		if file == "" {
			return Ref{}, errdefs.Invalidf("invalid reference %q: want docker-archive:FILE[:REPO:TAG]", s)
		}
		return Ref{Kind: KindDockerArchive, Location: file, Tag: tag}, nil
	}
	r := strings.TrimPrefix(s, "docker://")
	ref, err := name.ParseReference(r)
	if err != nil {
		return Ref{}, errdefs.New(errdefs.Invalid, "invalid image reference %q: %w", s, err)
	}
	return Ref{Kind: KindRegistry, Location: ref.Name()}, nil
}

// splitPathTag splits "PATH[:TAG]": an existing PATH wins; otherwise the
// part after the first ':' following the last '/' is the tag (for an
// archive "FILE:REPO:TAG", REPO:TAG may hold a '/').
func splitPathTag(s string, isDir bool) (string, string) {
	if _, err := os.Stat(s); err == nil {
		return s, ""
	}
	start := strings.LastIndex(s, "/") + 1
	if !isDir {
		// docker-archive:/x/y.tar:repo/name:tag — split after ".tar".
		if i := strings.Index(s, ".tar:"); i >= 0 {
			return s[:i+4], s[i+5:]
		}
	}
	if i := strings.IndexByte(s[start:], ':'); i >= 0 {
		return s[:start+i], s[start+i+1:]
	}
	return s, ""
}

var badNameChars = regexp.MustCompile(`[^a-z0-9._:/-]+`)

// DefaultName derives an image name from a reference: "python:3.12" for
// docker.io/library/python:3.12, "ghcr.io/org/app:v1", the directory or
// file name (plus the tag) for layouts and archives.
func DefaultName(r Ref) string {
	var n string
	switch r.Kind {
	case KindRegistry:
		ref, err := name.ParseReference(r.Location)
		if err != nil {
			return ""
		}
		repo := ref.Context().Name()
		repo = strings.TrimPrefix(repo, name.DefaultRegistry+"/")
		repo = strings.TrimPrefix(repo, "library/")
		switch t := ref.(type) {
		case name.Tag:
			n = repo + ":" + t.TagStr()
		case name.Digest:
			d := strings.TrimPrefix(t.DigestStr(), "sha256:")
			if len(d) > 12 {
				d = d[:12]
			}
			n = repo + ":" + d
		}
	default:
		base := filepath.Base(strings.TrimSuffix(r.Location, "/"))
		base = strings.TrimSuffix(base, ".tar")
		n = base
		if r.Tag != "" {
			tag := r.Tag
			if i := strings.LastIndex(tag, "/"); i >= 0 {
				tag = tag[i+1:]
			}
			if strings.Contains(tag, ":") {
				n = tag
			} else {
				n = base + ":" + tag
			}
		}
	}
	n = badNameChars.ReplaceAllString(strings.ToLower(n), "-")
	n = strings.TrimLeft(n, "._:/-")
	if len(n) > 128 {
		n = n[:128]
	}
	return n
}

// Event reports import progress.
type Event struct {
	// Phase: "resolve" (finding the image), "layer" (one layer's status
	// changed or it progressed), "record" (writing the image record).
	Phase  string `json:"phase"`
	Layer  int    `json:"layer"`  // index, bottom first
	Layers int    `json:"layers"` // how many
	Digest string `json:"digest,omitempty"`
	// Status of the layer: "waiting", "downloading" (Current/Total are
	// compressed bytes; the tar is parsed as it arrives), "converting"
	// (Current: EROFS bytes written, Total: an estimate), "exists" (the
	// store had it), "done".
	Status  string `json:"status,omitempty"`
	Current int64  `json:"current"`
	Total   int64  `json:"total"` // 0 when unknown
	Message string `json:"message,omitempty"`
}

// Options control Import.
type Options struct {
	// Name of the image record; "" means DefaultName.
	Name string
	// Platform to pick from a multi-platform image; "" is linux/GOARCH.
	Platform string
	// Keychain for registry credentials; nil is authn.DefaultKeychain.
	Keychain authn.Keychain
	// Transport for registry requests; nil is the default.
	Transport http.RoundTripper
	// Jobs is how many layers are fetched and converted at once (0: 3).
	Jobs int
	// Progress receives events, one at a time (never concurrently).
	Progress func(Event)
}

// Import imports the image ref into store as an image record.
func Import(ctx context.Context, store *image.Store, refStr string, opts Options) (image.Image, error) {
	ref, err := ParseRef(refStr)
	if err != nil {
		return image.Image{}, err
	}
	nm := opts.Name
	if nm == "" {
		nm = DefaultName(ref)
	}
	if err := image.ValidName(nm); err != nil {
		return image.Image{}, err
	}
	plat, err := platformOf(opts.Platform)
	if err != nil {
		return image.Image{}, err
	}
	var mu sync.Mutex
	emit := func(e Event) {
		if opts.Progress != nil {
			mu.Lock()
			defer mu.Unlock()
			opts.Progress(e)
		}
	}
	emit(Event{Phase: "resolve", Message: "resolving " + ref.String()})
	img, source, err := open(ctx, ref, plat, opts)
	if err != nil {
		return image.Image{}, fmt.Errorf("import %s: %w", ref, err)
	}
	rec, err := importImage(ctx, store, img, nm, source, ref.Kind, emit, opts.Jobs)
	if err != nil {
		return image.Image{}, fmt.Errorf("import %s: %w", ref, err)
	}
	return rec, nil
}

func platformOf(s string) (v1.Platform, error) {
	if s == "" {
		p := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
		if runtime.GOARCH == "arm64" {
			p.Variant = "v8"
		}
		return p, nil
	}
	p, err := v1.ParsePlatform(s)
	if err != nil {
		return v1.Platform{}, errdefs.New(errdefs.Invalid, "invalid platform %q: %w", s, err)
	}
	return *p, nil
}

// open finds the image of ref; source describes it for the record.
func open(ctx context.Context, ref Ref, plat v1.Platform, opts Options) (v1.Image, string, error) {
	switch ref.Kind {
	case KindRegistry:
		r, err := name.ParseReference(ref.Location)
		if err != nil {
			return nil, "", errdefs.New(errdefs.Invalid, "invalid reference: %w", err)
		}
		kc := opts.Keychain
		if kc == nil {
			kc = authn.DefaultKeychain
		}
		ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithPlatform(plat)}
		if opts.Transport != nil {
			ropts = append(ropts, remote.WithTransport(opts.Transport))
		}
		desc, err := remote.Get(r, ropts...)
		if err != nil {
			return nil, "", registryErr(err)
		}
		if err := checkManifestType(desc.MediaType); err != nil {
			return nil, "", err
		}
		img, err := desc.Image()
		if err != nil {
			return nil, "", registryErr(err)
		}
		dg, err := img.Digest()
		if err != nil {
			return nil, "", registryErr(err)
		}
		return img, r.Context().Name() + "@" + dg.String(), nil
	case KindLayout:
		return openLayout(ref, plat)
	case KindDockerArchive:
		var tag *name.Tag
		if ref.Tag != "" {
			t, err := name.NewTag(ref.Tag)
			if err != nil {
				return nil, "", errdefs.New(errdefs.Invalid, "invalid tag %q: %w", ref.Tag, err)
			}
			tag = &t
		}
		if _, err := os.Stat(ref.Location); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, "", errdefs.NotFoundf("no such file: %s", ref.Location)
			}
			return nil, "", errdefs.Wrap(errdefs.Invalid, err, "docker archive")
		}
		img, err := tarball.ImageFromPath(ref.Location, tag)
		if err != nil {
			return nil, "", errdefs.New(errdefs.Invalid, "not a usable docker-archive (docker save) tarball: %w", err)
		}
		return img, ref.String(), nil
	}
	return nil, "", errdefs.Invalidf("unknown reference kind %q", ref.Kind)
}

func checkManifestType(mt types.MediaType) error {
	switch mt {
	case types.OCIImageIndex, types.DockerManifestList, types.OCIManifestSchema1, types.DockerManifestSchema2, "":
		return nil
	case types.DockerManifestSchema1, types.DockerManifestSchema1Signed:
		return errdefs.Invalidf("unsupported manifest type %s (Docker schema 1 is obsolete)", mt)
	}
	return errdefs.Invalidf("not a container image: manifest media type %s", mt)
}

const refNameAnnotation = "org.opencontainers.image.ref.name"

func openLayout(ref Ref, plat v1.Platform) (v1.Image, string, error) {
	if fi, err := os.Stat(ref.Location); err != nil || !fi.IsDir() {
		if err != nil && errors.Is(err, os.ErrNotExist) {
			return nil, "", errdefs.NotFoundf("no such OCI layout directory: %s", ref.Location)
		}
		return nil, "", errdefs.Invalidf("%s is not an OCI layout directory", ref.Location)
	}
	idx, err := layout.ImageIndexFromPath(ref.Location)
	if err != nil {
		return nil, "", errdefs.New(errdefs.Invalid, "not an OCI image layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, "", errdefs.New(errdefs.Invalid, "reading the layout's index: %w", err)
	}
	var pick []v1.Descriptor
	var tags []string
	for _, d := range im.Manifests {
		rn := d.Annotations[refNameAnnotation]
		if rn != "" {
			tags = append(tags, rn)
		}
		if ref.Tag == "" || rn == ref.Tag || strings.HasSuffix(rn, ":"+ref.Tag) {
			pick = append(pick, d)
		}
	}
	switch {
	case len(pick) == 0 && ref.Tag != "":
		return nil, "", errdefs.NotFoundf("tag %q not in layout %s (it has: %s)", ref.Tag, ref.Location, strings.Join(tags, ", "))
	case len(pick) == 0:
		return nil, "", errdefs.NotFoundf("layout %s holds no image", ref.Location)
	case len(pick) > 1 && ref.Tag == "":
		return nil, "", errdefs.Invalidf("layout %s holds %d images: name one with oci:DIR:TAG (tags: %s)", ref.Location, len(pick), strings.Join(tags, ", "))
	}
	d := pick[0]
	src := ref.String() + "@" + d.Digest.String()
	for depth := 0; ; depth++ {
		if err := checkManifestType(d.MediaType); err != nil {
			return nil, "", err
		}
		if !d.MediaType.IsIndex() {
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, "", errdefs.New(errdefs.Invalid, "reading image %s: %w", d.Digest, err)
			}
			return img, src, nil
		}
		if depth > 4 {
			return nil, "", errdefs.Invalidf("layout %s: indexes nested too deep", ref.Location)
		}
		sub, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, "", errdefs.New(errdefs.Invalid, "reading index %s: %w", d.Digest, err)
		}
		sm, err := sub.IndexManifest()
		if err != nil {
			return nil, "", errdefs.New(errdefs.Invalid, "reading index %s: %w", d.Digest, err)
		}
		found := false
		for _, m := range sm.Manifests {
			if m.Platform == nil || m.Platform.Satisfies(plat) {
				d, found = m, true
				break
			}
		}
		if !found {
			return nil, "", errdefs.NotFoundf("no image for platform %s in %s", plat.String(), ref)
		}
		idx = sub
	}
}

// registryErr maps registry failures to categories.
func registryErr(err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return errdefs.New(errdefs.NotFound, "image not found in the registry: %w", err)
		case http.StatusUnauthorized, http.StatusForbidden:
			return errdefs.New(errdefs.Unauthenticated, "registry refused access (credentials from the Docker config): %w", err)
		case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
			return errdefs.New(errdefs.Unavailable, "registry unavailable: %w", err)
		}
		return errdefs.New(errdefs.Invalid, "registry: %w", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errdefs.Wrap(errdefs.DeadlineExceeded, err, "registry")
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &ne) || errors.As(err, &oe) {
		return errdefs.New(errdefs.Unavailable, "cannot reach the registry: %w", err)
	}
	if errdefs.CategoryOf(err) != errdefs.Unknown {
		return err
	}
	return errdefs.New(errdefs.Invalid, "%w", err)
}

type layerJob struct {
	i      int
	layer  v1.Layer
	diffID string
	digest string // compressed ("" when unknown: docker-archive)
	mt     types.MediaType
	size   int64
}

func importImage(ctx context.Context, store *image.Store, img v1.Image, nm, source, kind string, emit func(Event), jobs int) (image.Image, error) {
	cfgMT := types.MediaType("")
	if m, err := img.Manifest(); err == nil {
		cfgMT = m.Config.MediaType
	} else if kind != KindDockerArchive {
		return image.Image{}, registryErr(err)
	}
	switch cfgMT {
	case types.OCIConfigJSON, types.DockerConfigJSON, "":
	default:
		return image.Image{}, errdefs.Invalidf("not a container image: its config has media type %s (an artifact?)", cfgMT)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return image.Image{}, errdefs.New(errdefs.Invalid, "reading image config: %w", registryErr(err))
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return image.Image{}, errdefs.Invalidf("not a Linux image (os %s)", cfg.OS)
	}
	layers, err := img.Layers()
	if err != nil {
		return image.Image{}, registryErr(err)
	}
	if len(layers) == 0 {
		return image.Image{}, errdefs.Invalidf("image has no layers")
	}
	if len(layers) > 127 {
		return image.Image{}, errdefs.Invalidf("image has %d layers (at most 127)", len(layers))
	}
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return image.Image{}, errdefs.Invalidf("image config lists %d diffIDs for %d layers", len(cfg.RootFS.DiffIDs), len(layers))
	}
	jobsList := make([]layerJob, len(layers))
	for i, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			return image.Image{}, registryErr(err)
		}
		if err := checkLayerType(mt); err != nil {
			return image.Image{}, fmt.Errorf("layer %d: %w", i, err)
		}
		j := layerJob{i: i, layer: l, diffID: cfg.RootFS.DiffIDs[i].String(), mt: mt}
		if kind != KindDockerArchive {
			d, err := l.Digest()
			if err != nil {
				return image.Image{}, registryErr(err)
			}
			j.digest = d.String()
			if sz, err := l.Size(); err == nil {
				j.size = sz
			}
		}
		jobsList[i] = j
		emit(Event{Phase: "layer", Layer: i, Layers: len(layers), Digest: j.digest, Status: "waiting", Total: j.size})
	}

	if jobs <= 0 {
		jobs = 3
	}
	digests := make([]string, len(layers))
	var metas []string
	var mmu sync.Mutex
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, jobs)
	errs := make([]error, len(layers))
	var wg sync.WaitGroup
	for _, j := range jobsList {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[j.i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			m, err := importLayer(ctx, store, j, len(layers), kind, emit)
			if err != nil {
				errs[j.i] = fmt.Errorf("layer %d (%s): %w", j.i, j.diffID, err)
				cancel()
				return
			}
			digests[j.i] = m.Digest
			mmu.Lock()
			metas = append(metas, m.Digest)
			mmu.Unlock()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			store.Unpin(metas...)
			return image.Image{}, err
		}
	}
	for _, err := range errs {
		if err != nil {
			store.Unpin(metas...)
			return image.Image{}, err
		}
	}
	emit(Event{Phase: "record", Layers: len(layers), Message: "writing image record " + nm})
	diffIDs := make([]string, len(layers))
	for i, d := range cfg.RootFS.DiffIDs {
		diffIDs[i] = d.String()
	}
	rec := image.Image{
		Name:    nm,
		Layers:  digests,
		DiffIDs: diffIDs,
		Source:  source,
		Config: &image.Config{
			Env:        cfg.Config.Env,
			Entrypoint: cfg.Config.Entrypoint,
			Cmd:        cfg.Config.Cmd,
			WorkingDir: cfg.Config.WorkingDir,
			User:       cfg.Config.User,
			Platform:   strings.Trim(cfg.OS+"/"+cfg.Architecture+"/"+cfg.Variant, "/"),
		},
	}
	if err := store.PutImage(rec); err != nil {
		return image.Image{}, err
	}
	return store.Get(nm)
}

func checkLayerType(mt types.MediaType) error {
	switch mt {
	case types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer, types.DockerLayer, types.DockerUncompressedLayer:
		return nil
	case types.DockerForeignLayer, types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
		return errdefs.Invalidf("foreign (non-distributable) layers are not supported (media type %s)", mt)
	}
	return errdefs.Invalidf("unsupported layer media type %s", mt)
}

func importLayer(ctx context.Context, store *image.Store, j layerJob, n int, kind string, emit func(Event)) (image.LayerMeta, error) {
	ev := Event{Phase: "layer", Layer: j.i, Layers: n, Digest: j.digest, Total: j.size}
	if m, ok := store.ReuseLayer(j.diffID); ok {
		ev.Status, ev.Current = "exists", ev.Total
		emit(ev)
		return m, nil
	}
	var (
		rc      io.ReadCloser
		err     error
		counter *countingReader
	)
	if kind == KindDockerArchive {
		rc, err = j.layer.Uncompressed()
	} else {
		rc, err = j.layer.Compressed()
	}
	if err != nil {
		return image.LayerMeta{}, registryErr(err)
	}
	defer rc.Close()
	ev.Status = "downloading"
	emit(ev)
	var h hash.Hash
	var src io.Reader = rc
	if j.digest != "" {
		h = sha256.New()
		src = io.TeeReader(rc, h)
	}
	counter = &countingReader{r: src, fn: func(c int64) {
		e := ev
		e.Current = c
		emit(e)
	}}
	br := bufio.NewReaderSize(counter, 256<<10)
	body, closeBody, err := decompressor(br, j.mt, kind)
	if err != nil {
		return image.LayerMeta{}, err
	}
	defer closeBody()
	var tarBytes int64
	tb := &countingReader{r: body, fn: func(c int64) { tarBytes = c }, every: 1}
	m, err := store.ImportLayer(ctx, &verifyingReader{r: tb, onEOF: func() error {
		// The tar is read: drain the compressed stream and check it.
		if _, err := io.Copy(io.Discard, br); err != nil {
			return registryErr(err)
		}
		if h != nil {
			if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != j.digest {
				return errdefs.Invalidf("layer digest mismatch: the content has %s, expected %s", got, j.digest)
			}
		}
		ce := ev
		ce.Status, ce.Current, ce.Total = "converting", 0, tarBytes
		emit(ce)
		return nil
	}}, image.LayerOptions{DiffID: j.diffID, Progress: func(w int64) {
		if w%(4<<20) < 64<<10 { // every ~4 MiB
			ce := ev
			ce.Status, ce.Current, ce.Total = "converting", w, tarBytes
			emit(ce)
		}
	}})
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.Unknown && !errors.Is(err, context.Canceled) {
			err = registryErr(err)
		}
		return image.LayerMeta{}, err
	}
	ev.Status, ev.Current = "done", ev.Total
	if ev.Total == 0 {
		ev.Current = counter.n
		ev.Total = counter.n
	}
	ev.Message = m.Digest
	emit(ev)
	return m, nil
}

// decompressor returns the tar stream of a layer blob.
func decompressor(br *bufio.Reader, mt types.MediaType, kind string) (io.Reader, func(), error) {
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, errdefs.New(errdefs.Invalid, "layer: bad gzip header: %w", err)
		}
		return gz, func() { gz.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
		if err != nil {
			return nil, nil, errdefs.New(errdefs.Invalid, "layer: bad zstd stream: %w", err)
		}
		return zr, zr.Close, nil
	}
	if mt == types.OCILayer || mt == types.DockerLayer || mt == types.OCILayerZStd {
		if kind != KindDockerArchive {
			return nil, nil, errdefs.Invalidf("layer says %s but is not compressed that way", mt)
		}
	}
	return br, func() {}, nil
}

type countingReader struct {
	r     io.Reader
	n     int64
	last  int64
	every int64
	fn    func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	every := c.every
	if every == 0 {
		every = 1 << 20
	}
	if c.fn != nil && (c.n-c.last >= every || (err == io.EOF && c.n != c.last)) {
		c.last = c.n
		c.fn(c.n)
	}
	return n, err
}

// verifyingReader runs onEOF when r ends, and fails the read if it fails.
type verifyingReader struct {
	r     io.Reader
	onEOF func() error
	done  bool
	err   error
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	if v.done {
		if v.err != nil {
			return 0, v.err
		}
		return 0, io.EOF
	}
	n, err := v.r.Read(p)
	if err == io.EOF {
		v.done = true
		if v.err = v.onEOF(); v.err != nil {
			return n, v.err
		}
	}
	return n, err
}

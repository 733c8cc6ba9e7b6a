package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warrenrl/warren/internal/atomicfile"
	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/layermount"
	"github.com/warrenrl/warren/internal/tarx"
)

// Defaults of Options.
const (
	DefaultGCGrace  = 10 * time.Minute
	DefaultLeaseTTL = 7 * 24 * time.Hour
	leaseRefresh    = time.Hour
)

// Options configure an EROFS store (OpenStore).
type Options struct {
	// Root is the store directory. It may be on a filesystem shared by
	// several nodes: blobs are published atomically and never modified.
	Root string
	// MountDir is this node's layer mount cache, <run-dir>/layers.
	// Required.
	MountDir string
	// WorkDir is node-local scratch space for conversions (spool files);
	// "" means <Root>/tmp.
	WorkDir string
	// MountGrace is how long an unused layer stays mounted; 0 means
	// layermount.DefaultGrace (60 s), negative unmounts at once.
	MountGrace time.Duration
	// VerifyOnMount hashes a blob before this process first mounts it
	// (reads the whole blob: it defeats on-demand loading).
	VerifyOnMount bool
	// GCGrace protects blobs younger than this from garbage collection,
	// for imports in progress on other nodes; 0 means DefaultGCGrace,
	// negative means none.
	GCGrace time.Duration
	// NodeID names this node's lease file (the digests it uses), which
	// other nodes' garbage collection honours; "" means the hostname.
	NodeID string
	// LeaseTTL: leases older than this (of dead nodes) are ignored; 0
	// means DefaultLeaseTTL.
	LeaseTTL time.Duration
	// MaxFiles limits the entries of one layer (0: erofs.DefaultMaxFiles).
	MaxFiles int64
	// Mkfs, if set, converts layers with this mkfs.erofs >= 1.8, which
	// keeps hardlinks (see erofs.SelectMkfs); nil means go-erofs. The
	// builder is recorded in each blob's metadata.
	Mkfs *erofs.Mkfs
	// ForceLoop mounts through loop devices (tests of the fallback).
	ForceLoop bool
	// BufferedIO mounts layers without direct I/O, LayerReadAheadKB sets
	// their readahead window and Log receives mount fallbacks: see
	// layermount.Options.
	BufferedIO       bool
	LayerReadAheadKB int
	Log              *slog.Logger
	// NoMounts opens the store for imports and records only (a CLI
	// working on the daemon's store): LayerDirs fails, GC is a no-op.
	NoMounts bool
}

// OpenStore opens (creating if needed) an EROFS store: layers are EROFS
// images under <root>/blobs/sha256/<hex>.erofs, mounted on demand through
// the node's mount cache. Layer directories of an older store
// (layers/sha256-<hex>/fs) keep working and are collected once unused.
func OpenStore(opts Options) (*Store, error) {
	if opts.Root == "" {
		return nil, errdefs.Invalidf("image store: no root directory")
	}
	if opts.MountDir == "" && !opts.NoMounts {
		return nil, errdefs.Invalidf("image store: no mount directory")
	}
	if opts.GCGrace == 0 {
		opts.GCGrace = DefaultGCGrace
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.NodeID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "node"
		}
		opts.NodeID = h
	}
	opts.NodeID = strings.Map(func(r rune) rune {
		if r == '/' || r == 0 || r == '%' {
			return '_'
		}
		return r
	}, opts.NodeID)
	s := &Store{root: opts.Root, erofs: true, opts: opts, holds: map[string]int{}, orphans: map[string]bool{}, verified: map[string]bool{}, pending: map[string]time.Time{}}
	for _, d := range []string{s.root, s.layersDir(), s.imagesDir(), s.tmpDir(), s.blobsDir(), s.diffIDsDir(), s.namedDir(), s.leasesDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "image store")
		}
	}
	if opts.WorkDir == "" {
		s.opts.WorkDir = s.tmpDir()
	} else if err := os.MkdirAll(opts.WorkDir, 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "image store work dir")
	}
	s.cleanTemps()
	if !opts.NoMounts {
		mc, err := layermount.New(opts.MountDir, layermount.Options{Grace: opts.MountGrace, ForceLoop: opts.ForceLoop,
			BufferedIO: opts.BufferedIO, ReadAheadKB: opts.LayerReadAheadKB, Log: opts.Log})
		if err != nil {
			return nil, err
		}
		s.mounts = mc
		s.leaseStop = make(chan struct{})
		s.leaseDone = make(chan struct{})
		go s.leaseLoop()
	}
	return s, nil
}

func (s *Store) blobsDir() string   { return filepath.Join(s.root, "blobs", "sha256") }
func (s *Store) diffIDsDir() string { return filepath.Join(s.root, "diffids", "sha256") }
func (s *Store) namedDir() string   { return filepath.Join(s.root, "named-layers") }
func (s *Store) leasesDir() string  { return filepath.Join(s.root, "leases") }

// BlobPath returns the path of the EROFS blob with that digest.
func (s *Store) BlobPath(digest string) (string, error) {
	h, err := digestHex(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.blobsDir(), h+".erofs"), nil
}

func (s *Store) blobMetaPath(h string) string { return filepath.Join(s.blobsDir(), h+".json") }

// Mounts returns the node's mount cache (nil for a legacy store).
func (s *Store) Mounts() *layermount.Cache { return s.mounts }

// IsEROFS reports whether layers are stored as EROFS blobs.
func (s *Store) IsEROFS() bool { return s.erofs }

// Close stops the store's background work and unmounts the layers no
// sandbox uses; layers still in use stay mounted for the next process.
func (s *Store) Close() error {
	if s.leaseStop != nil {
		s.closeOnce.Do(func() {
			close(s.leaseStop)
			<-s.leaseDone
		})
	}
	if s.mounts != nil {
		return s.mounts.Close()
	}
	return nil
}

// cleanTemps removes this node's leftover temporary files (and anyone's
// older than a day: a node that crashed mid-import).
func (s *Store) cleanTemps() {
	for _, dir := range []string{s.blobsDir(), s.diffIDsDir(), s.imagesDir(), s.namedDir(), s.leasesDir()} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			n := e.Name()
			if !strings.HasPrefix(n, ".tmp-") {
				continue
			}
			old := false
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > 24*time.Hour {
				old = true
			}
			if old || strings.HasPrefix(n, ".tmp-"+s.opts.NodeID+"-") {
				_ = os.Remove(filepath.Join(dir, n))
			}
		}
	}
	if s.opts.WorkDir != "" {
		ents, _ := os.ReadDir(s.opts.WorkDir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".erofs-spool-") {
				_ = os.Remove(filepath.Join(s.opts.WorkDir, e.Name()))
			}
		}
	}
}

func randHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// LayerOptions tune one layer conversion.
type LayerOptions struct {
	// DiffID, if set, is checked against the layer's content; a layer
	// already converted with that diffID is not converted again (the
	// reader is then not read at all).
	DiffID string
	// Progress, if set, is called with the bytes done so far while the
	// blob is built (see erofs.Options.Progress).
	Progress func(written int64)
}

// LayerByDiffID returns the stored blob of a layer with that diffID.
func (s *Store) LayerByDiffID(diffID string) (LayerMeta, bool) {
	if !s.erofs {
		return LayerMeta{}, false
	}
	h, err := digestHex(diffID)
	if err != nil {
		return LayerMeta{}, false
	}
	var idx struct {
		Digest string `json:"digest"`
	}
	data, err := os.ReadFile(filepath.Join(s.diffIDsDir(), h+".json"))
	if err != nil || json.Unmarshal(data, &idx) != nil {
		return LayerMeta{}, false
	}
	m, err := s.LayerMeta(idx.Digest)
	if err != nil || m.DiffID != diffID {
		return LayerMeta{}, false
	}
	bp, _ := s.BlobPath(m.Digest)
	if fi, err := os.Stat(bp); err != nil || fi.Size() != m.BlobSize {
		return LayerMeta{}, false
	}
	return m, true
}

// ReuseLayer is LayerByDiffID for an import that will refer to the blob:
// it also protects the blob from garbage collection until a record
// refers to it (PutImage) or Unpin.
func (s *Store) ReuseLayer(diffID string) (LayerMeta, bool) {
	m, ok := s.LayerByDiffID(diffID)
	if ok {
		s.mu.Lock()
		s.pending[m.Digest] = time.Now()
		s.mu.Unlock()
		// GC may have run between the lookup and the pin.
		if _, err := os.Stat(s.blobMetaPath(m.Digest[len("sha256:"):])); err != nil {
			s.unpin([]string{m.Digest})
			return LayerMeta{}, false
		}
	}
	return m, ok
}

// ImportLayer converts the uncompressed layer tar stream r into an EROFS
// blob and publishes it (or finds it already stored). It does not create
// any record: the blob is collected unless an image or layer record
// refers to it within the GC grace period.
func (s *Store) ImportLayer(ctx context.Context, r io.Reader, lo LayerOptions) (LayerMeta, error) {
	if !s.erofs {
		return LayerMeta{}, errdefs.Unsupportedf("this image store keeps layer directories (legacy); open it with image.OpenStore for EROFS layers")
	}
	if lo.DiffID != "" {
		if _, err := digestHex(lo.DiffID); err != nil {
			return LayerMeta{}, err
		}
		if m, ok := s.ReuseLayer(lo.DiffID); ok {
			return m, nil
		}
	}
	tmp, err := os.CreateTemp(s.blobsDir(), ".tmp-"+s.opts.NodeID+"-")
	if err != nil {
		return LayerMeta{}, errdefs.Wrap(errnoCategory(err), err, "import layer")
	}
	tmpName := tmp.Name()
	defer func() {
		tmp.Close()
		_ = os.Remove(tmpName)
	}()
	st, err := erofs.Convert(ctx, r, tmp, erofs.Options{
		MaxFiles:     s.opts.MaxFiles,
		TempDir:      s.opts.WorkDir,
		ExpectDiffID: lo.DiffID,
		Mkfs:         s.opts.Mkfs,
		Progress:     lo.Progress,
	})
	if err != nil {
		return LayerMeta{}, err
	}
	if err := tmp.Sync(); err != nil {
		return LayerMeta{}, errdefs.Wrap(errnoCategory(err), err, "import layer: sync")
	}
	size, err := tmp.Seek(0, io.SeekEnd)
	if err != nil {
		return LayerMeta{}, errdefs.Wrap(errdefs.Internal, err, "import layer")
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return LayerMeta{}, errdefs.Wrap(errdefs.Internal, err, "import layer")
	}
	h := sha256.New()
	if _, err := io.Copy(h, tmp); err != nil {
		return LayerMeta{}, errdefs.Wrap(errdefs.Internal, err, "import layer: hashing blob")
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	// Protect the digest from this process's GC before it is published
	// (or found published): GC holds s.mu while it deletes.
	s.mu.Lock()
	s.pending[digest] = time.Now()
	s.mu.Unlock()
	pinned := true
	defer func() {
		if pinned {
			s.unpin([]string{digest})
		}
	}()
	if err := tmp.Chmod(0o444); err != nil {
		return LayerMeta{}, errdefs.Wrap(errdefs.Internal, err, "import layer")
	}
	if err := tmp.Close(); err != nil {
		return LayerMeta{}, errdefs.Wrap(errnoCategory(err), err, "import layer")
	}
	meta := LayerMeta{
		Digest:     digest,
		Size:       st.Bytes,
		Files:      st.Inodes(),
		Builder:    st.Builder,
		Created:    time.Now().UTC(),
		Format:     FormatEROFS,
		DiffID:     st.DiffID,
		BlobSize:   size,
		RootOpaque: st.RootOpaque,
		MaxID:      &st.MaxID,
	}
	hx := digest[len("sha256:"):]
	blob := filepath.Join(s.blobsDir(), hx+".erofs")
	if fi, err := os.Stat(blob); err == nil && fi.Size() == size {
		// Identical content is already published: never touch it.
		if old, err := readMetaFile(s.blobMetaPath(hx)); err == nil {
			meta = old
		}
	} else {
		// link(2), not rename(2): a blob another process published
		// meanwhile is never replaced (and link is atomic on NFS too).
		if err := os.Link(tmpName, blob); err != nil && !errors.Is(err, os.ErrExist) {
			return LayerMeta{}, errdefs.Wrap(errnoCategory(err), err, "import layer: publishing blob")
		}
		if err := atomicfile.SyncDir(s.blobsDir()); err != nil {
			return LayerMeta{}, errdefs.Wrap(errnoCategory(err), err, "import layer: publishing blob")
		}
	}
	if _, err := os.Stat(s.blobMetaPath(hx)); err != nil {
		if err := s.writeJSONTemp(s.blobMetaPath(hx), meta); err != nil {
			return LayerMeta{}, fmt.Errorf("import layer: %w", err)
		}
	}
	idx := struct {
		Digest string `json:"digest"`
	}{digest}
	if err := s.writeJSONTemp(filepath.Join(s.diffIDsDir(), st.DiffID[len("sha256:"):]+".json"), idx); err != nil {
		return LayerMeta{}, fmt.Errorf("import layer: %w", err)
	}
	pinned = false // until a record refers to it (PutImage) or Unpin
	return meta, nil
}

// writeJSONTemp is writeJSON with this node's temp-file prefix.
func (s *Store) writeJSONTemp(path string, v any) error {
	return writeJSONVia(path, ".tmp-"+s.opts.NodeID+"-", v)
}

func readMetaFile(path string) (LayerMeta, error) {
	var m LayerMeta
	data, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	err = json.Unmarshal(data, &m)
	return m, err
}

// importTarStream converts a root filesystem or layer tarball (plain or
// gzip-compressed) into a blob.
func (s *Store) importTarStream(ctx context.Context, r io.Reader) (LayerMeta, error) {
	body, err := decompress(r)
	if err != nil {
		return LayerMeta{}, err
	}
	defer body.Close()
	return s.ImportLayer(ctx, body, LayerOptions{})
}

// decompress detects gzip by its magic number; zstd, xz and bzip2 are
// refused.
func decompress(r io.Reader) (io.ReadCloser, error) {
	var magic [6]byte
	n, err := io.ReadFull(r, magic[:])
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, fmt.Errorf("reading archive: %w", err)
	}
	if n == 0 {
		return nil, errdefs.Invalidf("empty archive")
	}
	full := io.MultiReader(bytes.NewReader(magic[:n]), r)
	gzipped, err := tarx.IsGzip(magic[:n])
	if err != nil {
		return nil, err
	}
	if gzipped {
		gz, err := gzip.NewReader(full)
		if err != nil {
			return nil, errdefs.New(errdefs.Invalid, "reading gzip header: %w", err)
		}
		return gz, nil
	}
	return io.NopCloser(full), nil
}

// importDirStream converts the tree at dir into a blob, through its
// canonical tar stream.
func (s *Store) importDirStream(ctx context.Context, dir string) (LayerMeta, error) {
	if err := checkSourceDir(dir, "import source", errdefs.Invalid); err != nil {
		return LayerMeta{}, err
	}
	pr, done := treeStream(ctx, dir)
	m, err := s.ImportLayer(ctx, pr, LayerOptions{})
	pr.CloseWithError(errors.New("conversion stopped"))
	if cerr := <-done; cerr != nil && err == nil {
		return m, fmt.Errorf("reading %s: %w", dir, cerr)
	} else if cerr != nil && !errors.Is(cerr, io.ErrClosedPipe) && errdefs.CategoryOf(err) == errdefs.Invalid {
		return m, fmt.Errorf("reading %s: %w", dir, cerr)
	}
	return m, err
}

// importEROFS imports one blob as the one-layer image name.
func (s *Store) importEROFS(ctx context.Context, name string, conv func() (LayerMeta, error)) (Image, error) {
	m, err := conv()
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", name, err)
	}
	img := Image{
		Name:      name,
		ID:        imageID([]string{m.Digest}),
		Layers:    []string{m.Digest},
		DiffIDs:   []string{m.DiffID},
		SizeBytes: m.Size,
		CreatedAt: time.Now().UTC(),
	}
	if err := s.PutImage(img); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", name, err)
	}
	return img, nil
}

// PutImage writes the record of img (replacing one of the same name).
// Its layers must be stored; ID and SizeBytes are filled in when empty.
// Layers the record replaced are collected unless still used.
func (s *Store) PutImage(img Image) error {
	if err := ValidName(img.Name); err != nil {
		return err
	}
	if len(img.Layers) == 0 {
		return errdefs.Invalidf("image %s has no layers", img.Name)
	}
	var size int64
	defer s.unpin(img.Layers)
	for _, d := range img.Layers {
		m, err := s.LayerMeta(d)
		if err != nil {
			return err
		}
		size += m.Size
	}
	if img.ID == "" {
		img.ID = imageID(img.Layers)
	}
	if img.SizeBytes == 0 {
		img.SizeBytes = size
	}
	if img.CreatedAt.IsZero() {
		img.CreatedAt = time.Now().UTC()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeRecordLocked(img); err != nil {
		return err
	}
	if !s.opts.NoMounts {
		_ = s.gcLocked(nil)
	}
	return nil
}

func (s *Store) writeRecordTemp(path string, v any) error {
	if s.erofs {
		return s.writeJSONTemp(path, v)
	}
	return writeJSON(path, v)
}

// pendingTTL bounds how long a blob imported by this process is kept
// without a record (an OCI import publishes its layers before its record).
const pendingTTL = time.Hour

// unpin ends the GC protection of freshly imported blobs once a record
// refers to them (or the import failed).
func (s *Store) unpin(digests []string) {
	s.mu.Lock()
	for _, d := range digests {
		delete(s.pending, d)
	}
	s.mu.Unlock()
}

// Unpin ends the GC protection of blobs imported by ImportLayer that no
// record will use (a failed multi-layer import).
func (s *Store) Unpin(digests ...string) { s.unpin(digests) }

// --- EROFS layers ---

type erofsLayer struct {
	s      *Store
	digest string
	blob   string
}

func (l *erofsLayer) Digest() string { return l.digest }

func (l *erofsLayer) Mount(ctx context.Context) (string, func(), error) {
	s := l.s
	if s.mounts == nil {
		return "", nil, errdefs.Unavailablef("this image store was opened without mounts")
	}
	undo, err := l.hold(ctx)
	if err != nil {
		return "", nil, err
	}
	h := l.digest[len("sha256:"):]
	dir, rel, err := s.mounts.Acquire(ctx, h, l.blob)
	if err != nil {
		undo()
		return "", nil, fmt.Errorf("layer %s: %w", l.digest, err)
	}
	var once sync.Once
	return dir, func() {
		once.Do(func() {
			rel()
			undo()
		})
	}, nil
}

// hold keeps the layer's blob from garbage collection (and verifies it
// once, with VerifyOnMount) until the returned func is called, without
// mounting it: what a backend that reads blobs itself needs.
func (l *erofsLayer) hold(ctx context.Context) (func(), error) {
	s := l.s
	s.mu.Lock()
	if _, err := os.Stat(l.blob); err != nil {
		s.mu.Unlock()
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.NotFoundf("layer %s not found", l.digest)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "layer "+l.digest)
	}
	s.holds[l.digest]++
	newHold := s.holds[l.digest] == 1 && !s.leased[l.digest]
	verify := s.opts.VerifyOnMount && !s.verified[l.digest]
	s.mu.Unlock()
	var once sync.Once
	undo := func() { once.Do(func() { s.release(l.digest) }) }
	if newHold {
		s.writeLease()
	}
	if verify {
		if err := s.Verify(ctx, l.digest); err != nil {
			undo()
			return nil, err
		}
		s.mu.Lock()
		s.verified[l.digest] = true
		s.mu.Unlock()
	}
	return undo, nil
}

// --- named layers ---

// NamedLayer is a layer record: a named single layer that sandboxes stack
// on top of their image (workspaces, toolkits). Layer names live in their
// own namespace, apart from image names.
type NamedLayer struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	DiffID    string    `json:"diff_id,omitempty"`
	SizeBytes int64     `json:"size_bytes"` // regular file content
	BlobSize  int64     `json:"blob_size"`
	Files     int64     `json:"files"`
	CreatedAt time.Time `json:"created_at"`
	// Layers made by CommitUpper (a sandbox's files): SetuidKept says
	// their setuid/setgid bits and file capabilities were kept
	// (CommitOptions.KeepSetuid), SetuidStripped how many entries lost
	// them otherwise.
	SetuidKept     bool  `json:"setuid_kept,omitempty"`
	SetuidStripped int64 `json:"setuid_stripped,omitempty"`
}

func (s *Store) namedPath(name string) string {
	return filepath.Join(s.namedDir(), strings.ReplaceAll(name, "/", "%2F")+".json")
}

// BuildLayerDir makes the tree at dir the named layer name (replacing one
// of that name). Files named ".wh.X" in the tree are whiteouts: they hide
// X of the layers below.
func (s *Store) BuildLayerDir(ctx context.Context, name, dir string) (NamedLayer, error) {
	return s.buildLayer(name, func(*NamedLayer) (LayerMeta, error) { return s.importDirStream(ctx, dir) })
}

// BuildLayerTar makes the tarball read from r (plain or gzip) the named
// layer name.
func (s *Store) BuildLayerTar(ctx context.Context, name string, r io.Reader) (NamedLayer, error) {
	return s.buildLayer(name, func(*NamedLayer) (LayerMeta, error) { return s.importTarStream(ctx, r) })
}

// buildLayer converts a layer with conv, which may fill in fields of the
// record it gets (those describing how the layer was made), and writes
// the record of name.
func (s *Store) buildLayer(name string, conv func(*NamedLayer) (LayerMeta, error)) (NamedLayer, error) {
	if err := ValidName(name); err != nil {
		return NamedLayer{}, errdefs.Invalidf("invalid layer name %q: want [a-z0-9][a-z0-9._:/-]{0,127}", name)
	}
	if !s.erofs {
		return NamedLayer{}, errdefs.Unsupportedf("named layers need an EROFS image store")
	}
	var nl NamedLayer
	m, err := conv(&nl)
	if err != nil {
		return NamedLayer{}, fmt.Errorf("build layer %s: %w", name, err)
	}
	defer s.unpin([]string{m.Digest})
	nl.Name, nl.Digest, nl.DiffID, nl.SizeBytes, nl.BlobSize, nl.Files, nl.CreatedAt = name, m.Digest, m.DiffID, m.Size, m.BlobSize, m.Files, time.Now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeJSONTemp(s.namedPath(name), nl); err != nil {
		return NamedLayer{}, fmt.Errorf("build layer %s: %w", name, err)
	}
	if !s.opts.NoMounts {
		_ = s.gcLocked(nil)
	}
	return nl, nil
}

// GetLayer returns the named layer; NotFound if there is none.
func (s *Store) GetLayer(name string) (NamedLayer, error) {
	if err := ValidName(name); err != nil {
		return NamedLayer{}, errdefs.Invalidf("invalid layer name %q", name)
	}
	return readRecord[NamedLayer](s.namedPath(name), "layer", name)
}

// ListLayers returns the named layers, sorted by name.
func (s *Store) ListLayers() ([]NamedLayer, error) {
	out := []NamedLayer{}
	if !s.erofs {
		return out, nil
	}
	ents, err := os.ReadDir(s.namedDir())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list layers")
	}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !strings.HasSuffix(n, ".json") {
			continue
		}
		nl, err := readRecord[NamedLayer](filepath.Join(s.namedDir(), n), "layer", n)
		if errdefs.CategoryOf(err) == errdefs.NotFound {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, nl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveLayer removes the named layer record; its blob is collected unless
// still used. The caller checks that no sandbox uses the layer.
func (s *Store) RemoveLayer(name string) error {
	if err := ValidName(name); err != nil {
		return errdefs.Invalidf("invalid layer name %q", name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(s.namedPath(name)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.NotFoundf("layer %s not found", name)
		}
		return errdefs.Wrap(errdefs.Internal, err, "remove layer "+name)
	}
	_ = atomicfile.SyncDir(s.namedDir())
	if !s.opts.NoMounts {
		if err := s.gcLocked(nil); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "layer "+name+" removed, but collecting its blob failed")
		}
	}
	return nil
}

// Resolve returns the layer digests, bottom first, of a sandbox made of
// image plus the named layers on top of it, in order (the last one
// top-most). A layer may also be given as a stored digest "sha256:<hex>".
// The digests are what LayerDirs takes (as Image.Layers) and what the
// daemon persists for the sandbox; the image's record comes along, read
// once, for its config.
func (s *Store) Resolve(image string, layers []string) (Image, []string, error) {
	img, err := s.Get(image)
	if err != nil {
		return img, nil, err
	}
	out, err := s.resolveOn(img, layers)
	return img, out, err
}

func (s *Store) resolveOn(img Image, layers []string) ([]string, error) {
	out := append([]string(nil), img.Layers...)
	for _, l := range layers {
		if strings.HasPrefix(l, "sha256:") {
			if _, err := s.LayerMeta(l); err != nil {
				return nil, err
			}
			out = append(out, l)
			continue
		}
		nl, err := s.GetLayer(l)
		if err != nil {
			return nil, err
		}
		out = append(out, nl.Digest)
	}
	if len(out) > maxStack {
		return nil, errdefs.Invalidf("too many layers: %d (at most %d)", len(out), maxStack)
	}
	return out, nil
}

// maxStack bounds the layers of one sandbox. overlayfs allows 500 lower
// layers, but the container backend passes them in one mount option
// string of at most a page (now as descriptor names of ~20 bytes; 40 was
// what fit as paths of <run-dir>/layers/<64 hex>, and stays).
const maxStack = 40

// LayerUsers lists the image and layer records that refer to digest.
func (s *Store) LayerUsers(digest string) (images, layers []string, err error) {
	imgs, err := s.List()
	if err != nil {
		return nil, nil, err
	}
	for _, im := range imgs {
		for _, d := range im.Layers {
			if d == digest {
				images = append(images, im.Name)
				break
			}
		}
	}
	nls, err := s.ListLayers()
	if err != nil {
		return nil, nil, err
	}
	for _, nl := range nls {
		if nl.Digest == digest {
			layers = append(layers, nl.Name)
		}
	}
	return images, layers, nil
}

// --- garbage collection of blobs ---

// gcBlobsLocked removes the blobs that no image or layer record, no hold
// of this process, no digest in keep and no fresh lease of another node
// refers to, and that are older than the GC grace period.
func (s *Store) gcBlobsLocked(used map[string]bool, keep map[string]bool) error {
	nls, err := s.ListLayers()
	if err != nil {
		return err
	}
	for _, nl := range nls {
		used[nl.Digest] = true
	}
	leased, err := s.otherLeases()
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(s.blobsDir())
	if err != nil {
		return err
	}
	grace := s.opts.GCGrace
	var errs []error
	present := map[string]bool{}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") {
			continue
		}
		h, ok := strings.CutSuffix(n, ".erofs")
		if !ok {
			if h2, ok := strings.CutSuffix(n, ".json"); ok {
				// Metadata without a blob: a crash between the two.
				if _, err := os.Stat(filepath.Join(s.blobsDir(), h2+".erofs")); errors.Is(err, os.ErrNotExist) && s.oldEnough(filepath.Join(s.blobsDir(), n), grace) {
					_ = os.Remove(filepath.Join(s.blobsDir(), n))
				}
			}
			continue
		}
		d := "sha256:" + h
		if t, ok := s.pending[d]; ok && time.Since(t) > pendingTTL {
			delete(s.pending, d)
		}
		if _, pending := s.pending[d]; used[d] || keep[d] || leased[d] || s.holds[d] > 0 || pending {
			present[d] = true
			if !used[d] && !keep[d] && !leased[d] && s.holds[d] > 0 {
				s.orphans[d] = true // collected when released
			} else {
				delete(s.orphans, d)
			}
			continue
		}
		p := filepath.Join(s.blobsDir(), n)
		if !s.oldEnough(p, grace) {
			present[d] = true
			continue
		}
		if s.mounts != nil {
			if err := s.mounts.Forget(h); err != nil {
				present[d] = true
				continue
			}
		}
		delete(s.orphans, d)
		// Metadata first: a blob without it is "absent" for readers.
		if err := os.Remove(s.blobMetaPath(h)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		delete(s.verified, d)
	}
	_ = atomicfile.SyncDir(s.blobsDir())
	// The diffID index entries of collected blobs.
	if idx, err := os.ReadDir(s.diffIDsDir()); err == nil {
		for _, e := range idx {
			n := e.Name()
			if strings.HasPrefix(n, ".") || !strings.HasSuffix(n, ".json") {
				continue
			}
			var v struct {
				Digest string `json:"digest"`
			}
			p := filepath.Join(s.diffIDsDir(), n)
			data, err := os.ReadFile(p)
			if err != nil || json.Unmarshal(data, &v) != nil || !present[v.Digest] {
				if s.oldEnough(p, grace) {
					_ = os.Remove(p)
				}
			}
		}
	}
	s.writeLeaseLocked()
	return errors.Join(errs...)
}

func (s *Store) oldEnough(p string, grace time.Duration) bool {
	if grace <= 0 {
		return true
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return true
	}
	return time.Since(fi.ModTime()) >= grace
}

// --- leases: the digests each node uses, for GC on a shared store ---

type lease struct {
	Node    string    `json:"node"`
	Updated time.Time `json:"updated"`
	Digests []string  `json:"digests"`
}

func (s *Store) leasePath(node string) string {
	return filepath.Join(s.leasesDir(), node+".json")
}

func (s *Store) writeLease() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writeLeaseLocked()
}

func (s *Store) writeLeaseLocked() {
	if !s.erofs || s.mounts == nil {
		return
	}
	l := lease{Node: s.opts.NodeID, Updated: time.Now().UTC(), Digests: []string{}}
	for d, n := range s.holds {
		if n > 0 {
			l.Digests = append(l.Digests, d)
		}
	}
	for d := range s.extraKeep {
		l.Digests = append(l.Digests, d)
	}
	sort.Strings(l.Digests)
	if s.writeJSONTemp(s.leasePath(s.opts.NodeID), l) != nil {
		// Unknown what the file holds now: the next hold writes again.
		s.leased = nil
		return
	}
	s.leased = make(map[string]bool, len(l.Digests))
	for _, d := range l.Digests {
		s.leased[d] = true
	}
}

// otherLeases returns the digests that other nodes' fresh leases hold.
func (s *Store) otherLeases() (map[string]bool, error) {
	out := map[string]bool{}
	ents, err := os.ReadDir(s.leasesDir())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		return nil, err
	}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !strings.HasSuffix(n, ".json") || n == s.opts.NodeID+".json" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(s.leasesDir(), n))
		if err != nil {
			continue
		}
		var l lease
		if json.Unmarshal(data, &l) != nil || time.Since(l.Updated) > s.opts.LeaseTTL {
			continue
		}
		for _, d := range l.Digests {
			out[d] = true
		}
	}
	return out, nil
}

func (s *Store) leaseLoop() {
	defer close(s.leaseDone)
	t := time.NewTicker(leaseRefresh)
	defer t.Stop()
	for {
		select {
		case <-s.leaseStop:
			return
		case <-t.C:
			s.writeLease()
		}
	}
}

// --- verification and observability ---

// Verify checks that the stored blob has its digest and recorded size.
// A mismatch is an Internal error naming the blob (it is corrupt: remove
// the images that use it and import them again).
func (s *Store) Verify(ctx context.Context, digest string) error {
	h, err := digestHex(digest)
	if err != nil {
		return err
	}
	m, err := s.LayerMeta(digest)
	if err != nil {
		return err
	}
	if m.Format != FormatEROFS {
		return nil // a legacy directory layer: nothing to hash
	}
	f, err := os.Open(filepath.Join(s.blobsDir(), h+".erofs"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.NotFoundf("blob of layer %s is missing", digest)
		}
		return errdefs.Wrap(errdefs.Internal, err, "verify "+digest)
	}
	defer f.Close()
	sum := sha256.New()
	n, err := io.Copy(sum, &ctxReader{ctx: ctx, r: f})
	if err != nil {
		return fmt.Errorf("verify %s: %w", digest, err)
	}
	if n != m.BlobSize {
		return errdefs.Internalf("layer %s is corrupt: blob has %d bytes, metadata says %d", digest, n, m.BlobSize)
	}
	if got := "sha256:" + hex.EncodeToString(sum.Sum(nil)); got != digest {
		return errdefs.Internalf("layer %s is corrupt: blob content hashes to %s", digest, got)
	}
	return nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// LayerStat is the on-demand loading state of one stored layer.
type LayerStat struct {
	Digest string `json:"digest"`
	DiffID string `json:"diff_id,omitempty"`
	Format string `json:"format"`
	Size   int64  `json:"size"` // blob bytes (EROFS) or content bytes (dir)
	// Resident, BlobResident, FilesResident: see Residency.
	Resident      int64 `json:"resident"`
	BlobResident  int64 `json:"blob_resident"`
	FilesResident int64 `json:"files_resident"`
	Files         int64 `json:"files"`
	Mounted       bool  `json:"mounted"`
	Refs          int   `json:"refs"`      // sandboxes of this process using it
	DirectIO      bool  `json:"direct_io"` // the mount reads the blob with direct I/O
	ReadAheadKB   int   `json:"read_ahead_kb,omitempty"`
}

// Stats returns the loading state of the given layers.
func (s *Store) Stats(ctx context.Context, digests []string) ([]LayerStat, error) {
	mounted := map[string]layermount.Info{}
	if s.mounts != nil {
		for _, in := range s.mounts.List() {
			mounted["sha256:"+in.Key] = in
		}
	}
	out := make([]LayerStat, 0, len(digests))
	for _, d := range digests {
		m, err := s.LayerMeta(d)
		if err != nil {
			return nil, err
		}
		st := LayerStat{Digest: d, DiffID: m.DiffID, Format: m.Format, Files: m.Files}
		if m.Format == FormatEROFS {
			r, err := s.Residency(ctx, d)
			if err != nil {
				return nil, err
			}
			st.Size, st.Resident, st.BlobResident, st.FilesResident = r.Size, r.Resident, r.Blob, r.Files
		} else {
			st.Size = m.Size
		}
		if in, ok := mounted[d]; ok {
			st.Mounted, st.Refs, st.DirectIO, st.ReadAheadKB = in.Mounted, in.Refs, in.DirectIO, in.ReadAheadKB
		}
		out = append(out, st)
	}
	return out, nil
}

// MountedStats returns the loading state of the EROFS layers mounted on
// this node (for metrics); layers whose blob is gone are left out.
func (s *Store) MountedStats(ctx context.Context) ([]LayerStat, error) {
	if s.mounts == nil {
		return nil, nil
	}
	var out []LayerStat
	for _, in := range s.mounts.List() {
		if !in.Mounted {
			continue
		}
		st, err := s.Stats(ctx, []string{"sha256:" + in.Key})
		if errdefs.CategoryOf(err) == errdefs.NotFound {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, st...)
	}
	return out, nil
}

// Blobs lists the digests of every stored layer (blobs and legacy
// directories), sorted.
func (s *Store) Blobs() ([]string, error) {
	var out []string
	if s.erofs {
		ents, err := os.ReadDir(s.blobsDir())
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "list blobs")
		}
		for _, e := range ents {
			if h, ok := strings.CutSuffix(e.Name(), ".erofs"); ok && !strings.HasPrefix(h, ".") {
				out = append(out, "sha256:"+h)
			}
		}
	}
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list layers")
	}
	for _, e := range ents {
		if h, ok := strings.CutPrefix(e.Name(), "sha256-"); ok {
			out = append(out, "sha256:"+h)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Package image stores sandbox images as stacks of read-only layers.
//
// A store opened with OpenStore keeps every layer once, as an EROFS image
// (a "blob"), content-addressed, in a directory that may be shared by
// several nodes; each node mounts the blobs it needs read-only through its
// mount cache (internal/layermount), so the kernel reads only the blocks
// that sandboxes touch. Open gives the older store whose layers are plain
// directory trees; an EROFS store still serves such directories.
//
// Layout under the store root (<statedir>/images, or --image-store):
//
//	blobs/sha256/<hex>.erofs       a layer's EROFS image; <hex> is its sha256
//	blobs/sha256/<hex>.json        its LayerMeta: size, diffID, builder, files
//	diffids/sha256/<hex>.json      diffID -> blob digest (conversion cache)
//	images/<name>.json             one record per image ("/" in names as %2F)
//	named-layers/<name>.json       named layers (warren layer build)
//	leases/<node>.json             the digests each node's sandboxes use or used lately
//	layers/sha256-<hex>/fs         legacy layer trees; meta.json beside
//	tmp/                           imports in progress, spool files
//
// A blob is published by writing a temp file in its final directory,
// fsyncing it, renaming it and fsyncing the directory; it is never
// modified afterwards. A directory layer's digest is the sha256 of the
// canonical tar stream of its tree (tarx.Create); an EROFS layer's diffID
// is the sha256 of the tar stream it was converted from, which for a
// directory import is that same canonical stream.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/atomicfile"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/layermount"
	"github.com/warrenrl/warren/internal/tarx"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// BuilderVersion identifies how layer trees are built and hashed; it is
// recorded in each layer's meta.json.
const BuilderVersion = "warren-tarx/1"

// Layer is one read-only layer of an image.
type Layer interface {
	// Digest is "sha256:<hex>".
	Digest() string
	// Mount returns a host directory with the layer's tree and a release
	// func; for directory layers it is the directory itself. EROFS layers
	// will mount on demand and refcount. While not released, the layer is
	// kept by garbage collection even if no image references it any more.
	Mount(ctx context.Context) (dir string, release func(), err error)
}

// Image is an image record.
type Image struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`     // sha256 of the layer digest list
	Layers    []string  `json:"layers"` // digests, bottom first
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// DiffIDs are the layers' uncompressed tar digests, in Layers order
	// (EROFS layers only).
	DiffIDs []string `json:"diff_ids,omitempty"`
	// Source is where the image came from (a reference with the manifest
	// digest), for OCI imports.
	Source string `json:"source,omitempty"`
	// Config is the OCI image configuration that matters to a sandbox.
	Config *Config `json:"config,omitempty"`
}

// Config is the part of an OCI image configuration a sandbox may use.
type Config struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Platform   string   `json:"platform,omitempty"` // os/arch[/variant]
}

// LayerMeta is the metadata of a stored layer: meta.json beside a layer
// directory, <hex>.json beside an EROFS blob.
type LayerMeta struct {
	Digest  string    `json:"digest"`
	Size    int64     `json:"size"`  // bytes of regular file content
	Files   int64     `json:"files"` // entries in the tree (EROFS: inodes)
	Builder string    `json:"builder"`
	Created time.Time `json:"created"`
	// Format is FormatEROFS or FormatDir ("" in legacy records).
	Format string `json:"format,omitempty"`
	// DiffID is the sha256 of the tar stream the blob was converted from.
	DiffID string `json:"diff_id,omitempty"`
	// BlobSize is the size of the EROFS blob.
	BlobSize int64 `json:"blob_size,omitempty"`
	// RootOpaque: the layer hides everything below it.
	RootOpaque bool `json:"root_opaque,omitempty"`
	// MaxID is the highest uid or gid of the layer's files (nil in
	// records older than it: unknown).
	MaxID *uint32 `json:"max_id,omitempty"`
}

// Layer formats (LayerMeta.Format).
const (
	FormatEROFS = "erofs"
	FormatDir   = "dir"
)

// Store is an image and layer store. It is safe for concurrent use by one
// process. A legacy store (Open) must not be opened by two processes; an
// EROFS store (OpenStore) may be shared by processes and nodes, each with
// its own mount directory.
type Store struct {
	root  string
	erofs bool
	opts  Options

	mounts    *layermount.Cache
	leaseStop chan struct{}
	leaseDone chan struct{}
	closeOnce sync.Once

	// One residency measurement at a time: each drops the pages its own
	// walk read, which a concurrent one would count.
	residencyMu sync.Mutex

	mu    sync.Mutex     // publishing, records, garbage collection
	holds map[string]int // digest -> unreleased Mounts
	// leased are the digests of the lease file last written. A digest
	// stays in the lease after its last hold is released, until the next
	// refresh or GC rewrites it: a sandbox created after another of the
	// same image was deleted then costs no lease write (two fsyncs).
	leased    map[string]bool
	orphans   map[string]bool
	verified  map[string]bool // blobs hashed since this process mounted them
	extraKeep map[string]bool // digests the daemon last said are in use
	pending   map[string]time.Time
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._:/-]{0,127}$`)

// ValidName reports an Invalid error unless name is a valid image name:
// [a-z0-9][a-z0-9._:/-]{0,127}.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalidf("invalid image name %q: want [a-z0-9][a-z0-9._:/-]{0,127}", name)
	}
	return nil
}

// Open opens (creating if needed) a legacy store at root, whose imports
// are directory trees, and removes what a crash left in its tmp
// directory. It does not collect unreferenced layers: call GC once
// running sandboxes have taken their layers again. OpenStore opens an
// EROFS store.
func Open(root string) (*Store, error) {
	s := &Store{root: root, holds: map[string]int{}, orphans: map[string]bool{}, verified: map[string]bool{}, pending: map[string]time.Time{}}
	for _, d := range []string{root, s.layersDir(), s.imagesDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "image store")
		}
	}
	ents, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "image store")
	}
	for _, e := range ents {
		if err := inroot.RemoveTree(filepath.Join(s.tmpDir(), e.Name())); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "image store: removing leftover")
		}
	}
	// Leftover record temp files from a crash.
	recs, err := os.ReadDir(s.imagesDir())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "image store")
	}
	for _, e := range recs {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			_ = os.Remove(filepath.Join(s.imagesDir(), e.Name()))
		}
	}
	return s, nil
}

// Root returns the store's root directory.
func (s *Store) Root() string { return s.root }

func (s *Store) layersDir() string { return filepath.Join(s.root, "layers") }
func (s *Store) imagesDir() string { return filepath.Join(s.root, "images") }
func (s *Store) tmpDir() string    { return filepath.Join(s.root, "tmp") }

func (s *Store) recordPath(name string) string {
	return filepath.Join(s.imagesDir(), strings.ReplaceAll(name, "/", "%2F")+".json")
}

func digestHex(digest string) (string, error) {
	h, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", errdefs.Invalidf("invalid layer digest %q", digest)
	}
	return h, nil
}

// ShortDigest abbreviates "sha256:<hex>" (or a bare hex id) to 12 hex
// digits, for tables and progress lines.
func ShortDigest(d string) string {
	_, hex, ok := strings.Cut(d, ":")
	if !ok {
		hex = d
	}
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return hex
}

func (s *Store) layerPath(digest string) (string, error) {
	h, err := digestHex(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.layersDir(), "sha256-"+h), nil
}

// ImportDir imports the tree at dir (a host directory; symlinks in it are
// copied as symlinks, never followed out of it) as a one-layer image
// called name. Owners, modes (setuid included), xattrs and times are kept;
// device nodes and fifos are dropped (the sandbox gets its own /dev).
// Importing over an existing name replaces that image; the old layers are
// garbage-collected unless another image or an unreleased Mount uses
// them. A failed import leaves nothing behind.
func (s *Store) ImportDir(ctx context.Context, name, dir string) (Image, error) {
	if err := ValidName(name); err != nil {
		return Image{}, err
	}
	if s.erofs {
		return s.importEROFS(ctx, name, func() (LayerMeta, error) { return s.importDirStream(ctx, dir) })
	}
	if err := checkSourceDir(dir, "import source", errdefs.Invalid); err != nil {
		return Image{}, err
	}
	return s.importWith(ctx, name, func(fsDir string) (tarx.Stats, error) {
		pr, done := treeStream(ctx, dir)
		st, err := tarx.Extract(ctx, fsDir, pr, layerOptions())
		pr.CloseWithError(errors.New("extraction stopped"))
		cerr := <-done
		// When extraction fails (a full disk, say), the reader fails only
		// because we stopped reading: report the extraction's error.
		if err != nil {
			return st, err
		}
		if cerr != nil {
			return st, fmt.Errorf("reading %s: %w", dir, cerr)
		}
		return st, nil
	})
}

// ImportTar imports a root filesystem tarball (plain or gzip-compressed)
// as a one-layer image called name, with the same rules as ImportDir. A
// corrupt or truncated tarball is an Invalid error.
func (s *Store) ImportTar(ctx context.Context, name string, r io.Reader) (Image, error) {
	if err := ValidName(name); err != nil {
		return Image{}, err
	}
	if s.erofs {
		return s.importEROFS(ctx, name, func() (LayerMeta, error) { return s.importTarStream(ctx, r) })
	}
	return s.importWith(ctx, name, func(fsDir string) (tarx.Stats, error) {
		return tarx.Extract(ctx, fsDir, r, layerOptions())
	})
}

// checkSourceDir checks that dir, the source of what (an import, a
// commit), is a directory: NotFound if it does not exist, Invalid if it is
// something else, statCat if it cannot be looked at.
func checkSourceDir(dir, what string, statCat errdefs.Category) error {
	fi, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.NotFoundf("no such directory: %s", dir)
		}
		return errdefs.Wrap(statCat, err, what)
	}
	if !fi.IsDir() {
		return errdefs.Invalidf("%s %s is not a directory", what, dir)
	}
	return nil
}

// treeStream streams the canonical tar stream of dir (tarx.Create) through
// a pipe; done delivers Create's error once it returned. The caller closes
// the reader when it stops reading.
func treeStream(ctx context.Context, dir string) (*io.PipeReader, <-chan error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := tarx.Create(ctx, dir, pw, "/")
		pw.CloseWithError(err)
		done <- err
	}()
	return pr, done
}

func layerOptions() tarx.Options {
	return tarx.Options{KeepOwners: true, KeepSetuid: true, SkipDevices: true}
}

func (s *Store) importWith(ctx context.Context, name string, fill func(fsDir string) (tarx.Stats, error)) (img Image, err error) {
	tmp, err := os.MkdirTemp(s.tmpDir(), "import-")
	if err != nil {
		return Image{}, errdefs.Wrap(errdefs.Internal, err, "import")
	}
	defer func() {
		if tmp != "" {
			_ = inroot.RemoveTree(tmp)
		}
	}()
	fsDir := filepath.Join(tmp, "fs")
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		return Image{}, errdefs.Wrap(errdefs.Internal, err, "import")
	}
	st, err := fill(fsDir)
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", name, err)
	}
	digest, err := treeDigest(ctx, fsDir)
	if err != nil {
		return Image{}, fmt.Errorf("import %s: hashing layer: %w", name, err)
	}
	meta := LayerMeta{Digest: digest, Size: st.Bytes, Files: st.Entries, Builder: BuilderVersion, Created: time.Now().UTC(), Format: FormatDir}
	if err := writeJSON(filepath.Join(tmp, "meta.json"), meta); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", name, err)
	}
	if err := os.Chmod(tmp, 0o711); err != nil {
		return Image{}, errdefs.Wrap(errdefs.Internal, err, "import "+name)
	}
	if err := syncFS(tmp); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", name, err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	lp, _ := s.layerPath(digest)
	published := false
	if existing, err := readMeta(lp); err == nil {
		meta = existing // identical content: keep the stored copy
	} else {
		if _, serr := os.Lstat(lp); serr == nil {
			// A layer directory without readable metadata: replace it.
			if err := s.discardLocked(lp); err != nil {
				return Image{}, errdefs.Wrap(errdefs.Internal, err, "import "+name)
			}
		}
		if err := os.Rename(tmp, lp); err != nil {
			return Image{}, errdefs.Wrap(errnoCategory(err), err, "import "+name+": publishing layer")
		}
		tmp = ""
		published = true
		_ = atomicfile.SyncDir(s.layersDir())
	}
	img = Image{
		Name:      name,
		ID:        imageID([]string{digest}),
		Layers:    []string{digest},
		SizeBytes: meta.Size,
		CreatedAt: time.Now().UTC(),
	}
	if err := s.writeRecordLocked(img); err != nil {
		if published {
			_ = s.gcLocked(nil)
		}
		return Image{}, fmt.Errorf("import %s: %w", name, err)
	}
	_ = s.gcLocked(nil) // the image may have replaced one
	return img, nil
}

func imageID(layers []string) string {
	sum := sha256.Sum256([]byte(strings.Join(layers, "\n")))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// treeDigest hashes the canonical tar stream of dir.
func treeDigest(ctx context.Context, dir string) (string, error) {
	h := sha256.New()
	if err := tarx.Create(ctx, dir, h, "/"); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func errnoCategory(err error) errdefs.Category {
	var en unix.Errno
	if errors.As(err, &en) && (en == unix.ENOSPC || en == unix.EDQUOT) {
		return errdefs.Exhausted
	}
	return errdefs.Internal
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "sync")
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return errdefs.Wrap(errnoCategory(err), err, "sync")
	}
	return nil
}

// writeJSON writes v to path through a temp file, fsynced, then renamed.
func writeJSON(path string, v any) error { return writeJSONVia(path, ".tmp-", v) }

// writeJSONVia is writeJSON through a temp file whose name starts with
// tmpPrefix.
func writeJSONVia(path, tmpPrefix string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "encode "+filepath.Base(path))
	}
	if err := atomicfile.Write(path, tmpPrefix, append(data, '\n'), 0o644); err != nil {
		return errdefs.Wrap(errnoCategory(err), err, "write "+filepath.Base(path))
	}
	return nil
}

func readMeta(layerPath string) (LayerMeta, error) {
	return readMetaFile(filepath.Join(layerPath, "meta.json"))
}

func (s *Store) writeRecordLocked(img Image) error {
	return s.writeRecordTemp(s.recordPath(img.Name), img)
}

// Get returns the image called name; NotFound if there is none.
func (s *Store) Get(name string) (Image, error) {
	if err := ValidName(name); err != nil {
		return Image{}, err
	}
	return readRecord[Image](s.recordPath(name), "image", name)
}

// readRecord reads the JSON record of an image or named layer (kind) at
// path: NotFound when the file is missing (removed meanwhile, too),
// Internal when it cannot be read or parsed.
func readRecord[T any](path, kind, name string) (T, error) {
	var v T
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return v, errdefs.NotFoundf("%s %s not found", kind, name)
		}
		return v, errdefs.Wrap(errdefs.Internal, err, "read "+kind+" "+name)
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return v, errdefs.Wrap(errdefs.Internal, err, "corrupt "+kind+" record "+path)
	}
	return v, nil
}

// List returns every image, sorted by name.
func (s *Store) List() ([]Image, error) {
	ents, err := os.ReadDir(s.imagesDir())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list images")
	}
	imgs := []Image{}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !strings.HasSuffix(n, ".json") {
			continue
		}
		img, err := readRecord[Image](filepath.Join(s.imagesDir(), n), "image", n)
		if errdefs.CategoryOf(err) == errdefs.NotFound {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, img)
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].Name < imgs[j].Name })
	return imgs, nil
}

// Remove removes the image record called name (NotFound if there is
// none); layers no other image uses are garbage-collected, except those
// still held by an unreleased Mount, which go when released. The caller
// checks that no sandbox uses the image.
func (s *Store) Remove(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(s.recordPath(name)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.NotFoundf("image %s not found", name)
		}
		return errdefs.Wrap(errdefs.Internal, err, "remove image "+name)
	}
	_ = atomicfile.SyncDir(s.imagesDir())
	if s.opts.NoMounts {
		return nil
	}
	if err := s.gcLocked(nil); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "image "+name+" removed, but collecting its layers failed")
	}
	return nil
}

// GC removes the layers that no image or layer record references, no
// unreleased Mount holds and that are not in keep (the digests the
// daemon's live sandboxes use), and, in an EROFS store, that no other
// node's lease holds and that are older than the GC grace period. Remove
// and imports do this by themselves; the daemon calls it after a restart
// once the sandboxes it adopted hold their layers again: it then also
// unmounts the cached layer mounts nobody took back. The keep set is
// remembered (and published in this node's lease) until the next call.
func (s *Store) GC(keep ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.NoMounts {
		return nil
	}
	if keep != nil || s.extraKeep == nil {
		s.extraKeep = map[string]bool{}
		for _, d := range keep {
			s.extraKeep[d] = true
		}
	}
	if s.mounts != nil {
		_ = s.mounts.UnmountIdle()
	}
	return s.gcLocked(nil)
}

// SetKeep replaces the remembered keep set of GC (the digests the
// daemon's live sandboxes use) without collecting anything, so that the
// layers of sandboxes deleted since the last GC are no longer kept. It
// updates this node's lease when the set changed.
func (s *Store) SetKeep(keep ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string]bool, len(keep))
	for _, d := range keep {
		next[d] = true
	}
	if s.extraKeep != nil && maps.Equal(next, s.extraKeep) {
		return
	}
	s.extraKeep = next
	s.writeLeaseLocked()
}

func (s *Store) gcLocked(_ map[string]bool) error {
	imgs, err := s.List()
	if err != nil {
		return err // never collect on a partial view
	}
	used := map[string]bool{}
	for _, img := range imgs {
		for _, d := range img.Layers {
			used[d] = true
		}
	}
	if s.erofs {
		if err := s.gcBlobsLocked(used, s.extraKeep); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		h, ok := strings.CutPrefix(e.Name(), "sha256-")
		if !ok {
			continue
		}
		digest := "sha256:" + h
		if used[digest] || s.extraKeep[digest] {
			delete(s.orphans, digest)
			continue
		}
		if s.holds[digest] > 0 {
			s.orphans[digest] = true
			continue
		}
		delete(s.orphans, digest)
		if err := s.discardLocked(filepath.Join(s.layersDir(), e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// discardLocked moves a layer directory out of layers/ atomically, then
// deletes it; a crash in between leaves it in tmp/ for Open to remove.
func (s *Store) discardLocked(dir string) error {
	trash, err := os.MkdirTemp(s.tmpDir(), "gc-")
	if err != nil {
		return err
	}
	dst := filepath.Join(trash, "layer")
	if err := os.Rename(dir, dst); err != nil {
		os.Remove(trash)
		return err
	}
	return inroot.RemoveTree(trash)
}

// Layer returns the stored layer with that digest; NotFound if absent.
func (s *Store) Layer(digest string) (Layer, error) {
	lp, err := s.layerPath(digest)
	if err != nil {
		return nil, err
	}
	if s.erofs {
		h := digest[len("sha256:"):]
		if _, err := os.Stat(s.blobMetaPath(h)); err == nil {
			return &erofsLayer{s: s, digest: digest, blob: filepath.Join(s.blobsDir(), h+".erofs")}, nil
		}
	}
	if _, err := os.Stat(filepath.Join(lp, "fs")); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.NotFoundf("layer %s not found", digest)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "layer "+digest)
	}
	return &dirLayer{s: s, digest: digest, dir: filepath.Join(lp, "fs")}, nil
}

// LayerMeta returns the metadata of the stored layer with that digest.
func (s *Store) LayerMeta(digest string) (LayerMeta, error) {
	lp, err := s.layerPath(digest)
	if err != nil {
		return LayerMeta{}, err
	}
	if s.erofs {
		m, err := readMetaFile(s.blobMetaPath(digest[len("sha256:"):]))
		if err == nil {
			return m, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return m, errdefs.Wrap(errdefs.Internal, err, "layer "+digest)
		}
	}
	m, err := readMeta(lp)
	if err == nil && m.Format == "" {
		m.Format = FormatDir
	}
	if errors.Is(err, os.ErrNotExist) {
		return m, errdefs.NotFoundf("layer %s not found", digest)
	}
	if err != nil {
		return m, errdefs.Wrap(errdefs.Internal, err, "layer "+digest)
	}
	return m, nil
}

type dirLayer struct {
	s      *Store
	digest string
	dir    string
}

func (l *dirLayer) Digest() string { return l.digest }

func (l *dirLayer) Mount(ctx context.Context) (string, func(), error) {
	if err := ctx.Err(); err != nil {
		return "", nil, err
	}
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	// Check under the lock so that GC cannot remove it between the check
	// and the hold.
	if _, err := os.Stat(l.dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil, errdefs.NotFoundf("layer %s not found", l.digest)
		}
		return "", nil, errdefs.Wrap(errdefs.Internal, err, "layer "+l.digest)
	}
	s.holds[l.digest]++
	var once sync.Once
	return l.dir, func() { once.Do(func() { s.release(l.digest) }) }, nil
}

func (s *Store) release(digest string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holds[digest]--
	if s.holds[digest] > 0 {
		return
	}
	delete(s.holds, digest)
	if s.orphans[digest] {
		_ = s.gcLocked(nil)
	}
	// No lease write: the digest stays leased a while longer (s.leased),
	// which only delays other nodes' collection of it.
}

// LayerDirs mounts the layers of img and returns their directories
// top-most first, ready for an overlayfs lowerdir, and a func releasing
// them (idempotent). Until released, the layers survive garbage collection
// even if img is removed or replaced. img may be a stale value: only its
// Layers are used, so a daemon that persisted them can take its layers
// again after a restart.
func (s *Store) LayerDirs(ctx context.Context, img Image) (dirs []string, release func(), err error) {
	refs, release, err := s.LayerRefs(ctx, img, true)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range refs {
		dirs = append(dirs, r.Dir)
	}
	return dirs, release, nil
}

// LayerRef is one layer of a sandbox's root as LayerRefs returns it.
type LayerRef struct {
	Digest string // "sha256:<hex>"
	Blob   string // host path of its EROFS blob; "" for a directory layer
	Dir    string // host directory with its tree (the blob mounted)
	// MaxID is the highest uid or gid of the layer's files, from its
	// record (nil: not recorded, as in records older than it).
	MaxID *uint32
}

// LayerRefs is LayerDirs with each layer's digest and blob path too, for
// backends that take the blob rather than (or as well as) the mounted
// directory. The layers are held until release, as in LayerDirs; with
// mount false, EROFS layers are held without being mounted and their Dir
// is "" (directory layers, which have no blob, keep their Dir).
func (s *Store) LayerRefs(ctx context.Context, img Image, mount bool) (refs []LayerRef, release func(), err error) {
	if len(img.Layers) == 0 {
		return nil, nil, errdefs.Invalidf("image %s has no layers", img.Name)
	}
	var releases []func()
	releaseAll := func() {
		for i := len(releases) - 1; i >= 0; i-- {
			releases[i]()
		}
	}
	// Each layer's record is read once, top first: for its highest id,
	// and for whether its root is opaque.
	aboveOpaque := false
	for i := len(img.Layers) - 1; i >= 0; i-- {
		if aboveOpaque {
			// A layer above marked its root opaque: overlayfs would not
			// hide the layers below it, so they are left out.
			break
		}
		var maxID *uint32
		if m, err := s.LayerMeta(img.Layers[i]); err == nil {
			maxID, aboveOpaque = m.MaxID, s.erofs && m.RootOpaque
		}
		l, err := s.Layer(img.Layers[i])
		if el, ok := l.(*erofsLayer); err == nil && ok && !mount {
			var rel func()
			if rel, err = el.hold(ctx); err == nil {
				refs = append(refs, LayerRef{Digest: img.Layers[i], Blob: el.blob, MaxID: maxID})
				releases = append(releases, rel)
				continue
			}
		} else if err == nil {
			var dir string
			var rel func()
			dir, rel, err = l.Mount(ctx)
			if err == nil {
				ref := LayerRef{Digest: img.Layers[i], Dir: dir, MaxID: maxID}
				if el, ok := l.(*erofsLayer); ok {
					ref.Blob = el.blob
				}
				refs = append(refs, ref)
				releases = append(releases, rel)
				continue
			}
		}
		releaseAll()
		return nil, nil, fmt.Errorf("image %s: %w", img.Name, err)
	}
	var once sync.Once
	return refs, func() { once.Do(releaseAll) }, nil
}

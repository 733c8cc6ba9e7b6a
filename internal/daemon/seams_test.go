package daemon

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

// rootless hides the container sandboxes' host root, as a VM backend
// would; with files set, its sandboxes serve file calls themselves
// (backend.Files, here sandboxfs over the hidden root, counting calls).
type rootless struct {
	backend.Backend
	files bool
	calls *atomic.Int64
	mu    sync.Mutex
	specs []backend.Spec
}

type rootlessSandbox struct{ backend.Sandbox }

func (rootlessSandbox) Root() string { return "" }

type filesSandbox struct {
	rootlessSandbox
	fs countingFS
}

func (s filesSandbox) Files() backend.FileSystem { return s.fs }

type countingFS struct {
	*sandboxfs.FS
	calls *atomic.Int64
}

func (f countingFS) ReadFile(ctx context.Context, p string, off, length int64) ([]byte, int64, bool, error) {
	f.calls.Add(1)
	return f.FS.ReadFile(ctx, p, off, length)
}

func (r *rootless) Create(ctx context.Context, spec backend.Spec) (backend.Sandbox, error) {
	r.mu.Lock()
	r.specs = append(r.specs, spec)
	r.mu.Unlock()
	sb, err := r.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	if r.files {
		return filesSandbox{rootlessSandbox{sb}, countingFS{sandboxfs.New(sb.Root()), r.calls}}, nil
	}
	return rootlessSandbox{sb}, nil
}

// TestRootlessBackendWithoutFiles: a sandbox with neither a host root nor
// backend.Files refuses file calls and user names as unsupported (never
// retried), while execs by number still run.
func TestRootlessBackendWithoutFiles(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Backends["container"] = &rootless{Backend: c.Backends["container"]} })
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "vm"})
	_, err := e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "vm", Path: "/etc/passwd"})
	wantCat(t, err, errdefs.Unsupported, "file operations not supported")
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "vm", Argv: []string{"id", "-u"}, User: "nobody"})
	wantCat(t, err, errdefs.Unsupported, "user names are not supported")
	if r := e.exec(&warrenv1.ExecRequest{SandboxId: "vm", Shell: "id -u", User: "65534"}); string(r.GetStdout()) != "65534\n" {
		t.Fatalf("exec by uid: %q", r.GetStdout())
	}
}

// TestRootlessBackendWithFiles: with backend.Files, file calls and the
// user-name lookups of exec go through the backend's FileSystem.
func TestRootlessBackendWithFiles(t *testing.T) {
	var calls atomic.Int64
	e := newEnv(t, func(c *Config) {
		c.Backends["container"] = &rootless{Backend: c.Backends["container"], files: true, calls: &calls}
	})
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "vm"})
	if _, err := e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "vm", Path: "/tmp/x", Content: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	rf, err := e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "vm", Path: "/tmp/x"})
	if err != nil || string(rf.GetContent()) != "hi" {
		t.Fatalf("read back %q, %v", rf.GetContent(), err)
	}
	before := calls.Load()
	if before == 0 {
		t.Fatal("ReadFile did not go through backend.Files")
	}
	if r := e.exec(&warrenv1.ExecRequest{SandboxId: "vm", Shell: "id -u", User: "nobody"}); string(r.GetStdout()) != "65534\n" {
		t.Fatalf("exec as nobody: %q", r.GetStdout())
	}
	if calls.Load() == before {
		t.Fatal("the user name was not looked up through backend.Files")
	}
}

// TestSpecLayersAreReferences: the backend gets each layer's digest, the
// path of its EROFS blob and its mounted directory, top-most first.
func TestSpecLayersAreReferences(t *testing.T) {
	var rb *rootless
	e := newEnv(t, func(c *Config) {
		rb = &rootless{Backend: c.Backends["container"]}
		c.Backends["container"] = rb
	})
	e.create(&warrenv1.CreateRequest{Id: "refs"})
	img, err := e.images.Get("busybox")
	if err != nil {
		t.Fatal(err)
	}
	rb.mu.Lock()
	spec := rb.specs[len(rb.specs)-1]
	rb.mu.Unlock()
	if len(spec.Layers) != len(img.Layers) || len(spec.Layers) == 0 {
		t.Fatalf("spec layers %+v, image layers %v", spec.Layers, img.Layers)
	}
	for i, l := range spec.Layers {
		if want := img.Layers[len(img.Layers)-1-i]; l.Digest != want {
			t.Errorf("layer %d digest %s, want %s (top-most first)", i, l.Digest, want)
		}
		blob, err := e.images.BlobPath(l.Digest)
		if err != nil || l.Blob != blob {
			t.Errorf("layer %d blob %q, want %q (%v)", i, l.Blob, blob, err)
		}
		if fi, err := os.Stat(l.Blob); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("layer %d blob: %v", i, err)
		}
		if fi, err := os.Stat(l.Dir); err != nil || !fi.IsDir() {
			t.Errorf("layer %d dir %q: %v", i, l.Dir, err)
		}
	}
}

// blobBackend wants layers as blobs only (backend.LayerMounts), as a VM
// backend attaching them as disks would; for the test it runs the
// sandbox on the busybox tree.
type blobBackend struct {
	*rootless
	root string
}

func (blobBackend) MountLayers() bool { return false }

func (b blobBackend) Create(ctx context.Context, spec backend.Spec) (backend.Sandbox, error) {
	b.mu.Lock()
	b.specs = append(b.specs, spec)
	b.mu.Unlock()
	spec.Layers = backend.DirLayers(b.root)
	return b.Backend.Create(ctx, spec)
}

// TestLayerBlobsWithoutMounts: a backend that does not want mounts gets
// the layers' digests and blobs, no directories, and the node mounts
// nothing for it, while still holding the blobs for the sandbox's life.
func TestLayerBlobsWithoutMounts(t *testing.T) {
	var bb blobBackend
	e := newEnv(t, func(c *Config) {
		bb = blobBackend{&rootless{Backend: c.Backends["container"]}, busyboxRoot(t)}
		c.Backends["container"] = bb
	})
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "blobs"})
	img, err := e.images.Get("busybox")
	if err != nil {
		t.Fatal(err)
	}
	bb.mu.Lock()
	spec := bb.specs[len(bb.specs)-1]
	bb.mu.Unlock()
	if len(spec.Layers) != len(img.Layers) {
		t.Fatalf("spec layers %+v", spec.Layers)
	}
	for i, l := range spec.Layers {
		blob, _ := e.images.BlobPath(l.Digest)
		if l.Dir != "" || l.Blob != blob || l.Digest != img.Layers[len(img.Layers)-1-i] {
			t.Errorf("layer %d: %+v, want blob %s and no dir", i, l, blob)
		}
	}
	st, err := e.m.ImageStats(ctx, &warrenv1.ImageStatsRequest{Names: []string{"busybox"}})
	if err != nil || len(st.GetLayers()) == 0 {
		t.Fatalf("stats %v %v", st, err)
	}
	for _, l := range st.GetLayers() {
		if l.GetMounted() {
			t.Errorf("layer %s mounted for a backend that wants blobs", l.GetDigest())
		}
	}
	// Held: the image cannot go while its sandbox runs.
	if _, err := e.m.RemoveImage(ctx, &warrenv1.RemoveImageRequest{Name: "busybox"}); errdefs.CategoryOf(err) != errdefs.Conflict {
		t.Fatalf("remove image in use: %v", err)
	}
}

package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/sandboxfs"
	"github.com/warrenrl/warren/internal/tarx"
	"github.com/warrenrl/warren/internal/testutil"
)

// writeTree creates files under dir: path -> content; a content of "/"
// makes a directory.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if c == "/" {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// buildLayer builds the named layer name from files, through the API.
func (e *env) buildLayer(name string, files map[string]string) *warrenv1.Layer {
	e.t.Helper()
	dir := filepath.Join(e.dir, "src-"+name)
	writeTree(e.t, dir, files)
	l, err := e.m.BuildLayer(ctxT(e.t), &warrenv1.BuildLayerRequest{Name: name, Path: dir})
	if err != nil {
		e.t.Fatalf("build layer %s: %v", name, err)
	}
	return l
}

func (e *env) out(id, script string) string {
	e.t.Helper()
	res := e.sh(id, script)
	if res.GetExitCode() != 0 {
		e.t.Fatalf("%s: %q exited %d: %s", id, script, res.GetExitCode(), res.GetStderr())
	}
	return string(res.GetStdout())
}

func TestLayerComposition(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	l1 := e.buildLayer("l1", map[string]string{
		"etc/greeting": "one", "data/a": "a1", "data/only1": "x", "data/sub/deep": "d",
	})
	// A built layer hides files below it with OCI whiteouts.
	e.buildLayer("l2", map[string]string{
		"etc/greeting": "two", "data/.wh.only1": "", "data/sub/.wh..wh..opq": "", "data/sub/new": "n",
		"etc/.wh.group": "",
	})
	if l1.GetDigest() == "" || l1.GetFiles() == 0 || l1.GetBlobSizeBytes() == 0 {
		t.Fatalf("layer %v", l1)
	}
	ls, err := e.m.ListLayers(ctx, &warrenv1.ListLayersRequest{})
	if err != nil || len(ls.GetLayers()) != 2 || ls.GetLayers()[0].GetName() != "l1" || ls.GetLayers()[1].GetName() != "l2" {
		t.Fatalf("list layers %v %v", ls, err)
	}

	// l2 on top: it shadows and hides what l1 and the image have.
	sb := e.create(&warrenv1.CreateRequest{Id: "up", Layers: []string{"l1", "l2"}})
	if !slices.Equal(sb.GetLayers(), []string{"l1", "l2"}) {
		t.Fatalf("sandbox layers %v", sb.GetLayers())
	}
	got := e.out("up", "cat /etc/greeting; echo; cat /data/a; echo; ls /data; ls /data/sub; test -e /etc/group || echo nogroup; test -e /etc/passwd && echo passwd")
	want := "two\na1\na\nsub\nnew\nnogroup\npasswd\n"
	if got != want {
		t.Fatalf("l1 then l2:\n%s\nwant\n%s", got, want)
	}
	// l1 on top: its files win, l2's whiteouts only hide the image's.
	e.create(&warrenv1.CreateRequest{Id: "down", Layers: []string{"l2", "l1"}})
	got = e.out("down", "cat /etc/greeting; echo; ls /data; ls /data/sub; test -e /etc/group || echo nogroup")
	want = "one\na\nonly1\nsub\ndeep\nnew\nnogroup\n"
	if got != want {
		t.Fatalf("l2 then l1:\n%s\nwant\n%s", got, want)
	}
	// A layer by digest.
	e.create(&warrenv1.CreateRequest{Id: "bydigest", Layers: []string{l1.GetDigest()}})
	if got := e.out("bydigest", "cat /etc/greeting"); got != "one" {
		t.Fatalf("layer by digest: %q", got)
	}

	// Bad requests.
	_, err = e.m.Create(ctx, &warrenv1.CreateRequest{Image: "busybox", Layers: []string{"nope"}})
	wantCat(t, err, errdefs.NotFound, "nope")
	_, err = e.m.Create(ctx, &warrenv1.CreateRequest{Image: "busybox", Layers: []string{"Bad Name"}})
	wantCat(t, err, errdefs.Invalid, "invalid layer name")
	many := make([]string, MaxExtraLayers+1)
	for i := range many {
		many[i] = "l1"
	}
	_, err = e.m.Create(ctx, &warrenv1.CreateRequest{Image: "busybox", Layers: many})
	wantCat(t, err, errdefs.Invalid, "too many layers")
	if _, err := e.m.BuildLayer(ctx, &warrenv1.BuildLayerRequest{Name: "x", Path: "relative"}); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("relative build path: %v", err)
	}
	if _, err := e.m.BuildLayer(ctx, &warrenv1.BuildLayerRequest{Name: "sha256:" + strings.Repeat("a", 64), Path: e.dir}); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("digest as a layer name: %v", err)
	}

	// A layer in use cannot be removed; a dead sandbox does not hold it.
	_, err = e.m.RemoveLayer(ctx, &warrenv1.RemoveLayerRequest{Name: "l1"})
	wantCat(t, err, errdefs.Conflict, "used by sandbox")
	_, err = e.m.RemoveLayer(ctx, &warrenv1.RemoveLayerRequest{Name: "nope"})
	wantCat(t, err, errdefs.NotFound, "nope")
	for _, id := range []string{"up", "down"} {
		if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.m.RemoveLayer(ctx, &warrenv1.RemoveLayerRequest{Name: "l2"}); err != nil {
		t.Fatal(err)
	}
	killInit(t, e.m, "bydigest")
	eventually(t, 10*time.Second, "death", func() bool {
		sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "bydigest"})
		return sb.GetState() == stateStopped
	})
	if _, err := e.m.RemoveLayer(ctx, &warrenv1.RemoveLayerRequest{Name: "l1"}); err != nil {
		t.Fatal(err)
	}
	if ls, _ := e.m.ListLayers(ctx, &warrenv1.ListLayersRequest{}); len(ls.GetLayers()) != 0 {
		t.Fatalf("layers left: %v", ls)
	}
	_, err = e.m.Create(ctx, &warrenv1.CreateRequest{Image: "busybox", Layers: []string{"l1"}})
	wantCat(t, err, errdefs.NotFound, "l1")
}

// treeEntry is what a sandbox's tree shows of one path.
type treeEntry struct {
	typ       byte
	mode      int64
	uid, gid  int
	mtime     time.Time
	link, sum string
	xattrs    string
}

// sandboxTree reads a sandbox's root filesystem through TarOut, top-level
// entry by entry, leaving out the mounts of /dev, /proc and /sys.
// Hardlinks become regular files with their target's content (EROFS
// layers store them as copies).
func (e *env) sandboxTree(id string) map[string]treeEntry {
	e.t.Helper()
	ctx := ctxT(e.t)
	top, err := e.m.ListFiles(ctx, &warrenv1.ListFilesRequest{SandboxId: id, Path: "/"})
	if err != nil {
		e.t.Fatalf("list / of %s: %v", id, err)
	}
	out := map[string]treeEntry{}
	for _, fi := range top.GetFiles() {
		name := fi.GetName()
		if name == "dev" || name == "proc" || name == "sys" {
			continue
		}
		var buf bytes.Buffer
		if err := e.m.TarOut(ctx, id, "/"+name, &buf, sandboxfs.TarOptions{}); err != nil {
			e.t.Fatalf("tar out %s:/%s: %v", id, name, err)
		}
		for h, data := range testutil.TarEntries(e.t, &buf) {
			// A directory's entries are relative to it; a file is its
			// base name.
			p := name
			if fi.GetIsDir() && h.Name != "./" {
				p = name + "/" + h.Name
			}
			body, _ := io.ReadAll(data)
			sum := sha256.Sum256(body)
			var xs []string
			for k, v := range h.PAXRecords {
				if strings.HasPrefix(k, "SCHILY.xattr.") {
					xs = append(xs, k+"="+v)
				}
			}
			sort.Strings(xs)
			te := treeEntry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, mtime: h.ModTime, link: h.Linkname, sum: hex.EncodeToString(sum[:]), xattrs: strings.Join(xs, ",")}
			if h.Typeflag == tar.TypeLink {
				target := out[name+"/"+h.Linkname]
				te.typ, te.link, te.sum = tar.TypeReg, "", target.sum
			}
			out[p] = te
		}
	}
	return out
}

// withoutEtcFiles drops the /etc files every sandbox gets of its own
// (etcfiles): they differ between two sandboxes by design.
func withoutEtcFiles(t *testing.T, tree map[string]treeEntry) map[string]treeEntry {
	t.Helper()
	for _, name := range etcfiles.Names {
		if _, ok := tree["etc/"+name]; !ok {
			t.Fatalf("sandbox has no /etc/%s", name)
		}
		delete(tree, "etc/"+name)
	}
	return tree
}

func compareTrees(t *testing.T, want, got map[string]treeEntry) {
	t.Helper()
	var diffs []string
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			diffs = append(diffs, "missing "+p)
		case g != w:
			diffs = append(diffs, fmt.Sprintf("%s: want %+v, got %+v", p, w, g))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, "extra "+p)
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		if len(diffs) > 20 {
			diffs = append(diffs[:20], "...")
		}
		t.Fatalf("trees differ:\n%s", strings.Join(diffs, "\n"))
	}
	if len(want) < 50 {
		t.Fatalf("tree too small to mean anything: %d entries", len(want))
	}
}

func TestCommitRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "src"})
	// Files, changed modes and owners, symlinks, hardlinks, deleted base
	// files (whiteouts) and a base directory deleted and made again
	// (opaque).
	e.out("src", `set -e
mkdir -p /work/dir/deep
echo hello > /work/dir/deep/file
head -c 50000 /dev/urandom > /work/big
ln -s ../work/big /work/link
ln /work/big /work/hard
chmod 4750 /work/big
chown 1000:1001 /work/dir
echo more >> /etc/passwd
rm /etc/group
rm -rf /sbin
mkdir /sbin
echo s > /sbin/only
rm /bin/vi
touch -t 202001010000.00 /work/dir/deep/file
`)
	// The commit freezes the sandbox's processes and thaws them.
	s, _ := e.m.lookup("src")
	s.mu.Lock()
	c := s.sb.(backend.Committer)
	s.mu.Unlock()
	frozen := func() bool {
		t.Helper()
		if m := cgroups.Mode(); m == "v2" || m == "hybrid" {
			dir := filepath.Join(cgroups.Root, e.opts.CgroupParent, "src")
			if m == "hybrid" {
				dir = filepath.Join(cgroups.Root, "unified", e.opts.CgroupParent, "src")
			}
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
			if err != nil {
				t.Fatal(err)
			}
			return strings.Contains(string(b), "frozen 1")
		}
		b, err := os.ReadFile(filepath.Join(cgroups.Root, "freezer", e.opts.CgroupParent, "src", "freezer.state"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b)) == "FROZEN"
	}
	thaw, err := c.Freeze(ctx)
	if err != nil || !frozen() {
		t.Fatalf("freeze: %v, frozen %v", err, frozen())
	}
	if err := thaw(); err != nil || frozen() {
		t.Fatalf("thaw: %v, frozen %v", err, frozen())
	}

	// A name that marks whiteouts cannot be committed.
	e.out("src", "touch /tmp/.wh.bad")
	_, err = e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "src", Name: "snap"})
	wantCat(t, err, errdefs.Invalid, ".wh.bad")
	if frozen() {
		t.Fatal("a failed commit left the sandbox frozen")
	}
	e.out("src", "rm /tmp/.wh.bad")

	// Kept setuid bits, so that the trees compare equal (the default
	// strips them: below).
	l, err := e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "src", Name: "snap", KeepSetuid: true})
	if err != nil {
		t.Fatal(err)
	}
	if l.GetName() != "snap" || l.GetDigest() == "" || l.GetFiles() == 0 || !l.GetSetuidKept() || l.GetSetuidStripped() != 0 {
		t.Fatalf("layer %v", l)
	}
	// The sandbox runs on, thawed.
	if got := e.out("src", "echo alive"); got != "alive\n" {
		t.Fatalf("after commit: %q", got)
	}
	want := e.sandboxTree("src")
	if _, ok := want["etc/group"]; ok {
		t.Fatal("rm /etc/group did not take")
	}

	// The base plus the committed layer is the same tree, but for the
	// /etc files each sandbox gets of its own (etcfiles), which the
	// commit left out.
	e.create(&warrenv1.CreateRequest{Id: "copy", Layers: []string{"snap"}})
	compareTrees(t, withoutEtcFiles(t, want), withoutEtcFiles(t, e.sandboxTree("copy")))
	if got := e.out("copy", "ls /sbin; cat /work/dir/deep/file; test -e /etc/group || echo nogroup; test -e /bin/vi || echo novi"); got != "only\nhello\nnogroup\nnovi\n" {
		t.Fatalf("copy: %q", got)
	}

	// Committing a sandbox that has layers stacks again: a whiteout in the
	// second layer hides a file of the first.
	e.out("copy", "rm /work/dir/deep/file; rm /sbin/only; echo v2 > /work/v2")
	if _, err := e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "copy", Name: "snap2"}); err != nil {
		t.Fatal(err)
	}
	want2 := e.sandboxTree("copy")
	e.create(&warrenv1.CreateRequest{Id: "copy2", Layers: []string{"snap", "snap2"}})
	compareTrees(t, withoutEtcFiles(t, want2), withoutEtcFiles(t, e.sandboxTree("copy2")))

	// Committing over an existing name replaces the layer.
	l3, err := e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "src", Name: "snap2", KeepSetuid: true})
	if err != nil || l3.GetDigest() != l.GetDigest() {
		t.Fatalf("recommit: %v %v (the same tree gives the same blob)", l3, err)
	}
	// By default the setuid bit of /work/big (two names) goes.
	l4, err := e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "src", Name: "stripped"})
	if err != nil || l4.GetDigest() == l.GetDigest() || l4.GetSetuidKept() || l4.GetSetuidStripped() != 2 {
		t.Fatalf("default commit: %v %v, want 2 entries stripped", l4, err)
	}
	e.create(&warrenv1.CreateRequest{Id: "stripped", Layers: []string{"stripped"}})
	if got := e.out("stripped", "stat -c %a /work/big /work/hard"); got != "750\n750\n" {
		t.Fatalf("modes in a sandbox of the default commit: %q", got)
	}

	// Bad requests.
	_, err = e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "nope", Name: "x"})
	wantCat(t, err, errdefs.NotFound, "nope")
	_, err = e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "src", Name: "Bad"})
	wantCat(t, err, errdefs.Invalid, "invalid layer name")
	killInit(t, e.m, "copy2")
	eventually(t, 10*time.Second, "death", func() bool {
		sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "copy2"})
		return sb.GetState() == stateStopped
	})
	_, err = e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "copy2", Name: "x"})
	wantCat(t, err, errdefs.Conflict, "STOPPED")
}

func TestCommitDuringDelete(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "big"})
	// Enough data that the commit is still running when the delete comes.
	e.out("big", "dd if=/dev/urandom of=/big bs=1M count=48 2>/dev/null")
	done := make(chan error, 1)
	go func() {
		_, err := e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "big", Name: "big"})
		done <- err
	}()
	time.Sleep(30 * time.Millisecond)
	start := time.Now()
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "big"}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("delete waited %v for the commit", d)
	}
	err := <-done
	// Either it finished first, or it was stopped by the deletion.
	if err != nil && errdefs.CategoryOf(err) != errdefs.Conflict && errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("commit racing a delete: %v", err)
	}
	t.Logf("commit: %v", err)
}

func TestImageStatsResidency(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	img, err := e.images.Get("busybox")
	if err != nil {
		t.Fatal(err)
	}
	// Drop the blob from the page cache: the import just wrote it.
	bp, err := e.images.BlobPath(img.Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(bp)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_ = unix.Fdatasync(int(f.Fd()))
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	stat := func() *warrenv1.LayerStat {
		t.Helper()
		st, err := e.m.ImageStats(ctx, &warrenv1.ImageStatsRequest{Names: []string{"busybox"}})
		if err != nil || len(st.GetLayers()) != 1 {
			t.Fatalf("stats %v %v", st, err)
		}
		return st.GetLayers()[0]
	}
	before := stat()
	if before.GetFormat() != image.FormatEROFS || before.GetOwner() != "busybox" || before.GetSize() == 0 || before.GetMounted() {
		t.Fatalf("before: %v", before)
	}
	e.create(&warrenv1.CreateRequest{Id: "reader"})
	e.out("reader", "cat /bin/busybox > /dev/null")
	fi, err := os.Stat(busyboxRoot(t) + "/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	after := stat()
	t.Logf("resident %d -> %d of %d (busybox %d)", before.GetResident(), after.GetResident(), after.GetSize(), fi.Size())
	if after.GetResident() < before.GetResident()+fi.Size()/2 || after.GetResident() > after.GetSize() {
		t.Fatalf("reading busybox did not show: %d -> %d", before.GetResident(), after.GetResident())
	}
	if !after.GetMounted() || after.GetRefs() != 1 || after.GetDigest() != img.Layers[0] {
		t.Fatalf("after: %v", after)
	}

	// All images and layers; unknown names.
	e.buildLayer("tools", map[string]string{"opt/tool": "t"})
	all, err := e.m.ImageStats(ctx, &warrenv1.ImageStatsRequest{})
	if err != nil || len(all.GetLayers()) != 2 || all.GetLayers()[1].GetOwner() != "layer:tools" {
		t.Fatalf("all stats %v %v", all, err)
	}
	_, err = e.m.ImageStats(ctx, &warrenv1.ImageStatsRequest{Names: []string{"nope"}})
	wantCat(t, err, errdefs.NotFound, "nope")

	// Verify: all blobs, one image, and a corrupt blob.
	vs, err := e.m.VerifyImage(ctx, &warrenv1.VerifyImageRequest{})
	if err != nil || len(vs.GetLayers()) != 2 || !vs.GetLayers()[0].GetOk() || !vs.GetLayers()[1].GetOk() {
		t.Fatalf("verify all %v %v", vs, err)
	}
	nl, _ := e.images.GetLayer("tools")
	lp, _ := e.images.BlobPath(nl.Digest)
	if err := os.Chmod(lp, 0o644); err != nil {
		t.Fatal(err)
	}
	wf, err := os.OpenFile(lp, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wf.WriteAt([]byte("corrupt"), 100); err != nil {
		t.Fatal(err)
	}
	wf.Close()
	vs, err = e.m.VerifyImage(ctx, &warrenv1.VerifyImageRequest{Names: []string{"busybox", "layer:tools"}})
	if err != nil || len(vs.GetLayers()) != 2 || !vs.GetLayers()[0].GetOk() || vs.GetLayers()[1].GetOk() ||
		vs.GetLayers()[1].GetOwner() != "layer:tools" || !strings.Contains(vs.GetLayers()[1].GetError(), "corrupt") {
		t.Fatalf("verify %v %v", vs, err)
	}
}

// pushImage pushes a two-layer image to an in-process registry: the
// busybox root, then a layer adding /app/hello and deleting /etc/group.
func pushImage(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	var base bytes.Buffer
	if err := tarx.Create(context.Background(), busyboxRoot(t), &base, "/"); err != nil {
		t.Fatal(err)
	}
	var top bytes.Buffer
	tw := tar.NewWriter(&top)
	for _, h := range []*tar.Header{
		{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "app/hello", Typeflag: tar.TypeReg, Mode: 0o755, Size: 6},
		{Name: "etc/.wh.group", Typeflag: tar.TypeReg, Mode: 0o644},
	} {
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("hello\n"))
		}
	}
	tw.Close()
	var layers []v1.Layer
	for _, b := range [][]byte{base.Bytes(), top.Bytes()} {
		data := b
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: []string{"PATH=/bin:/sbin", "FOO=bar", "X=image"}, Cmd: []string{"/bin/sh"}, WorkingDir: "/app/work", User: "1000:1001"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/app:v1"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

func TestPullImage(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	ref := pushImage(t)
	var events []*warrenv1.PullImageEvent
	err := e.m.PullImage(ctx, &warrenv1.PullImageRequest{Ref: ref, Name: "app"}, func(ev *warrenv1.PullImageEvent) error {
		events = append(events, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	phases := map[string]int{}
	statuses := map[string]int{}
	for _, ev := range events {
		phases[ev.GetPhase()]++
		statuses[ev.GetStatus()]++
		if ev.GetPhase() == "layer" && (ev.GetLayers() != 2 || ev.GetDigest() == "") {
			t.Fatalf("layer event %v", ev)
		}
	}
	last := events[len(events)-1]
	img := last.GetImage()
	// The base layer is the busybox image's, already stored: it is not
	// downloaded.
	if phases["resolve"] != 1 || phases["record"] != 1 || phases["done"] != 1 || last.GetPhase() != "done" ||
		statuses["done"] != 1 || statuses["exists"] != 1 || statuses["downloading"] < 1 || statuses["converting"] < 1 {
		t.Fatalf("events: phases %v statuses %v", phases, statuses)
	}
	if img.GetName() != "app" || len(img.GetLayers()) != 2 || len(img.GetDiffIds()) != 2 || !strings.Contains(img.GetSource(), "@sha256:") ||
		img.GetWorkingDir() != "/app/work" || len(img.GetEnv()) != 3 || img.GetCmd()[0] != "/bin/sh" || img.GetPlatform() != "linux/"+runtime.GOARCH {
		t.Fatalf("image %v", img)
	}
	if got, err := e.m.GetImage(ctx, &warrenv1.GetImageRequest{Name: "app"}); err != nil || got.GetSource() != img.GetSource() {
		t.Fatalf("get %v %v", got, err)
	}

	// Its config gives the sandbox's env (the request's wins) and workdir
	// (created).
	sb := e.create(&warrenv1.CreateRequest{Id: "app", Image: "app", Env: map[string]string{"X": "req"}})
	if sb.GetEnv()["FOO"] != "bar" || sb.GetEnv()["X"] != "req" || sb.GetWorkdir() != "/app/work" {
		t.Fatalf("sandbox %v", sb)
	}
	if got := e.out("app", "echo $FOO $X; pwd; cat /app/hello; test -e /etc/group || echo nogroup"); got != "bar req\n/app/work\nhello\nnogroup\n" {
		t.Fatalf("in the sandbox: %q", got)
	}
	e.create(&warrenv1.CreateRequest{Id: "app2", Image: "app", Workdir: "/tmp"})
	if got := e.out("app2", "pwd"); got != "/tmp\n" {
		t.Fatalf("workdir of the request: %q", got)
	}

	// Its user is the default of execs, as with `docker run`; an exec or
	// the create request may name another.
	if sb.GetUser() != "1000:1001" {
		t.Fatalf("sandbox user %q, want the image's 1000:1001", sb.GetUser())
	}
	if got := e.out("app", "/usr/bin/id -u; /usr/bin/id -g"); got != "1000\n1001\n" {
		t.Fatalf("exec as the image's user: %q", got)
	}
	if r := e.exec(&warrenv1.ExecRequest{SandboxId: "app", Argv: []string{"/usr/bin/id", "-u"}, User: "root"}); string(r.GetStdout()) != "0\n" {
		t.Fatalf("exec as root: %v", r)
	}
	e.create(&warrenv1.CreateRequest{Id: "app3", Image: "app", User: "0"})
	if got := e.out("app3", "/usr/bin/id -u"); got != "0\n" {
		t.Fatalf("user of the create request: %q", got)
	}
	if _, err := e.m.Create(ctx, &warrenv1.CreateRequest{Image: "app", User: "a:b:c"}); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("create with a malformed user: %v", err)
	}

	// Pulling again fetches nothing.
	events = nil
	if err := e.m.PullImage(ctx, &warrenv1.PullImageRequest{Ref: ref, Name: "app-again"}, func(ev *warrenv1.PullImageEvent) error {
		events = append(events, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if ev.GetStatus() == "downloading" || ev.GetStatus() == "converting" {
			t.Fatalf("second pull fetched a layer: %v", ev)
		}
	}

	// Errors: no reference, an unknown one, and a client that goes away.
	err = e.m.PullImage(ctx, &warrenv1.PullImageRequest{}, func(*warrenv1.PullImageEvent) error { return nil })
	wantCat(t, err, errdefs.Invalid, "reference")
	err = e.m.PullImage(ctx, &warrenv1.PullImageRequest{Ref: strings.Replace(ref, "app:v1", "nope:v1", 1)}, func(*warrenv1.PullImageEvent) error { return nil })
	wantCat(t, err, errdefs.NotFound, "")
	err = e.m.PullImage(ctx, &warrenv1.PullImageRequest{Ref: ref, Name: "gone"}, func(*warrenv1.PullImageEvent) error { return io.ErrClosedPipe })
	if err == nil {
		t.Fatal("pull with a failing stream succeeded")
	}
	if _, err := e.m.GetImage(ctx, &warrenv1.GetImageRequest{Name: "gone"}); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("an interrupted pull left an image: %v", err)
	}
}

// mountID returns the mount id of the mount at mp ("" if none).
func mountID(t *testing.T, mp string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == mp {
			return f[0]
		}
	}
	return ""
}

func TestRestartReusesLayerMounts(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	l1 := e.buildLayer("l1", map[string]string{"one": "1"})
	l2 := e.buildLayer("l2", map[string]string{"two": "2"})
	e.create(&warrenv1.CreateRequest{Id: "keep", Layers: []string{"l1"}})
	e.create(&warrenv1.CreateRequest{Id: "gone", Layers: []string{"l2"}})
	base, _ := e.images.Get("busybox")
	mdir := e.images.Mounts().Dir()
	mp := func(digest string) string { return filepath.Join(mdir, strings.TrimPrefix(digest, "sha256:")) }
	id1, id2, idBase := mountID(t, mp(l1.GetDigest())), mountID(t, mp(l2.GetDigest())), mountID(t, mp(base.Layers[0]))
	if id1 == "" || id2 == "" || idBase == "" {
		t.Fatalf("layers not mounted: %q %q %q", id1, id2, idBase)
	}
	s, _ := e.m.lookup("gone")
	s.mu.Lock()
	goneState := s.backendState
	s.mu.Unlock()

	// The daemon stops; one sandbox dies meanwhile.
	e.stop()
	if mountID(t, mp(l1.GetDigest())) != id1 || mountID(t, mp(l2.GetDigest())) != id2 {
		t.Fatal("the layers of running sandboxes were unmounted at shutdown")
	}
	killPid(t, goneState)
	e.start()

	// The adopted sandbox took its mounts back; the dead one's was
	// unmounted by the garbage collection after adoption.
	if got := mountID(t, mp(l1.GetDigest())); got != id1 {
		t.Fatalf("l1 remounted: mount %q, was %q", got, id1)
	}
	if got := mountID(t, mp(base.Layers[0])); got != idBase {
		t.Fatalf("base remounted: mount %q, was %q", got, idBase)
	}
	if got := mountID(t, mp(l2.GetDigest())); got != "" {
		t.Fatalf("unused layer l2 still mounted (%s)", got)
	}
	if got := e.out("keep", "cat /one"); got != "1" {
		t.Fatalf("keep: %q", got)
	}
	if sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "gone"}); sb.GetState() != stateStopped {
		t.Fatalf("gone: %v", sb)
	}
	// A new sandbox shares the adopted mount.
	e.create(&warrenv1.CreateRequest{Id: "new", Layers: []string{"l1"}})
	if got := mountID(t, mp(l1.GetDigest())); got != id1 {
		t.Fatalf("l1 mounted again for a new sandbox: %q, was %q", got, id1)
	}
	if refs := e.images.Mounts().Refs(strings.TrimPrefix(l1.GetDigest(), "sha256:")); refs != 2 {
		t.Fatalf("l1 refs %d, want 2", refs)
	}
	// The dead sandbox's layer can go; the adopted one's cannot.
	if _, err := e.m.RemoveLayer(ctx, &warrenv1.RemoveLayerRequest{Name: "l2"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.RemoveLayer(ctx, &warrenv1.RemoveLayerRequest{Name: "l1"})
	wantCat(t, err, errdefs.Conflict, "used by sandbox")
}

// TestLegacyStore runs sandboxes of an image whose layer is a directory
// (a store written before EROFS layers), with EROFS layers on it.
func TestLegacyStore(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.stop()
	legacy, err := image.Open(filepath.Join(e.dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	old, err := legacy.ImportDir(ctx, "old", busyboxRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	lp := filepath.Join(e.dir, "images", "layers", "sha256-"+strings.TrimPrefix(old.Layers[0], "sha256:"), "fs")
	if _, err := os.Stat(lp); err != nil {
		t.Fatalf("legacy layer directory: %v", err)
	}
	e.start()
	e.buildLayer("top", map[string]string{"top": "t"})
	e.create(&warrenv1.CreateRequest{Id: "legacy", Image: "old", Layers: []string{"top"}})
	if got := e.out("legacy", "cat /top; echo x > /new"); got != "t" {
		t.Fatalf("legacy: %q", got)
	}
	st, err := e.m.ImageStats(ctx, &warrenv1.ImageStatsRequest{Names: []string{"old"}})
	if err != nil || len(st.GetLayers()) != 1 || st.GetLayers()[0].GetFormat() != image.FormatDir {
		t.Fatalf("stats of a legacy image: %v %v", st, err)
	}
	if _, err := e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "legacy", Name: "c"}); err != nil {
		t.Fatal(err)
	}
	e.create(&warrenv1.CreateRequest{Id: "legacy2", Image: "old", Layers: []string{"top", "c"}})
	if got := e.out("legacy2", "cat /top /new"); got != "tx\n" {
		t.Fatalf("legacy2: %q", got)
	}
	// A restart adopts them; removing the image collects its directory
	// once no sandbox uses it.
	e.stop()
	e.start()
	if got := e.out("legacy", "cat /top"); got != "t" {
		t.Fatalf("after restart: %q", got)
	}
	for _, id := range []string{"legacy", "legacy2"} {
		if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.m.RemoveImage(ctx, &warrenv1.RemoveImageRequest{Name: "old"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lp); !os.IsNotExist(err) {
		t.Fatalf("legacy layer directory not collected: %v", err)
	}
}

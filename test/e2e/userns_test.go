package e2e

// The user-namespace mode (issue #11): root inside a sandbox is an
// unprivileged host id, the image looks as it does without the mode, and
// file calls, downloads and commit see the sandbox's ids, not the host's.

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// usernsIDs gives each env of this process its own host id range, as
// each daemon on a node needs.
func usernsIDs() string {
	return fmt.Sprintf("%d:%d", 2_500_000_000+uint64(envSeq.Load()%64)*16*65536, 16*65536)
}

// hostUID is the real uid of a host process, from its status.
func hostUID(t *testing.T, pid int) uint32 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(rest)
			n, _ := strconv.ParseUint(f[0], 10, 32)
			return uint32(n)
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return 0
}

func ownerOf(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

// TestUserNamespaceRootIsUnprivilegedOnTheHost: a sandbox created with
// user_namespace runs as root inside (uid 0, its files and /dev root's)
// and as its own unprivileged range outside: its processes' host uid, the
// owners its writable layer stores. The daemon's file calls create files
// owned by root inside, downloads show the sandbox's ids, a commit stores
// them as the sandbox saw them (a sandbox without the mode sees the same
// owners), and the mapping survives a daemon restart. Root inside can
// still bind port 80 and cannot make a user namespace of its own.
func TestUserNamespaceRootIsUnprivilegedOnTheHost(t *testing.T) {
	e := newEnv(t, envOptions{serveArgs: []string{"--userns-ids", usernsIDs()}})
	yes := true
	sb := e.create(&warrenv1.CreateRequest{Image: imageName, Id: "mapped", UserNamespace: &yes})
	if !sb.UserNamespace || sb.UserIdBase == 0 {
		t.Fatalf("sandbox record: user_namespace %v, base %d", sb.UserNamespace, sb.UserIdBase)
	}
	base := sb.UserIdBase
	if out := e.shOK(sb.Id, "id -u; id -g; cat /proc/self/uid_map /proc/self/gid_map"); strings.Join(strings.Fields(out), " ") !=
		fmt.Sprintf("0 0 0 %d 65536 0 %d 65536", base, base) {
		t.Errorf("ids in the sandbox: %q, want root mapped to %d", out, base)
	}
	if got := hostUID(t, e.initPid(sb.Id)); got != base {
		t.Errorf("the sandbox's PID 1 runs as host uid %d, want %d", got, base)
	}
	// The image and the sandbox's own /dev and /tmp belong to root inside.
	if out := e.shOK(sb.Id, "stat -c '%u:%g %n' /bin/busybox /etc /dev /dev/null /dev/pts/ptmx /dev/shm /"); strings.Count(out, "0:0 ") != 7 {
		t.Errorf("owners in the sandbox:\n%s", out)
	}
	e.shOK(sb.Id, "mkdir /work && touch /work/root-file && touch /work/user-file && chown 1000:1001 /work/user-file")
	upper := filepath.Join(e.stateDir, "sandboxes", sb.Id, "upper")
	if u, g := ownerOf(t, filepath.Join(upper, "work", "root-file")); u != base || g != base {
		t.Errorf("a file root made in the sandbox is host %d:%d, want %d:%d", u, g, base, base)
	}
	if u, g := ownerOf(t, filepath.Join(upper, "work", "user-file")); u != base+1000 || g != base+1001 {
		t.Errorf("a file of uid 1000 in the sandbox is host %d:%d, want %d:%d", u, g, base+1000, base+1001)
	}
	// Root inside holds no capability over the node's namespaces: no
	// user namespace of its own (the filter refuses unshare too), but
	// ports below 1024 bind, as on a machine.
	if r := e.sh(sb.Id, "unshare -U true"); r.ExitCode == 0 {
		t.Errorf("unshare -U in the sandbox succeeded")
	}
	if out := e.shOK(sb.Id, "nc -l -p 80 & sleep 0.3; netstat -ltn; kill %1"); !strings.Contains(out, ":80 ") {
		t.Errorf("root in the sandbox could not listen on port 80:\n%s", out)
	}

	// File calls: what the daemon writes is root's inside.
	ctx := ctxFor(t, 60e9)
	if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: sb.Id, Path: "/api/dir/written", Content: []byte("x"), MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Upload(ctx, sb.Id, "/api/up", tarOf(t, map[string]string{"a/b": "y"})); err != nil {
		t.Fatal(err)
	}
	if out := e.shOK(sb.Id, "stat -c '%u:%g' /api /api/dir /api/dir/written /api/up /api/up/a /api/up/a/b"); strings.Count(out, "0:0") != 6 {
		t.Errorf("owners of what the file API made, in the sandbox:\n%s", out)
	}
	if u, _ := ownerOf(t, filepath.Join(upper, "api", "dir", "written")); u != base {
		t.Errorf("a file the API wrote is host uid %d, want %d", u, base)
	}
	// Downloads show the sandbox's ids.
	rc, err := e.c.Download(ctx, sb.Id, "/work")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{}
	for h := range testutil.TarEntries(t, rc) {
		owners[h.Name] = fmt.Sprintf("%d:%d", h.Uid, h.Gid)
	}
	rc.Close()
	if owners["root-file"] != "0:0" || owners["user-file"] != "1000:1001" {
		t.Errorf("download owners: %v", owners)
	}

	// Commit: the layer holds the ids the sandbox saw.
	if _, err := e.c.CommitSandbox(ctx, sb.Id, "mapped-work"); err != nil {
		t.Fatal(err)
	}
	no := false
	plain := e.create(&warrenv1.CreateRequest{Image: imageName, Layers: []string{"mapped-work"}, UserNamespace: &no})
	if plain.UserNamespace {
		t.Fatalf("sandbox without the mode reports one")
	}
	if out := e.shOK(plain.Id, "cat /proc/self/uid_map; stat -c '%u:%g %n' /work/root-file /work/user-file /api/dir/written"); !strings.Contains(out, "0:0 /work/root-file") ||
		!strings.Contains(out, "1000:1001 /work/user-file") || !strings.Contains(out, "0:0 /api/dir/written") {
		t.Errorf("the committed layer in a sandbox without a user namespace:\n%s", out)
	}

	// A restarted daemon keeps the mapping: its file calls still make
	// root's files, and a new sandbox gets another range.
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	again, err := e.c.Get(ctx, sb.Id)
	if err != nil {
		t.Fatal(err)
	}
	if again.State != warrenv1.SandboxState_SANDBOX_STATE_RUNNING || again.UserIdBase != base {
		t.Fatalf("after a restart: %v base %d", again.State, again.UserIdBase)
	}
	if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: sb.Id, Path: "/after-restart", Content: []byte("z")}); err != nil {
		t.Fatal(err)
	}
	if out := e.shOK(sb.Id, "stat -c %u:%g /after-restart"); out != "0:0\n" {
		t.Errorf("a file the restarted daemon wrote: %q, want 0:0", out)
	}
	other := e.create(&warrenv1.CreateRequest{Image: imageName, UserNamespace: &yes})
	if other.UserIdBase == base || other.UserIdBase == 0 {
		t.Errorf("a second sandbox got base %d (the first has %d)", other.UserIdBase, base)
	}
	if err := e.c.Delete(ctx, sb.Id); err != nil {
		t.Fatal(err)
	}
	e.expectNoResources(sb.Id, "after deleting a user-namespace sandbox")
}

// TestUserNamespaceDefaultFollowsTheImage: with warren serve --userns,
// sandboxes get a user namespace unless the request says otherwise or the
// image has files owned by ids the namespace cannot map (they would show
// as nobody); asking for one on such an image is Invalid, naming the id.
func TestUserNamespaceDefaultFollowsTheImage(t *testing.T) {
	e := newEnv(t, envOptions{serveArgs: []string{"--userns", "--userns-ids", usernsIDs()}})
	if sb := e.create(&warrenv1.CreateRequest{Image: imageName}); !sb.UserNamespace {
		t.Errorf("with --userns a sandbox of busybox has no user namespace")
	}
	no := false
	if sb := e.create(&warrenv1.CreateRequest{Image: imageName, UserNamespace: &no}); sb.UserNamespace {
		t.Errorf("user_namespace false still gave one")
	}
	importVariant(t, e, "highids", func(root string) {
		p := filepath.Join(root, "high")
		if err := os.WriteFile(p, []byte("h"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, 70000, 70000); err != nil {
			t.Fatal(err)
		}
	})
	sb := e.create(&warrenv1.CreateRequest{Image: "highids"})
	if sb.UserNamespace {
		t.Errorf("the node's default gave a user namespace to an image with files of id 70000")
	}
	if out := e.shOK(sb.Id, "stat -c %u /high"); out != "70000\n" {
		t.Errorf("/high owner: %q", out)
	}
	yes := true
	_, err := e.c.Create(ctxFor(t, 30e9), &warrenv1.CreateRequest{Image: "highids", UserNamespace: &yes})
	wantCategory(t, err, client.CategoryInvalid, "user_namespace on an image with id 70000")
	if err != nil && !strings.Contains(err.Error(), "70000") {
		t.Errorf("error does not name the id: %v", err)
	}
}

// tarOf is a tar stream of regular files.
func tarOf(t *testing.T, files map[string]string) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg, Uid: 4242, Gid: 4242}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// TestUserNamespaceAttacksAreRefused: the kernel-facing attacks get the
// same refusals in a user-namespace sandbox as in one without (the filter
// and the bounding set hold either way; the mode is a wall behind them).
func TestUserNamespaceAttacksAreRefused(t *testing.T) {
	e := newEnv(t, envOptions{serveArgs: []string{"--userns", "--userns-ids", usernsIDs()}})
	img := attackImage(t, e)
	sb := e.create(&warrenv1.CreateRequest{Image: img})
	if !sb.UserNamespace {
		t.Fatalf("no user namespace")
	}
	names := make([]string, 0, len(refusals))
	for n := range refusals {
		names = append(names, n)
	}
	got := e.attack(sb.Id, names...)
	for n, want := range refusals {
		if got[n] != want {
			t.Errorf("%s in a user-namespace sandbox: %q, want %s", n, got[n], want)
		}
	}
}

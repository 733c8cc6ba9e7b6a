package e2e

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestDiskFull runs the daemon with its state directory on a 16 MB tmpfs.
// A sandbox that fills it gets ENOSPC; the daemon and the other sandboxes
// keep working; creates on the full disk either work or fail as
// exhausted, never leaving a half-created sandbox. The disk guard is off
// (it would stop the filler: TestAdversarialNodeDiskFillStopsLargestSandbox):
// this is the daemon on a disk something else filled.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{serveArgs: []string{"--disk-reserve", "0"}, beforeStart: stateOnTmpfs("size=16m,mode=0700")})
	ctx := ctxFor(t, 2*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "filler"})
	e.create(&warrenv1.CreateRequest{Id: "other"})
	e.shOK("other", "echo before > /before")

	res, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "filler", Shell: "dd if=/dev/zero of=/big bs=1M count=64"})
	if err != nil {
		t.Fatalf("exec dd: %v", err)
	}
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("dd of 64 MB onto a 16 MB disk: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(e.stateDir, &st); err == nil && st.Bavail > 64 {
		t.Logf("state dir still has %d free blocks", st.Bavail)
	}

	// The daemon keeps working.
	if _, err := e.c.Version(ctx); err != nil {
		t.Errorf("version on a full disk: %v", err)
	}
	if sbs, err := e.c.List(ctx, nil); err != nil || len(sbs) != 2 {
		t.Errorf("list on a full disk: %v %v", sbs, err)
	}
	if got := e.shOK("other", "cat /before; echo still"); got != "before\nstill\n" {
		t.Errorf("other sandbox on a full disk: %q", got)
	}
	if got := e.shOK("filler", "echo alive"); got != "alive\n" {
		t.Errorf("filler on a full disk: %q", got)
	}
	// Writing through the API fails as exhausted, reading works.
	err = e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "other", Path: "/api-big", Content: make([]byte, 4<<20)})
	wantCategory(t, err, client.CategoryExhausted, "write a 4 MB file on a full disk")
	if rd, err := e.c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "other", Path: "/before"}); err != nil || string(rd.Content) != "before\n" {
		t.Errorf("read on a full disk: %v %v", rd, err)
	}

	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "big.bin", Mode: 0o644, Size: 4 << 20})
	// Not zeros: the extraction keeps zero blocks as holes, which a full
	// disk still has room for.
	_, _ = tw.Write(bytes.Repeat([]byte("data"), 1<<20))
	_ = tw.Close()
	err = e.c.Upload(ctx, "other", "/", &tb)
	wantCategory(t, err, client.CategoryExhausted, "upload a 4 MB archive on a full disk")
	// Importing an image on the full disk works or fails as exhausted,
	// and a failed import leaves no image.
	if _, err := e.c.ImportImage(ctx, "bb2", testutil.BusyboxRoot(t)); err != nil {
		wantCategory(t, err, client.CategoryExhausted, "import an image on a full disk")
		if _, err := e.c.GetImage(ctx, "bb2"); !client.IsNotFound(err) {
			t.Errorf("failed import left image bb2: %v", err)
		}
	} else {
		t.Logf("image import on the full disk succeeded")
	}

	// Creates on the full disk: each works or fails as exhausted.
	var created []string
	for i := range 3 {
		id := fmt.Sprintf("full%d", i)
		sb, err := e.c.Create(ctx, &warrenv1.CreateRequest{Id: id, Image: imageName})
		if err == nil {
			if sb.State != stateRunning {
				t.Errorf("create %s on a full disk: %v", id, sb)
			}
			created = append(created, id)
			if got := e.shOK(id, "echo ok"); got != "ok\n" {
				t.Errorf("sandbox %s created on a full disk: %q", id, got)
			}
			continue
		}
		wantCategory(t, err, client.CategoryExhausted, "create "+id+" on a full disk")
		if _, gerr := e.c.Get(ctx, id); !client.IsNotFound(gerr) {
			t.Errorf("failed create left %s behind: get says %v", id, gerr)
		}
		e.expectNoResources(id, "after a failed create on a full disk")
	}
	t.Logf("%d of 3 creates on the full disk succeeded", len(created))
	sbs, err := e.c.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.State != stateRunning {
			t.Errorf("sandbox %s is %v on a full disk", sb.Id, sb.State)
		}
	}

	// A daemon that crashes while the disk is full comes back with every
	// sandbox.
	e.kill9()
	e.start()
	after, err := e.c.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(sbs) {
		t.Errorf("%d sandboxes after a restart on the full disk, want %d", len(after), len(sbs))
	}
	for _, sb := range after {
		if sb.State != stateRunning {
			t.Errorf("sandbox %s is %v after a restart on the full disk (%s)", sb.Id, sb.State, sb.DeadReason)
		}
	}
	if got := e.shOK("other", "cat /before"); got != "before\n" {
		t.Errorf("other after a restart on the full disk: %q", got)
	}

	// Freeing the space makes everything work again.
	e.shOK("filler", "rm -f /big")
	e.create(&warrenv1.CreateRequest{Id: "after"})
	e.shOK("after", "dd if=/dev/zero of=/f bs=1M count=2 2>/dev/null")
	if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "other", Path: "/api-small", Content: []byte("ok")}); err != nil {
		t.Errorf("write after freeing space: %v", err)
	}

	// Deleting works while the disk is full again (the filler, whose
	// layer holds the space, goes last), and leaves no stale records.
	e.shOK("filler", "dd if=/dev/zero of=/big bs=1M count=64 2>/dev/null; true")
	var order []string
	for _, sb := range sbs {
		if sb.Id != "filler" {
			order = append(order, sb.Id)
		}
	}
	for _, id := range append(order, "after", "filler") {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Errorf("delete %s on a full disk: %v", id, err)
		}
	}
	e.expectBaseline("after deleting everything on the small disk")
	// A restart finds no stale records.
	if err := e.stop(); err != nil {
		t.Error(err)
	}
	e.start()
	if sbs, err := e.c.List(ctx, nil); err != nil || len(sbs) != 0 {
		t.Errorf("deleted sandboxes are back after a restart: %v %v", sbs, err)
	}
}

// stateOnTmpfs is a beforeStart that puts the daemon's state directory on
// a tmpfs of its own (mount data: its size, inodes and mode), so that a
// test fills that disk and not the node's; forceClean unmounts it.
func stateOnTmpfs(data string) func(*env) {
	return func(e *env) {
		if err := os.MkdirAll(e.stateDir, 0o700); err != nil {
			e.t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", e.stateDir, "tmpfs", 0, data); err != nil {
			e.t.Fatalf("mount tmpfs: %v", err)
		}
	}
}

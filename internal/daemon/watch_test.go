package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/container"
	"github.com/warrenrl/warren/internal/errdefs"
)

// inotifyFDs counts the daemon's open inotify instances.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// openWatch runs WatchDir in the background; it returns once the watch
// is set (its started event), with the file events and the call's end.
func openWatch(t *testing.T, m *Manager, req *warrenv1.WatchDirRequest) (<-chan *warrenv1.FileEvent, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	evs, done, started := make(chan *warrenv1.FileEvent, 1024), make(chan error, 1), make(chan struct{})
	go func() {
		done <- m.WatchDir(ctx, req, func(ev *warrenv1.WatchDirEvent) error {
			if ev.GetStarted() != nil {
				close(started)
			} else {
				evs <- ev.GetFile()
			}
			return nil
		})
	}()
	select {
	case <-started:
		return evs, done
	case err := <-done:
		t.Fatalf("watch %s: %v", req.GetPath(), err)
	case <-time.After(time.Minute):
		t.Fatalf("watch %s did not start within a minute", req.GetPath())
	}
	return nil, nil
}

// wantEvent waits (a minute at most: CI is loaded) for an event of path
// of type typ, skipping others.
func wantEvent(t *testing.T, evs <-chan *warrenv1.FileEvent, path string, typ warrenv1.FileEventType) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case e := <-evs:
			if e.GetPath() == path && e.GetType() == typ {
				return
			}
		case <-deadline:
			t.Fatalf("no %s event for %s within a minute", typ, path)
		}
	}
}

// wantEnd waits for a watch to end with an error of category c.
func wantEnd(t *testing.T, done <-chan error, c errdefs.Category, what string) {
	t.Helper()
	select {
	case err := <-done:
		if errdefs.CategoryOf(err) != c {
			t.Fatalf("watch ended on %s with %v (%s), want %s", what, err, errdefs.CategoryOf(err), c)
		}
	case <-time.After(time.Minute):
		t.Fatalf("watch did not end within a minute of %s", what)
	}
}

// TestWatchDirSeesSandboxChanges: a WatchDir sees what the sandbox's own
// processes do through its overlay (create, write, chmod, rename, remove),
// follows a directory tree made later, refuses a symlink that leads out
// of the sandbox or onto its /proc, and ends (Unavailable) when the
// sandbox is paused or deleted, with no inotify instance left behind.
func TestWatchDirSeesSandboxChanges(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	before := inotifyFDs(t)
	e.create(&warrenv1.CreateRequest{Id: "watch"})
	host := t.TempDir()
	e.sh("watch", "mkdir -p /work && ln -s "+host+" /work/hostdir && ln -s /proc/1 /work/procroot")

	evs, done := openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: "watch", Path: "/work", Recursive: true})
	e.sh("watch", "echo a > /work/f && chmod 600 /work/f && mv /work/f /work/g && rm /work/g && mkdir -p /work/sub/deep && echo x > /work/sub/deep/h")
	const (
		create = warrenv1.FileEventType_FILE_EVENT_TYPE_CREATE
		write  = warrenv1.FileEventType_FILE_EVENT_TYPE_WRITE
		chmod  = warrenv1.FileEventType_FILE_EVENT_TYPE_CHMOD
		rename = warrenv1.FileEventType_FILE_EVENT_TYPE_RENAME
		remove = warrenv1.FileEventType_FILE_EVENT_TYPE_REMOVE
	)
	wantEvent(t, evs, "f", create)
	wantEvent(t, evs, "f", write)
	wantEvent(t, evs, "f", chmod)
	wantEvent(t, evs, "f", rename)
	wantEvent(t, evs, "g", create)
	wantEvent(t, evs, "g", remove)
	wantEvent(t, evs, "sub", create)
	wantEvent(t, evs, "sub/deep/h", create)
	e.sh("watch", "echo more >> /work/sub/deep/h")
	wantEvent(t, evs, "sub/deep/h", write)

	// The host directory a symlink names is no path of the sandbox; its
	// /proc is never watched.
	_, err := e.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: "watch", Path: "/work/hostdir"})
	if err != nil {
		t.Fatal(err)
	}
	err = e.m.WatchDir(ctx, &warrenv1.WatchDirRequest{SandboxId: "watch", Path: "/work/hostdir"}, func(*warrenv1.WatchDirEvent) error { return nil })
	wantCat(t, err, errdefs.NotFound, "")
	err = e.m.WatchDir(ctx, &warrenv1.WatchDirRequest{SandboxId: "watch", Path: "/work/procroot"}, func(*warrenv1.WatchDirEvent) error { return nil })
	wantCat(t, err, errdefs.PermissionDenied, "")
	// Nothing the host does next to the sandbox's files is reported.
	if err := os.WriteFile(filepath.Join(host, "outside"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	// A file of the image's layer, copied up to the writable layer by
	// the write: the write is seen on the overlay's inode.
	etc, _ := openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: "watch", Path: "/etc"})
	e.sh("watch", "echo x >> /etc/group")
	wantEvent(t, etc, "group", write)

	// A watch of a directory that is removed ends, without error.
	_, subDone := openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: "watch", Path: "/work/sub"})
	e.sh("watch", "rm -rf /work/sub")
	select {
	case err := <-subDone:
		if err != nil {
			t.Fatalf("watch of a removed directory ended with %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the watch of a removed directory did not end")
	}

	// A second sandbox's watch ends when it is paused.
	e.create(&warrenv1.CreateRequest{Id: "watch2"})
	_, done2 := openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: "watch2", Path: "/tmp"})
	if _, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "watch2"}); err != nil {
		t.Fatal(err)
	}
	wantEnd(t, done2, errdefs.Unavailable, "a pause")

	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "watch"}); err != nil {
		t.Fatal(err)
	}
	wantEnd(t, done, errdefs.Unavailable, "a delete")
	for len(evs) > 0 {
		if ev := <-evs; ev.GetPath() == "hostdir/outside" || ev.GetPath() == "outside" {
			t.Fatalf("event from the host: %v", ev)
		}
	}
	if got := inotifyFDs(t); got != before {
		t.Fatalf("inotify instances: %d before, %d after the watches ended", before, got)
	}
}

// TestWatchDirBounded: a sandbox holds at most MaxWatchesPerSandbox open
// watches and the node MaxWatchesPerNode (Exhausted beyond); a closed one
// frees its place, and deleted sandboxes leave none counted.
func TestWatchDirBounded(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "many"})
	cancels := make([]context.CancelFunc, 0, MaxWatchesPerSandbox)
	dones := make([]chan error, 0, MaxWatchesPerSandbox)
	for range MaxWatchesPerSandbox {
		ctx, cancel := context.WithCancel(context.Background())
		started, done := make(chan struct{}), make(chan error, 1)
		go func() {
			done <- e.m.WatchDir(ctx, &warrenv1.WatchDirRequest{SandboxId: "many", Path: "/tmp"}, func(ev *warrenv1.WatchDirEvent) error {
				if ev.GetStarted() != nil {
					close(started)
				}
				return nil
			})
		}()
		select {
		case <-started:
		case err := <-done:
			t.Fatal(err)
		}
		cancels, dones = append(cancels, cancel), append(dones, done)
	}
	err := e.m.WatchDir(ctxT(t), &warrenv1.WatchDirRequest{SandboxId: "many", Path: "/tmp"}, func(*warrenv1.WatchDirEvent) error { return nil })
	wantCat(t, err, errdefs.Exhausted, "directory watches")
	cancels[0]()
	<-dones[0]
	_, done := openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: "many", Path: "/tmp"})
	for _, c := range cancels[1:] {
		c()
	}
	for _, d := range dones[1:] {
		<-d
	}
	if _, err := e.m.Delete(ctxT(t), &warrenv1.DeleteRequest{Id: "many"}); err != nil {
		t.Fatal(err)
	}
	wantEnd(t, done, errdefs.Unavailable, "a delete")

	// The node's bound holds across sandboxes.
	full := MaxWatchesPerNode / MaxWatchesPerSandbox // sandboxes with every watch they may hold
	for i := range full + 1 {
		id := "node" + strconv.Itoa(i)
		e.create(&warrenv1.CreateRequest{Id: id})
		for j := 0; i < full && j < MaxWatchesPerSandbox; j++ {
			openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: id, Path: "/tmp"})
		}
	}
	last := "node" + strconv.Itoa(full)
	err = e.m.WatchDir(ctxT(t), &warrenv1.WatchDirRequest{SandboxId: last, Path: "/tmp"}, func(*warrenv1.WatchDirEvent) error { return nil })
	wantCat(t, err, errdefs.Exhausted, "the node has")
	for i := range full + 1 {
		if _, err := e.m.Delete(ctxT(t), &warrenv1.DeleteRequest{Id: "node" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(time.Minute); e.m.watchN.Load() != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := e.m.watchN.Load(); n != 0 {
		t.Fatalf("%d watches still counted on the node", n)
	}
}

// TestSandboxStats: SandboxStats reports the sandbox's own CPU time
// (growing with work done inside), memory within its limit, its CPU
// quota as a count, and the filesystem of its writable layer; a sandbox
// that does not run is refused.
func TestSandboxStats(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "stats", Resources: &warrenv1.Resources{CpuMillis: 1500, MemoryBytes: 256 << 20}})
	a, err := e.m.SandboxStats(ctx, &warrenv1.SandboxStatsRequest{SandboxId: "stats"})
	if err != nil {
		t.Fatal(err)
	}
	e.sh("stats", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; dd if=/dev/zero of=/tmp/f bs=1M count=8 2>/dev/null")
	b, err := e.m.SandboxStats(ctx, &warrenv1.SandboxStatsRequest{SandboxId: "stats"})
	if err != nil {
		t.Fatal(err)
	}
	if b.GetCpuUsageNs() <= a.GetCpuUsageNs() || b.GetSampledAtUnixMs() < a.GetSampledAtUnixMs() {
		t.Errorf("CPU time did not grow with work: %d then %d ns", a.GetCpuUsageNs(), b.GetCpuUsageNs())
	}
	if b.GetCpuCount() != 2 || b.GetMemoryLimitBytes() != 256<<20 {
		t.Errorf("cpu count %d (want 2 for 1.5 cores), memory limit %d", b.GetCpuCount(), b.GetMemoryLimitBytes())
	}
	if b.GetMemoryBytes() == 0 || b.GetMemoryBytes() > 256<<20 || b.GetMemoryCacheBytes() > b.GetMemoryBytes() {
		t.Errorf("memory %d, of which cache %d", b.GetMemoryBytes(), b.GetMemoryCacheBytes())
	}
	if b.GetDiskBytes() == 0 || b.GetDiskUsedBytes() == 0 || b.GetDiskUsedBytes() > b.GetDiskBytes() {
		t.Errorf("disk %d used of %d", b.GetDiskUsedBytes(), b.GetDiskBytes())
	}
	if _, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "stats"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.m.SandboxStats(ctx, &warrenv1.SandboxStatsRequest{SandboxId: "stats"})
	wantCat(t, err, errdefs.Conflict, "PAUSED")
}

// TestWatchDirEndsOnHibernate: an open watch does not keep a sandbox
// from hibernating; it ends (Unavailable), and once the sandbox is
// resumed a new watch sees its changes again.
func TestWatchDirEndsOnHibernate(t *testing.T) {
	requireCRIU(t)
	e := newEnv(t)
	ctx := ctxT(t)
	before := inotifyFDs(t)
	e.create(&warrenv1.CreateRequest{Id: "hibwatch"})
	_, done := openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: "hibwatch", Path: "/tmp", Recursive: true})
	if _, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "hibwatch"}); err != nil {
		t.Fatal(err)
	}
	wantEnd(t, done, errdefs.Unavailable, "a hibernation")
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "hibwatch"}); err != nil {
		t.Fatal(err)
	}
	evs, done := openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: "hibwatch", Path: "/tmp"})
	e.sh("hibwatch", "echo x > /tmp/after")
	wantEvent(t, evs, "after", warrenv1.FileEventType_FILE_EVENT_TYPE_CREATE)
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "hibwatch"}); err != nil {
		t.Fatal(err)
	}
	wantEnd(t, done, errdefs.Unavailable, "a delete")
	if got := inotifyFDs(t); got != before {
		t.Fatalf("inotify instances: %d before, %d after", before, got)
	}
}

// TestWatchDirUserNS: a sandbox in a user namespace (its files idmapped)
// is watched the same way.
func TestWatchDirUserNS(t *testing.T) {
	if container.UserNSSupported() != nil {
		t.Skip(container.UserNSSupported())
	}
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "watchns", UserNamespace: proto.Bool(true)})
	evs, done := openWatch(t, e.m, &warrenv1.WatchDirRequest{SandboxId: "watchns", Path: "/tmp", Recursive: true})
	e.sh("watchns", "mkdir /tmp/d && echo x > /tmp/d/f")
	wantEvent(t, evs, "d/f", warrenv1.FileEventType_FILE_EVENT_TYPE_CREATE)
	if _, err := e.m.Delete(ctxT(t), &warrenv1.DeleteRequest{Id: "watchns"}); err != nil {
		t.Fatal(err)
	}
	wantEnd(t, done, errdefs.Unavailable, "a delete")
}

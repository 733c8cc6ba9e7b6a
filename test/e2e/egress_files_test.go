package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/mountinfo"
)

// TestFileCallsNeverTouchProcOrSys: the daemon reaches a sandbox's root
// through its init, so the sandbox's /proc and /sys are visible to file
// calls, which run as host root. Every file call refuses them with
// permission_denied: a write to /proc/1/oom_score_adj (which once
// succeeded) leaves the value as it was, and reads, stats, lists,
// mkdirs, removes and archives of /proc and /sys are refused too.
func TestFileCallsNeverTouchProcOrSys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	c := e.c
	ctx := ctxFor(t, 2*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "pfs"})
	initPid := e.initPid("pfs")
	if initPid == 0 {
		t.Fatal("no init found")
	}
	scorePath := fmt.Sprintf("/proc/%d/oom_score_adj", initPid)
	hostScore := func() string {
		b, err := os.ReadFile(scorePath)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	before := hostScore()
	pd := func(what string, err error) {
		t.Helper()
		if !client.IsPermissionDenied(err) {
			t.Errorf("%s: want permission_denied, got %v", what, err)
		} else if !strings.Contains(err.Error(), "run a command in the sandbox instead") {
			t.Errorf("%s: unclear message: %v", what, err)
		}
	}
	write := func(p, content string, appendTo bool) error {
		return c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "pfs", Path: p, Content: []byte(content), Append: appendTo})
	}
	newScore := "-1000"
	if before == newScore {
		newScore = "500"
	}
	pd("write /proc/1/oom_score_adj", write("/proc/1/oom_score_adj", newScore, false))
	pd("append /proc/1/oom_score_adj", write("/proc/1/oom_score_adj", newScore, true))
	pd("write /proc/self/oom_score_adj", write("/proc/self/oom_score_adj", newScore, false))
	if got := hostScore(); got != before {
		t.Fatalf("the init's oom_score_adj changed from %s to %s", before, got)
	}
	pd("write /proc/sys", write("/proc/sys/kernel/hostname", "pwned", false))
	pd("write /sys", write("/sys/kernel/mm/transparent_hugepage/enabled", "never", false))
	pd("create in /proc", write("/proc/newfile", "x", false))
	// A symlink the sandbox planted changes nothing.
	e.shOK("pfs", "ln -s /proc/1 /tmp/p1")
	pd("write through a symlink", write("/tmp/p1/oom_score_adj", newScore, false))
	if got := hostScore(); got != before {
		t.Fatalf("the init's oom_score_adj changed from %s to %s", before, got)
	}

	for _, p := range []string{"/proc/self/environ", "/proc/1/environ", "/proc/kcore", "/sys/kernel/mm/transparent_hugepage/enabled", "/tmp/p1/environ"} {
		_, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "pfs", Path: p})
		pd("read "+p, err)
	}
	for _, p := range []string{"/proc", "/proc/1", "/sys", "/sys/kernel"} {
		_, err := c.StatFile(ctx, "pfs", p)
		pd("stat "+p, err)
		_, err = c.ListFilesPage(ctx, &warrenv1.ListFilesRequest{SandboxId: "pfs", Path: p})
		pd("list "+p, err)
	}
	pd("mkdir in /sys", c.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: "pfs", Path: "/sys/fs/x", Parents: true}))
	pd("mkdir in /proc", c.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: "pfs", Path: "/proc/x"}))
	pd("remove /proc/1", c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: "pfs", Path: "/proc/1", Recursive: true}))
	pd("remove /sys", c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: "pfs", Path: "/sys", Recursive: true}))
	// The kernel refuses to remove a mount point only in the remover's
	// mount namespace: from the daemon's, removing /dev would detach the
	// sandbox's /dev.
	for _, rec := range []bool{true, false} {
		err := c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: "pfs", Path: "/dev", Recursive: rec})
		if client.CategoryOf(err) != client.CategoryConflict || !strings.Contains(err.Error(), "mount point") {
			t.Errorf("remove /dev (recursive %v): want conflict, a mount point, got %v", rec, err)
		}
	}
	e.shOK("pfs", "test -c /dev/null && test -c /dev/pts/ptmx")
	for _, p := range []string{"/proc/1", "/sys/kernel/mm"} {
		rc, err := c.Download(ctx, "pfs", p)
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		pd("download "+p, err)
	}
	pd("upload into /proc", c.Upload(ctx, "pfs", "/proc/1", bytes.NewReader(make([]byte, 1024))))

	// The sandbox's own files still work; listing / shows the mount
	// points.
	if err := write("/tmp/ok", "ok", false); err != nil {
		t.Fatal(err)
	}
	if rd, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "pfs", Path: "/tmp/ok"}); err != nil || string(rd.Content) != "ok" {
		t.Fatalf("read back %v %v", rd, err)
	}
	if ls, err := c.ListFiles(ctx, "pfs", "/"); err != nil || len(ls) < 5 {
		t.Fatalf("list /: %v %v", ls, err)
	}
}

// watchOpen reports, through the returned function, whether the file at
// host path p has been opened since (inotify IN_OPEN is a real open; an
// O_PATH one is not).
func watchOpen(t *testing.T, p string) func() bool {
	t.Helper()
	ifd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(ifd) })
	if _, err := unix.InotifyAddWatch(ifd, p, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	return func() bool {
		buf := make([]byte, 4096)
		n, _ := unix.Read(ifd, buf)
		return n > 0
	}
}

// TestFileCallsNeverOpenPlantedDevices: a sandbox's /dev is a directory
// on a node-wide tmpfs that allows device nodes. ReadFile and WriteFile
// refuse (invalid) a block device, a character device and a FIFO planted
// there without ever opening them (an open alone can act on a device or
// block), and a FIFO does not hang the call.
func TestFileCallsNeverOpenPlantedDevices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	c := e.c
	ctx := ctxFor(t, 2*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "nodes"})
	// The sandbox has no CAP_MKNOD: plant the nodes from the host, in
	// the sandbox's /dev directory. The block device is a loop device
	// of our own over a small file, the character device /dev/null's
	// numbers: opening either would do no harm if the check failed.
	img := filepath.Join(t.TempDir(), "blk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", img).Output()
	if err != nil {
		t.Skipf("no loop device: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	var lst unix.Stat_t
	if err := unix.Stat(loop, &lst); err != nil {
		t.Fatal(err)
	}
	devDir := filepath.Join(e.runDir, "devfs", "nodes")
	nodes := []struct {
		name string
		mode uint32
		rdev uint64
	}{
		{"blk", unix.S_IFBLK | 0o666, lst.Rdev},
		{"chr", unix.S_IFCHR | 0o666, unix.Mkdev(1, 3)},
		{"fifo", unix.S_IFIFO | 0o666, 0},
	}
	for _, n := range nodes {
		if err := unix.Mknod(filepath.Join(devDir, n.name), n.mode, int(n.rdev)); err != nil {
			t.Fatalf("plant %s in %s: %v", n.name, devDir, err)
		}
	}
	e.shOK("nodes", "ln -s /dev/fifo /tmp/fifo && test -p /dev/fifo && test -b /dev/blk")
	for _, n := range nodes {
		opened := watchOpen(t, filepath.Join(devDir, n.name))
		for _, p := range []string{"/dev/" + n.name, "/tmp/fifo"} {
			if p == "/tmp/fifo" && n.name != "fifo" {
				continue
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "nodes", Path: p})
				if client.CategoryOf(err) != client.CategoryInvalid || !strings.Contains(err.Error(), "not a regular file") {
					t.Errorf("read %s: want invalid, not a regular file, got %v", p, err)
				}
				for _, app := range []bool{false, true} {
					err = c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "nodes", Path: p, Content: []byte("x"), Append: app})
					if client.CategoryOf(err) != client.CategoryInvalid || !strings.Contains(err.Error(), "not a regular file") {
						t.Errorf("write %s (append %v): want invalid, not a regular file, got %v", p, app, err)
					}
				}
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("file calls on %s hang", p)
			}
			if opened() {
				t.Errorf("the daemon opened %s", p)
			}
		}
	}
}

// vmKB reads a "Vm...:" field of /proc/pid/status in KiB.
func vmKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// addLinks creates names prefix0..prefix(n-1) in dir from the host as
// hard links to a few files (ext4 allows 65,000 links per inode): a
// link is a directory entry without an inode, 300,000 of them take
// about 7 s here where as many files take longer.
func addLinks(t *testing.T, dir, prefix string, n int) {
	t.Helper()
	const perInode = 60000
	src := ""
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, prefix+strconv.Itoa(i))
		if i%perInode == 0 {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			src = p
			continue
		}
		if err := unix.Link(src, p); err != nil {
			t.Fatal(err)
		}
	}
}

// pageAll pages through path with ListFilesPage and counts every name.
func pageAll(t *testing.T, c *client.Client, id, path string, size int32) (map[string]int, int) {
	t.Helper()
	ctx := ctxFor(t, 5*time.Minute)
	seen := map[string]int{}
	req := &warrenv1.ListFilesRequest{SandboxId: id, Path: path, PageSize: size}
	pages := 0
	for {
		res, err := c.ListFilesPage(ctx, req)
		if err != nil {
			t.Fatalf("page %d of %s: %v", pages, path, err)
		}
		pages++
		limit := int(size)
		if limit == 0 {
			limit = 1000
		}
		if len(res.GetFiles()) > limit {
			t.Fatalf("page of %d entries, asked for %d", len(res.GetFiles()), size)
		}
		for _, f := range res.GetFiles() {
			seen[f.GetName()]++
		}
		if res.GetNextPageToken() == "" {
			return seen, pages
		}
		req.PageToken = res.GetNextPageToken()
	}
}

// TestListFilesPagesHugeDirectory: ListFiles of a 300,000-entry directory
// (which grew the daemon by 174 MB when read whole) comes in pages that
// see every entry exactly once, while the daemon's resident memory peak
// grows by less than 20 MB, for a directory only in the writable layer
// (ext4) and for a merged one (the image's /root, on EROFS, copied up);
// the merged /bin pages the same way for other page sizes; bad tokens
// are invalid.
func TestListFilesPagesHugeDirectory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	c := e.c
	ctx := ctxFor(t, 5*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "big"})
	// The directories are made (or copied up) through the overlay
	// first, so it knows them; entries added below its upper directory
	// afterwards are found by lookups and listings, which it does not
	// cache.
	e.shOK("big", "mkdir /big && touch /root/zz-copied-up /bin/zz-copied-up")
	upper := filepath.Join(e.stateDir, "sandboxes", "big", "upper")
	const n = 300000
	pid := e.cmd.Process.Pid
	for _, dir := range []string{"/big", "/root"} {
		start := time.Now()
		addLinks(t, filepath.Join(upper, dir), "f", n)
		t.Logf("created %d entries in %s from the host in %v", n, dir, time.Since(start))
		// Reset the peak (VmHWM) to the current resident set.
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
			t.Fatal(err)
		}
		rssBefore := vmKB(t, pid, "VmRSS")
		start = time.Now()
		seen, pages := pageAll(t, c, "big", dir, 0)
		t.Logf("%d pages of %s in %v", pages, dir, time.Since(start))
		peak := vmKB(t, pid, "VmHWM")
		want := n
		if dir == "/root" {
			want++ // zz-copied-up
		}
		if len(seen) != want {
			t.Fatalf("%s: saw %d names, want %d", dir, len(seen), want)
		}
		for i := 0; i < n; i++ {
			if c := seen["f"+strconv.Itoa(i)]; c != 1 {
				t.Fatalf("%s/f%d seen %d times", dir, i, c)
			}
		}
		if pages != (want+999)/1000 {
			t.Errorf("%s: %d pages of the default 1,000 for %d entries", dir, pages, want)
		}
		t.Logf("%s: daemon RSS %d KiB before, peak %d KiB while paging (+%d KiB)", dir, rssBefore, peak, peak-rssBefore)
		if grew := peak - rssBefore; grew > 20<<10 {
			t.Errorf("the daemon's resident memory grew by %d KiB paging the %d entries of %s", grew, want, dir)
		}
	}
	addLinks(t, filepath.Join(upper, "bin"), "x", 20000)

	// The merged /bin: lower entries (the image's layer is on EROFS),
	// the copied-up one and the upper ones, each once, as the sandbox
	// itself sees them.
	ms, err := mountinfo.Under(e.root)
	if err != nil || !slices.ContainsFunc(ms, func(m mountinfo.Mount) bool { return m.FSType == "erofs" }) {
		t.Fatalf("no EROFS layer mounted below %s: %v", e.root, err)
	}
	want := map[string]bool{}
	for _, name := range strings.Fields(e.shOK("big", "ls -1A /bin")) {
		want[name] = true
	}
	if !want["sh"] || !want["x19999"] || !want["zz-copied-up"] {
		t.Fatalf("ls /bin lacks lower or upper entries (%d names)", len(want))
	}
	for _, size := range []int32{0, 777, 10000, 50000} {
		got, _ := pageAll(t, c, "big", "/bin", size)
		if len(got) != len(want) {
			t.Fatalf("page size %d: %d names in /bin, the sandbox sees %d", size, len(got), len(want))
		}
		for name, k := range got {
			if k != 1 || !want[name] {
				t.Fatalf("page size %d: /bin/%s seen %d times (in ls: %v)", size, name, k, want[name])
			}
		}
	}
	// The client's ListFiles pages through all of it.
	all, err := c.ListFiles(ctx, "big", "/bin")
	if err != nil || len(all) != len(want) {
		t.Fatalf("ListFiles /bin: %d entries, %v", len(all), err)
	}

	first, err := c.ListFilesPage(ctx, &warrenv1.ListFilesRequest{SandboxId: "big", Path: "/big", PageSize: 10})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first page: %v", err)
	}
	for path, tok := range map[string]string{
		"/big": "not-a-token",
		"/tmp": first.GetNextPageToken(), // another directory's
	} {
		_, err := c.ListFilesPage(ctx, &warrenv1.ListFilesRequest{SandboxId: "big", Path: path, PageToken: tok})
		if client.CategoryOf(err) != client.CategoryInvalid {
			t.Errorf("list %s with token %q: want invalid, got %v", path, tok, err)
		}
	}
	_, err = c.ListFilesPage(ctx, &warrenv1.ListFilesRequest{SandboxId: "big", Path: "/big", PageSize: -1})
	if client.CategoryOf(err) != client.CategoryInvalid {
		t.Errorf("negative page size: %v", err)
	}
}

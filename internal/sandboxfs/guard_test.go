package sandboxfs

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// mountIn mounts a fresh fstype instance on root/dir (created) for the
// test; it is detached at the end.
func mountIn(t *testing.T, root, dir, fstype string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	p := filepath.Join(root, dir)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(fstype, p, fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount %s on %s: %v", fstype, p, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
	return p
}

// TestPseudoFSRefused: no file call reads, writes, lists, stats,
// creates or removes anything on a procfs, sysfs or cgroup2 mounted in
// the sandbox's root, whatever path or symlink leads there.
func TestPseudoFSRefused(t *testing.T) {
	fs, root, _ := setup(t)
	mountIn(t, root, "proc", "proc")
	mountIn(t, root, "sys", "sysfs")
	cg := mountIn(t, root, "cg", "cgroup2")
	if err := os.Symlink("/proc/self", filepath.Join(root, "me")); err != nil {
		t.Fatal(err)
	}
	// The test process's own score: harmless if a write got through.
	before := read(t, "/proc/self/oom_score_adj")
	pd := func(what string, err error) {
		t.Helper()
		wantCat(t, err, errdefs.PermissionDenied, "run a command in the sandbox instead")
		if !strings.Contains(err.Error(), "/proc") && !strings.Contains(err.Error(), "/sys") {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for _, p := range []string{"/proc/self/oom_score_adj", "/me/oom_score_adj", "/proc/sys/vm/drop_caches"} {
		pd("write "+p, fs.WriteFile(ctx, p, strings.NewReader("7"), 0, false, false))
		pd("append "+p, fs.WriteFile(ctx, p, strings.NewReader("7"), 0, true, false))
	}
	if got := read(t, "/proc/self/oom_score_adj"); got != before {
		t.Fatalf("oom_score_adj changed from %q to %q", before, got)
	}
	pd("create in /proc", fs.WriteFile(ctx, "/proc/newfile", strings.NewReader("x"), 0, false, false))
	pd("create below a missing /proc dir", fs.WriteFile(ctx, "/proc/nosuchpid/x", strings.NewReader("x"), 0, false, true))
	for _, p := range []string{"/proc/self/environ", "/me/environ", "/proc/kcore", "/sys/kernel/mm/transparent_hugepage/enabled", "/proc/999999999/environ"} {
		_, _, _, err := fs.ReadFile(ctx, p, 0, 0)
		pd("read "+p, err)
	}
	for _, p := range []string{"/proc", "/proc/self", "/me", "/sys", "/sys/kernel"} {
		_, _, err := fs.List(ctx, p, 0, "")
		pd("list "+p, err)
	}
	for _, p := range []string{"/proc", "/proc/1", "/proc/self/exe", "/sys/kernel"} {
		_, err := fs.Stat(ctx, p)
		pd("stat "+p, err)
	}
	// A mkdir in a cgroupfs makes a cgroup; a remove there removes one.
	pd("mkdir", fs.Mkdir(ctx, "/cg/warren-sandboxfs-test", 0, false))
	pd("mkdir -p", fs.Mkdir(ctx, "/cg/warren-sandboxfs-test/a/b", 0, true))
	pd("mkdir -p of /proc", fs.Mkdir(ctx, "/proc", 0, true))
	pd("write -p", fs.WriteFile(ctx, "/cg/warren-sandboxfs-test/f", strings.NewReader("x"), 0, false, true))
	if _, err := os.Stat(filepath.Join(cg, "warren-sandboxfs-test")); err == nil {
		_ = unix.Rmdir(filepath.Join(cg, "warren-sandboxfs-test"))
		t.Fatal("a cgroup was created")
	}
	pd("remove /proc", fs.Remove(ctx, "/proc", true))
	pd("remove /proc/self/environ", fs.Remove(ctx, "/proc/self/environ", false))
	pd("remove cgroup.procs", fs.Remove(ctx, "/cg/cgroup.procs", false))
	pd("tar out /proc/self", fs.TarOut(ctx, "/proc/self", io.Discard, TarOptions{}))
	pd("tar out a /sys file", fs.TarOut(ctx, "/sys/kernel/mm/transparent_hugepage/enabled", io.Discard, TarOptions{}))
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "x/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.Close()
	pd("tar in /cg", fs.TarIn(ctx, "/cg", bytes.NewReader(tb.Bytes())))
	pd("tar in below /cg", fs.TarIn(ctx, "/cg/warren-sandboxfs-test", bytes.NewReader(tb.Bytes())))
	if _, err := os.Stat(filepath.Join(cg, "warren-sandboxfs-test")); err == nil {
		_ = unix.Rmdir(filepath.Join(cg, "warren-sandboxfs-test"))
		t.Fatal("a cgroup was created by tar in")
	}
	// What is not on a pseudo-filesystem still works, including listing
	// the root that holds the mount points.
	if ents, err := listAll(fs, "/", 0); err != nil || len(ents) == 0 {
		t.Fatalf("list /: %v", err)
	}
	if err := fs.TarOut(ctx, "/etc", io.Discard, TarOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat(ctx, "/me"); err != nil {
		t.Fatalf("stat of the symlink itself: %v", err)
	}
}

// watchOpen reports, through the returned function, whether p has been
// opened (inotify IN_OPEN: a real open; an O_PATH one does not count).
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

// TestDevicesAndFifosNeverOpened: ReadFile and WriteFile refuse a device
// node or FIFO planted in the sandbox without opening it (an open alone
// can block, or act on a device), and without hanging.
func TestDevicesAndFifosNeverOpened(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for mknod")
	}
	fs, root, _ := setup(t)
	if err := os.Mkdir(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	// /dev/null's numbers: opening it is harmless if the check failed.
	nodes := map[string]uint32{
		"/dev/blk":  unix.S_IFBLK | 0o666,
		"/dev/chr":  unix.S_IFCHR | 0o666,
		"/dev/fifo": unix.S_IFIFO | 0o666,
	}
	for p, mode := range nodes {
		if err := unix.Mknod(filepath.Join(root, p), mode, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/dev/fifo", filepath.Join(root, "tofifo")); err != nil {
		t.Fatal(err)
	}
	for p := range nodes {
		opened := watchOpen(t, filepath.Join(root, p))
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _, _, err := fs.ReadFile(ctx, p, 0, 0)
			wantCat(t, err, errdefs.Invalid, "not a regular file: "+p)
			wantCat(t, fs.WriteFile(ctx, p, strings.NewReader("x"), 0, false, false), errdefs.Invalid, "not a regular file: "+p)
			wantCat(t, fs.WriteFile(ctx, p, strings.NewReader("x"), 0, true, true), errdefs.Invalid, "not a regular file: "+p)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: file call hangs", p)
		}
		if opened() {
			t.Fatalf("%s was opened", p)
		}
	}
	opened := watchOpen(t, filepath.Join(root, "dev/fifo"))
	_, _, _, err := fs.ReadFile(ctx, "/tofifo", 0, 0)
	wantCat(t, err, errdefs.Invalid, "not a regular file")
	if opened() {
		t.Fatal("the fifo behind a symlink was opened")
	}
	// Stat describes them without opening them.
	if fi, err := fs.Stat(ctx, "/dev/fifo"); err != nil || fi.Type != "other" {
		t.Fatalf("stat of a fifo: %+v %v", fi, err)
	}
}

// TestMountPointsNotRemoved: the kernel refuses to remove a mount point
// only in the remover's own mount namespace, and the daemon is not in the
// sandbox's: Remove refuses a mount point itself (Conflict, as EBUSY in
// the sandbox) and leaves it and what is on it alone.
func TestMountPointsNotRemoved(t *testing.T) {
	fs, root, _ := setup(t)
	mnt := mountIn(t, root, "dev", "tmpfs")
	write(t, filepath.Join(mnt, "null"), "keep")
	wantCat(t, fs.Remove(ctx, "/dev", true), errdefs.Conflict, "mount point")
	wantCat(t, fs.Remove(ctx, "/dev", false), errdefs.Conflict, "mount point")
	if got := read(t, filepath.Join(mnt, "null")); got != "keep" {
		t.Fatalf("content of the mount: %q", got)
	}
	// Below the mount point removal works as anywhere.
	if err := fs.Remove(ctx, "/dev/null", false); err != nil {
		t.Fatal(err)
	}
}

// TestTarInEntriesGuarded: an entry of an upload that a symlink the
// sandbox planted leads onto /proc is refused, and an entry that would
// replace a mount point leaves the mount and what is on it alone.
func TestTarInEntriesGuarded(t *testing.T) {
	fs, root, _ := setup(t)
	mountIn(t, root, "proc", "proc")
	mnt := mountIn(t, root, "dev", "tmpfs")
	write(t, filepath.Join(mnt, "null"), "keep")
	if err := os.MkdirAll(filepath.Join(root, "up"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/proc/self", filepath.Join(root, "up/pl")); err != nil {
		t.Fatal(err)
	}
	mk := func(hdrs ...*tar.Header) *bytes.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			tw.WriteHeader(h)
		}
		tw.Close()
		return bytes.NewReader(buf.Bytes())
	}
	err := fs.TarIn(ctx, "/up", mk(&tar.Header{Name: "pl/oom_score_adj", Typeflag: tar.TypeReg, Mode: 0o644}))
	wantCat(t, err, errdefs.PermissionDenied, `archive entry "pl/oom_score_adj" is on the sandbox's /proc`)
	err = fs.TarIn(ctx, "/", mk(&tar.Header{Name: "dev", Typeflag: tar.TypeReg, Mode: 0o644}))
	wantCat(t, err, errdefs.Conflict, "mount point")
	if got := read(t, filepath.Join(mnt, "null")); got != "keep" {
		t.Fatalf("content of the mount: %q", got)
	}
	// An ordinary upload still goes through, over existing entries too.
	for i := 0; i < 2; i++ {
		if err := fs.TarIn(ctx, "/up", mk(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}, &tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644})); err != nil {
			t.Fatal(err)
		}
	}
}

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// importVariant imports, as image name, a copy of the busybox root that
// edit has changed: the images a user brings, whose /etc is odd.
func importVariant(t *testing.T, e *env, name string, edit func(root string)) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("cp", "-a", testutil.BusyboxRoot(t), root).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	edit(root)
	if _, err := e.c.ImportImage(ctxFor(t, time.Minute), name, root); err != nil {
		t.Fatalf("import %s: %v", name, err)
	}
}

// TestSandboxEtcFiles: every sandbox gets its own /etc/hosts (localhost
// v4 and v6, its hostname), /etc/hostname and a resolv.conf without the
// node's resolver, whatever the image has there; it may change them (its
// own only); keep_etc keeps the image's; a commit leaves them out unless
// changed. Without them localhost does not resolve and every test suite
// that binds it breaks.
func TestSandboxEtcFiles(t *testing.T) {
	e := newEnv(t, envOptions{})
	// The image's files name the machine that built it.
	importVariant(t, e, "buildhost", func(root string) {
		for name, data := range map[string]string{"hostname": "buildhost\n", "hosts": "10.1.2.3\tbuildhost\n", "resolv.conf": "nameserver 10.9.9.9\n"} {
			if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})
	a := e.create(&warrenv1.CreateRequest{Image: "buildhost", Id: "etc_a.1"})
	if a.Hostname != "etc-a.1" {
		t.Fatalf("default hostname of id etc_a.1 = %q, want etc-a.1", a.Hostname)
	}
	hosts := e.shOK(a.Id, "cat /etc/hosts")
	for _, line := range []string{"127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", "127.0.1.1\tetc-a.1 etc-a"} {
		if !strings.Contains(hosts, line+"\n") {
			t.Errorf("/etc/hosts lacks %q:\n%s", line, hosts)
		}
	}
	if strings.Contains(hosts, "buildhost") {
		t.Errorf("/etc/hosts is the image's:\n%s", hosts)
	}
	if got := e.shOK(a.Id, "cat /etc/hostname; hostname"); got != "etc-a.1\netc-a.1\n" {
		t.Errorf("/etc/hostname and hostname = %q", got)
	}
	if got := e.shOK(a.Id, "grep -c '^nameserver' /etc/resolv.conf || true"); got != "0\n" {
		t.Errorf("resolv.conf names a nameserver: %s", e.shOK(a.Id, "cat /etc/resolv.conf"))
	}
	// /etc itself still looks like the image's, and holds the image's files.
	if got := e.shOK(a.Id, "stat -c %a:%u /etc; cat /etc/passwd | head -1"); got != "755:0\nroot:x:0:0:root:/root:/bin/sh\n" {
		t.Errorf("/etc after the sandbox's files = %q", got)
	}

	// The sandbox may replace its own (rename over it, as sed -i does),
	// and that changes no other sandbox's.
	b := e.create(&warrenv1.CreateRequest{Image: "buildhost", Id: "etc-b", Hostname: "web.test"})
	e.shOK(a.Id, "sed -i 's/^127.0.1.1.*/127.0.1.1 renamed/' /etc/hosts && echo '10.0.0.7 db' >> /etc/hosts")
	if got := e.shOK(a.Id, "grep -c 'renamed\\|db' /etc/hosts"); got != "2\n" {
		t.Errorf("sandbox's own edit of /etc/hosts: %q", got)
	}
	if got := e.shOK(b.Id, "grep -c 'renamed\\|db' /etc/hosts || true; grep 127.0.1.1 /etc/hosts"); got != "0\n127.0.1.1\tweb.test web\n" {
		t.Errorf("another sandbox's /etc/hosts after a's edit: %q", got)
	}

	// keep_etc: the image's own files.
	k := e.create(&warrenv1.CreateRequest{Image: "buildhost", Id: "etc-keep", KeepEtc: true})
	if !k.KeepEtc {
		t.Error("keep_etc not reported")
	}
	if got := e.shOK(k.Id, "cat /etc/hostname /etc/hosts /etc/resolv.conf"); got != "buildhost\n10.1.2.3\tbuildhost\nnameserver 10.9.9.9\n" {
		t.Errorf("keep_etc sandbox's files = %q", got)
	}

	// A commit carries the sandbox's changes, not the files Warren wrote:
	// b's unchanged hostname must not reach sandboxes made from its layer;
	// a's edited hosts does.
	ctx := ctxFor(t, time.Minute)
	e.shOK(b.Id, "echo made-by-b > /etc/motd")
	if _, err := e.c.CommitSandbox(ctx, b.Id, "from-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.CommitSandbox(ctx, a.Id, "from-a"); err != nil {
		t.Fatal(err)
	}
	c := e.create(&warrenv1.CreateRequest{Image: "buildhost", Layers: []string{"from-b"}, KeepEtc: true})
	if got := e.shOK(c.Id, "cat /etc/motd /etc/hostname"); got != "made-by-b\nbuildhost\n" {
		t.Errorf("sandbox from b's commit, keep_etc: %q (want b's motd and the image's hostname)", got)
	}
	d := e.create(&warrenv1.CreateRequest{Image: "buildhost", Layers: []string{"from-a"}, KeepEtc: true})
	if got := e.shOK(d.Id, "grep -c 'renamed\\|db' /etc/hosts; cat /etc/hostname"); got != "2\nbuildhost\n" {
		t.Errorf("sandbox from a's commit, keep_etc: %q (want a's edited hosts, the image's hostname)", got)
	}

	// Bad hostnames are refused with the rule.
	for _, h := range []string{"bad_name", "-x", "a..b", "a.", strings.Repeat("h", 65), "x y"} {
		_, err := e.c.Create(ctxFor(t, 30*time.Second), &warrenv1.CreateRequest{Image: imageName, Hostname: h})
		wantCategory(t, err, client.CategoryInvalid, fmt.Sprintf("hostname %q", h))
	}
}

// TestOddImageEtc: an image whose /etc/hosts is a symlink or a directory
// gets the sandbox's own file over it; one without /etc or /tmp gets
// them (/tmp sticky and writable by all); one whose /etc is a symlink
// keeps its own files (an /etc directory over it would hide all it leads
// to).
func TestOddImageEtc(t *testing.T) {
	e := newEnv(t, envOptions{})
	importVariant(t, e, "hosts-odd", func(root string) {
		must(t, os.Symlink("/proc/self/environ", filepath.Join(root, "etc/hosts")))
		must(t, os.Mkdir(filepath.Join(root, "etc/hostname"), 0o755))
		must(t, os.WriteFile(filepath.Join(root, "etc/hostname/x"), nil, 0o644))
		must(t, os.Chmod(filepath.Join(root, "etc"), 0o750))
	})
	importVariant(t, e, "no-etc", func(root string) {
		must(t, os.Rename(filepath.Join(root, "etc"), filepath.Join(root, "xetc")))
		must(t, os.Remove(filepath.Join(root, "tmp")))
	})
	importVariant(t, e, "etc-link", func(root string) {
		must(t, os.Rename(filepath.Join(root, "etc"), filepath.Join(root, "real-etc")))
		must(t, os.WriteFile(filepath.Join(root, "real-etc/hosts"), []byte("1.2.3.4 mine\n"), 0o644))
		must(t, os.Symlink("real-etc", filepath.Join(root, "etc")))
	})
	s := e.create(&warrenv1.CreateRequest{Image: "hosts-odd", Id: "odd"})
	if got := e.shOK(s.Id, "test -L /etc/hosts && echo link; test -f /etc/hostname && echo file; grep -c localhost /etc/hosts; cat /etc/hostname; stat -c %a /etc"); got != "file\n2\nodd\n750\n" {
		t.Errorf("image with a symlink hosts and a directory hostname: %q", got)
	}
	n := e.create(&warrenv1.CreateRequest{Image: "no-etc", Id: "noetc"})
	if got := e.shOK(n.Id, "cat /etc/hostname; stat -c %a:%u /etc /tmp; su -s /bin/sh nobody -c 'echo x > /tmp/f' 2>&1 || true; ls /tmp"); !strings.HasPrefix(got, "noetc\n755:0\n1777:0\n") {
		t.Errorf("image without /etc and /tmp: %q", got)
	}
	l := e.create(&warrenv1.CreateRequest{Image: "etc-link", Id: "etclink"})
	if got := e.shOK(l.Id, "test -L /etc && echo link; cat /etc/hosts; cat /etc/passwd | head -1"); got != "link\n1.2.3.4 mine\nroot:x:0:0:root:/root:/bin/sh\n" {
		t.Errorf("image whose /etc is a symlink: %q", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestInodeNumbersAgree: readdir's d_ino and stat's st_ino agree for
// files of the image's layers (each an EROFS filesystem of its own under
// the overlay) and of the writable layer, before and after a file is
// copied up, and every file has the overlay's st_dev for its whole life.
// Without xino readdir reports the layer's own inode numbers (CPython's
// test_os fails on it; find, tar and rsync compare them).
func TestInodeNumbersAgree(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.create(&warrenv1.CreateRequest{Id: "inodes"})
	e.shOK(s.Id, "echo new > /etc/newfile && mkdir -p /root/d && echo x > /root/d/f")
	root := fmt.Sprintf("/proc/%d/root", e.initPid(s.Id))
	var rootSt unix.Stat_t
	must(t, unix.Stat(root+"/", &rootSt))
	check := func(when string) map[string]uint64 {
		inos := map[string]uint64{}
		for _, dir := range []string{"/", "/bin", "/etc", "/root/d"} {
			ents, err := readdirInodes(root + dir)
			if err != nil {
				t.Fatal(err)
			}
			for name, dino := range ents {
				var st unix.Stat_t
				p := filepath.Join(dir, name)
				if err := unix.Lstat(root+p, &st); err != nil {
					t.Fatal(err)
				}
				// A mount point's readdir entry is the directory below
				// it, on any machine.
				if st.Ino != dino && !isMountPoint(dir, name) {
					t.Errorf("%s: %s: readdir d_ino %d, stat st_ino %d", when, p, dino, st.Ino)
				}
				if st.Dev != rootSt.Dev && !isMountPoint(dir, name) {
					t.Errorf("%s: %s: st_dev %d, the root's %d", when, p, st.Dev, rootSt.Dev)
				}
				inos[p] = st.Ino
			}
		}
		return inos
	}
	before := check("before copy-up")
	if len(before) < 10 {
		t.Fatalf("only %d entries seen", len(before))
	}
	// Copy-up of a file of the image: its inode number and device stay.
	e.shOK(s.Id, "echo more >> /etc/passwd && chmod 0644 /bin/busybox")
	after := check("after copy-up")
	for _, p := range []string{"/etc/passwd", "/bin/busybox"} {
		if before[p] != after[p] {
			t.Errorf("%s: st_ino %d before copy-up, %d after", p, before[p], after[p])
		}
	}
}

// isMountPoint: /proc, /dev and /sys are other filesystems.
func isMountPoint(dir, name string) bool {
	return dir == "/" && (name == "proc" || name == "dev" || name == "sys")
}

// readdirInodes lists dir with getdents64: name -> d_ino, as readdir(3)
// and os.scandir see them (os.ReadDir drops d_ino).
func readdirInodes(dir string) (map[string]uint64, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	out := map[string]uint64{}
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return out, nil
		}
		for off := 0; off < n; {
			rec := buf[off:]
			ino := uint64(rec[0]) | uint64(rec[1])<<8 | uint64(rec[2])<<16 | uint64(rec[3])<<24 |
				uint64(rec[4])<<32 | uint64(rec[5])<<40 | uint64(rec[6])<<48 | uint64(rec[7])<<56
			reclen := int(rec[16]) | int(rec[17])<<8
			name := rec[19:reclen]
			if i := strings.IndexByte(string(name), 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				out[s] = ino
			}
			off += reclen
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// setxattrC is planted in the sandbox: busybox has no setfattr, and an
// agent with root inside can set any xattr its filesystem takes.
const setxattrC = `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
int main(int argc, char **argv) {
	if (argc != 4) return 2;
	size_t n = strlen(argv[2]) / 2;
	unsigned char *v = malloc(n);
	for (size_t i = 0; i < n; i++) sscanf(argv[2] + 2 * i, "%2hhx", &v[i]);
	if (setxattr(argv[3], argv[1], v, n, 0) != 0) { perror("setxattr"); return 1; }
	return 0;
}
`

// aclDefault is a default ACL granting uid 1000 rwx: user::rwx,
// user:1000:rwx, group::r-x, mask::rwx, other::r-x.
const aclDefault = "02000000" + "01000700ffffffff" + "02000700e8030000" + "04000500ffffffff" + "10000700ffffffff" + "20000500ffffffff"

// plantAttacks builds issue #18's cases 2-4 from inside sandbox id with
// exec: what an agent with root in its sandbox can leave for a grader.
// target is a host file the test owns, the would-be victim.
func plantAttacks(t *testing.T, e *env, id, target string) {
	t.Helper()
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "setx.c"), filepath.Join(dir, "setx")
	if err := os.WriteFile(src, []byte(setxattrC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-static", "-O1", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, time.Minute)
	if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/setx", Content: b, Mode: 0o755}); err != nil {
		t.Fatalf("write setx: %v", err)
	}
	e.shOK(id, strings.Join([]string{
		// Case 2: an ACL granting uid 1000, sticky/setgid and setuid modes, a FIFO.
		"mkdir -p /o2/shared", "chmod 3777 /o2/shared", "echo x > /o2/shared/tool", "chmod 4777 /o2/shared/tool",
		"/setx system.posix_acl_default " + aclDefault + " /o2/shared", "mkfifo /o2/fifo",
		// Case 3: an absolute symlink at a name a later copy writes to.
		"mkdir -p /o3 /final", "ln -s " + target + " /o3/report.txt", "echo pwned > /final/report.txt",
		// Case 1: a chain that resolves outside only once all entries exist.
		"mkdir -p /o1/c", "cd /o1", "ln -s b/c/../../SECRET answer.txt", "ln -s . b",
		// Case 4: two 3 GB sparse files on a 16 MiB disk.
		"mkdir /o4", "truncate -s 3G /o4/a /o4/b", "echo tail >> /o4/b",
	}, " && "))
	// The ACL really is in what the daemon sends.
	rc, err := e.c.Download(ctx, id, "/o2")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	found := false
	for h := range testutil.TarEntries(t, rc) {
		if _, ok := h.PAXRecords["SCHILY.xattr.system.posix_acl_default"]; ok && strings.Trim(h.Name, "/") == "shared" {
			found = true
		}
	}
	if !found {
		t.Fatal("the planted default ACL is not in the sandbox's archive: the test would prove nothing")
	}
}

// checkCase2 checks a downloaded /o2: no ACL, masked modes, no FIFO.
func checkCase2(t *testing.T, dest string) {
	t.Helper()
	for p, want := range map[string]os.FileMode{"shared": os.ModeDir | 0o755, "shared/tool": 0o755} {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v on the host, want %v", p, fi.Mode(), want)
		}
	}
	if _, err := unix.Getxattr(filepath.Join(dest, "shared"), "system.posix_acl_default", nil); err != unix.ENODATA {
		t.Errorf("system.posix_acl_default on the host directory: %v, want ENODATA", err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "fifo")); !os.IsNotExist(err) {
		t.Errorf("FIFO created on the host: %v", err)
	}
}

func checkUntouched(t *testing.T, target string) {
	t.Helper()
	if b, err := os.ReadFile(target); err != nil || string(b) != "host" {
		t.Fatalf("host file %s now %q (%v)", target, b, err)
	}
}

// allocated is the disk space files under dir take.
func allocated(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	return n
}

func newEgressEnv(t *testing.T) (*env, string, string) {
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "agent", Resources: &warrenv1.Resources{DiskBytes: 16 << 20}})
	host := t.TempDir()
	target := filepath.Join(host, "host-file")
	if err := os.WriteFile(target, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	plantAttacks(t, e, "agent", target)
	return e, host, target
}

// The CLI's `sandbox cp` out of a sandbox whose agent planted issue #18's
// attacks: no ACL or dangerous mode reaches the host, a planted symlink is
// never written through by a later copy, and sparse files neither fill the
// host disk nor pass the default budget.
func TestEgressCopyCLI(t *testing.T) {
	t.Parallel()
	e, host, target := newEgressEnv(t)
	dl := filepath.Join(host, "dl")

	// Case 2.
	_, stderr, code := e.cli(nil, "sandbox", "cp", "agent:/o2", filepath.Join(dl, "o2"))
	if code != 0 {
		t.Fatalf("cp /o2: %d %s", code, stderr)
	}
	checkCase2(t, filepath.Join(dl, "o2"))
	for _, w := range []string{"skipped 1 device", "stripped setuid/setgid/sticky bits from 2", "xattrs"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("warning %q lacks %q", stderr, w)
		}
	}

	// Case 3: refused by default (the link names a host path); kept as a
	// link on request, and the second copy's destination passes through it.
	if _, stderr, code = e.cli(nil, "sandbox", "cp", "agent:/o3", dl); code == 0 || !strings.Contains(stderr, "--symlinks-as-is") {
		t.Fatalf("cp /o3 by default: exit %d %q", code, stderr)
	}
	if _, err := os.Lstat(filepath.Join(dl, "o3")); !os.IsNotExist(err) {
		t.Fatalf("refused /o3 left %v", err)
	}
	if _, stderr, code = e.cli(nil, "sandbox", "cp", "--symlinks-as-is", "agent:/o3", dl); code != 0 {
		t.Fatalf("cp /o3: %d %s", code, stderr)
	}
	if l, _ := os.Readlink(filepath.Join(dl, "o3", "report.txt")); l != target {
		t.Fatalf("report.txt -> %q, want the link kept as a link", l)
	}
	_, stderr, code = e.cli(nil, "sandbox", "cp", "agent:/final/report.txt", filepath.Join(dl, "o3", "report.txt"))
	if code == 0 || !strings.Contains(stderr, "invalid:") || !strings.Contains(stderr, "realpath") {
		t.Fatalf("second cp through the planted symlink: exit %d %q", code, stderr)
	}
	checkUntouched(t, target)

	// Case 4: refused by the default budget before a byte is written; with
	// room for one file only, the partial copy is removed; with room for
	// both, 6 GB of apparent size takes almost no disk.
	_, stderr, code = e.cli(nil, "sandbox", "cp", "agent:/o4", filepath.Join(dl, "o4"))
	if code == 0 || !strings.Contains(stderr, "exhausted:") || !strings.Contains(stderr, "--max-bytes") {
		t.Fatalf("cp /o4 with the default budget: exit %d %q", code, stderr)
	}
	_, stderr, code = e.cli(nil, "sandbox", "cp", "--max-bytes", "4Gi", "agent:/o4", filepath.Join(dl, "o4"))
	if code == 0 || !strings.Contains(stderr, "exhausted:") {
		t.Fatalf("cp /o4 with 4Gi: exit %d %q", code, stderr)
	}
	if _, err := os.Lstat(filepath.Join(dl, "o4")); !os.IsNotExist(err) {
		t.Fatalf("partial /o4 left on the host: %v", err)
	}
	if _, stderr, code = e.cli(nil, "sandbox", "cp", "--max-bytes", "8Gi", "agent:/o4", filepath.Join(dl, "o4")); code != 0 {
		t.Fatalf("cp /o4 with 8Gi: %d %s", code, stderr)
	}
	fi, err := os.Stat(filepath.Join(dl, "o4", "b"))
	if err != nil || fi.Size() != 3<<30+5 {
		t.Fatalf("o4/b: %v %v", fi, err)
	}
	if n := allocated(t, filepath.Join(dl, "o4")); n > 1<<20 {
		t.Fatalf("6 GB of sparse files took %d bytes of host disk", n)
	}
	// And back into the sandbox's 16 MiB disk: the upload is sparse and
	// the daemon's extraction keeps the holes (6 GB of zeros written out
	// would not fit).
	if _, stderr, code = e.cli(nil, "sandbox", "cp", filepath.Join(dl, "o4"), "agent:/back"); code != 0 {
		t.Fatalf("cp of the 6 GB of holes back into the sandbox: %d %s", code, stderr)
	}
	r := e.sh("agent", "stat -c '%s %b' /back/a /back/b; dd if=/back/b bs=1 skip=3221225472 2>/dev/null")
	var sa, ba, sb, bb int64
	var tail string
	if n, _ := fmt.Sscanf(string(r.GetStdout()), "%d %d\n%d %d\n%s", &sa, &ba, &sb, &bb, &tail); n != 5 ||
		sa != 3<<30 || sb != 3<<30+5 || ba != 0 || bb > 16 || tail != "tail" {
		t.Errorf("the files copied back: %q %q, want their sizes, no blocks but the tail's, and the tail", r.GetStdout(), r.GetStderr())
	}
}

// The Go SDK's DownloadTo against the same attacks, with the stats it
// returns and the categories of its errors.
func TestEgressDownloadToSDK(t *testing.T) {
	t.Parallel()
	e, host, target := newEgressEnv(t)
	ctx := ctxFor(t, 3*time.Minute)
	dl := filepath.Join(host, "dl")

	st, err := e.c.DownloadTo(ctx, "agent", "/o2", filepath.Join(dl, "o2"), nil)
	if err != nil {
		t.Fatal(err)
	}
	checkCase2(t, filepath.Join(dl, "o2"))
	if st.Skipped != 1 || st.SpecialBits != 2 || st.XattrsDropped < 1 {
		t.Errorf("stats %+v: want 1 skipped, 2 with special bits, the ACL dropped", st)
	}

	// Case 1: the link that would lead out once the chain exists is
	// refused, and the partial copy removed; kept as a link on request.
	_, err = e.c.DownloadTo(ctx, "agent", "/o1", filepath.Join(dl, "o1"), nil)
	wantCategory(t, err, client.CategoryInvalid, "download of a symlink chain leading out")
	if _, err := os.Lstat(filepath.Join(dl, "o1")); !os.IsNotExist(err) {
		t.Fatalf("refused /o1 left %v", err)
	}
	if _, err := e.c.DownloadTo(ctx, "agent", "/o1", filepath.Join(dl, "o1"), &client.DownloadOptions{SymlinksAsIs: true}); err != nil {
		t.Fatal(err)
	}
	if l, _ := os.Readlink(filepath.Join(dl, "o1", "answer.txt")); l != "b/c/../../SECRET" {
		t.Errorf("answer.txt -> %q", l)
	}

	// Case 3.
	if _, err := e.c.DownloadTo(ctx, "agent", "/o3", dl, &client.DownloadOptions{SymlinksAsIs: true}); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.DownloadTo(ctx, "agent", "/final/report.txt", filepath.Join(dl, "o3", "report.txt"), nil)
	wantCategory(t, err, client.CategoryInvalid, "download onto a planted symlink")
	_, err = e.c.DownloadTo(ctx, "agent", "/final", filepath.Join(dl, "o3", "report.txt", "x"), nil)
	wantCategory(t, err, client.CategoryInvalid, "download through a planted symlink")
	checkUntouched(t, target)

	// Case 4. Holes stay holes on the wire too (DownloadTo asks for a
	// sparse archive): 6 GB of them are a few blocks.
	if n, err := archiveLen(ctx, e.c, "agent", "/o4"); err != nil || n > 64<<10 {
		t.Errorf("sparse archive of 6 GB of holes: %d bytes, %v", n, err)
	}
	_, err = e.c.DownloadTo(ctx, "agent", "/o4", filepath.Join(dl, "o4"), nil)
	wantCategory(t, err, client.CategoryExhausted, "download 6 GB of sparse files with the default budget")
	if _, err := os.Lstat(filepath.Join(dl, "o4")); !os.IsNotExist(err) {
		t.Fatalf("partial /o4 left on the host: %v", err)
	}
	st, err = e.c.DownloadTo(ctx, "agent", "/o4", filepath.Join(dl, "o4"), &client.DownloadOptions{MaxBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes != 6<<30+5 {
		t.Errorf("bytes %d", st.Bytes)
	}
	if n := allocated(t, filepath.Join(dl, "o4")); n > 1<<20 {
		t.Fatalf("6 GB of sparse files took %d bytes of host disk", n)
	}
	// A single file into an existing directory, like cp.
	if _, err := e.c.DownloadTo(ctx, "agent", "/final/report.txt", dl, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dl, "report.txt")); string(b) != "pwned\n" {
		t.Errorf("report.txt = %q", b)
	}
}

// archiveLen is the length of the sparse archive of path in sandbox id.
func archiveLen(ctx context.Context, c *client.Client, id, path string) (int64, error) {
	rc, err := c.DownloadSparse(ctx, id, path)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}

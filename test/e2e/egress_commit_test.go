package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/mountinfo"
)

// probeSource prints the effective uid and capabilities of the process.
const probeSource = `#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(void)
{
	char line[256];
	unsigned long long eff = 0;
	FILE *f = fopen("/proc/self/status", "r");
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, "CapEff:", 7))
			sscanf(line + 7, "%llx", &eff);
	printf("euid=%d capeff=%llx\n", (int)geteuid(), eff);
	return 0;
}
`

// buildProbe compiles probeSource into a static binary (no loader needed in
// the busybox image) and returns its bytes.
func buildProbe(t *testing.T) []byte {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found: the setuid probe is a static C program (apt-get install gcc)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "probe.c")
	if err := os.WriteFile(src, []byte(probeSource), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "probe")
	if b, err := exec.Command("gcc", "-static", "-O2", "-o", out, src).CombinedOutput(); err != nil {
		t.Skipf("gcc -static failed (no static libc?): %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// capNetBindService is a security.capability xattr (VFS_CAP_REVISION_2,
// effective) granting CAP_NET_BIND_SERVICE, bit 10: CapEff 400.
var capNetBindService = []byte{0x01, 0, 0, 0x02, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// runAs runs argv in sandbox id as user and returns its stdout.
func (e *env) runAs(id, user string, argv ...string) string {
	e.t.Helper()
	res, err := e.c.Exec(ctxFor(e.t, 60*time.Second), &warrenv1.ExecRequest{SandboxId: id, Argv: argv, User: user})
	if err != nil {
		e.t.Fatalf("exec %v as %s in %s: %v", argv, user, id, err)
	}
	if res.ExitCode != 0 {
		e.t.Fatalf("exec %v as %s in %s: exit %d: %s", argv, user, id, res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(string(res.Stdout))
}

// layerMount is where the daemon mounts the layer with digest d.
func (e *env) layerMount(d string) string {
	return filepath.Join(e.runDir, "layers", strings.TrimPrefix(d, "sha256:"))
}

// TestCommitStripsSetuidByDefault: a uid-1000 process in a sandbox made
// from a committed layer does not get euid 0 from a setuid-root file, nor
// capabilities from a security.capability xattr, that the committed
// sandbox left there, unless the commit asked to keep them
// (keep_setuid), which the layer records. Without the stripping both
// probes print euid=0 / capeff=400 in the default case.
func TestCommitStripsSetuidByDefault(t *testing.T) {
	t.Parallel()
	probe := buildProbe(t)
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	// allow_setuid: the probes show what the bits grant, which
	// no_new_privs would hide.
	e.create(&warrenv1.CreateRequest{Id: "src", AllowSetuid: true})
	for _, p := range []string{"/suid", "/capped"} {
		if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "src", Path: p, Content: probe, Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
	}
	e.shOK("src", "chown 0:0 /suid /capped && chmod 4755 /suid")
	// A file capability, as `setcap cap_net_bind_service+ep` in the
	// sandbox would set it (busybox has no setcap).
	if err := unix.Lsetxattr(filepath.Join(e.stateDir, "sandboxes", "src", "upper", "capped"), "security.capability", capNetBindService, 0); err != nil {
		t.Fatalf("set a file capability in the upper directory: %v", err)
	}
	// Both work in the sandbox that made them: what a commit would carry.
	if got := e.runAs("src", "1000", "/suid"); !strings.HasPrefix(got, "euid=0 ") {
		t.Fatalf("setuid probe in its own sandbox: %q, want euid=0", got)
	}
	if got := e.runAs("src", "1000", "/capped"); got != "euid=1000 capeff=400" {
		t.Fatalf("capability probe in its own sandbox: %q, want capeff=400", got)
	}

	def, err := e.c.CommitSandbox(ctx, "src", "default")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := e.c.CommitSandboxWith(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "src", Name: "kept", KeepSetuid: true})
	if err != nil {
		t.Fatal(err)
	}
	if def.SetuidKept || def.SetuidStripped != 2 {
		t.Errorf("default commit: setuid_kept %v, setuid_stripped %d, want false, 2", def.SetuidKept, def.SetuidStripped)
	}
	if !kept.SetuidKept || kept.SetuidStripped != 0 {
		t.Errorf("keep_setuid commit: setuid_kept %v, setuid_stripped %d, want true, 0", kept.SetuidKept, kept.SetuidStripped)
	}
	// The layer records stay as they were reported.
	ls, err := e.c.ListLayers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Name == "default" && (l.SetuidKept || l.SetuidStripped != 2) || l.Name == "kept" && !l.SetuidKept {
			t.Errorf("listed layer %s: setuid_kept %v, setuid_stripped %d", l.Name, l.SetuidKept, l.SetuidStripped)
		}
	}

	e.create(&warrenv1.CreateRequest{Id: "fromdefault", Layers: []string{"default"}, AllowSetuid: true})
	e.create(&warrenv1.CreateRequest{Id: "fromkept", Layers: []string{"kept"}, AllowSetuid: true})
	for _, c := range []struct{ id, file, want string }{
		{"fromdefault", "/suid", "euid=1000 capeff=0"},
		{"fromdefault", "/capped", "euid=1000 capeff=0"},
		{"fromkept", "/suid", "euid=0 "},
		{"fromkept", "/capped", "euid=1000 capeff=400"},
	} {
		if got := e.runAs(c.id, "1000", c.file); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s in %s as uid 1000: %q, want %q", c.file, c.id, got, c.want)
		}
	}
	// The blobs themselves: no xattr in the default layer.
	var buf [64]byte
	if n, err := unix.Lgetxattr(filepath.Join(e.layerMount(def.Digest), "capped"), "security.capability", buf[:]); err != unix.ENODATA {
		t.Errorf("default layer's /capped has security.capability %x (%v)", buf[:max(n, 0)], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(e.layerMount(kept.Digest), "capped"), "security.capability", buf[:]); err != nil {
		t.Errorf("keep_setuid layer's /capped lost security.capability: %v", err)
	}

	// The CLI says what it stripped and takes --keep-setuid.
	_, stderr, code := e.cli(nil, "sandbox", "commit", "src", "cli-default")
	if code != 0 || !strings.Contains(stderr, "of 2 files") {
		t.Errorf("CLI commit: exit %d, stderr %q", code, stderr)
	}
	out, stderr, code := e.cli(nil, "--json", "sandbox", "commit", "--keep-setuid", "src", "cli-kept")
	if code != 0 || !strings.Contains(out, `"setuidKept": true`) {
		t.Errorf("CLI commit --keep-setuid: exit %d, %s %s", code, out, stderr)
	}
}

// TestLayerMountsNosuidNodev: the node's layer mounts are nosuid and
// nodev (read from the daemon's mountinfo), so a setuid-root file of a
// layer run from its mount point on the host gives no euid 0; a sandbox
// created with allow_setuid still gets the setuid bits of its image and
// operator-built layers, because exec checks the flags of the sandbox's
// overlay, not those of the layer mounts under it (checked here on this
// kernel).
func TestLayerMountsNosuidNodev(t *testing.T) {
	t.Parallel()
	probe := buildProbe(t)
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	src := filepath.Join(e.root, "tools")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "suid"), probe, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "suid"), 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	l, err := e.c.BuildLayer(ctx, "tools", src)
	if err != nil {
		t.Fatal(err)
	}
	e.create(&warrenv1.CreateRequest{Id: "sb", Layers: []string{"tools"}, AllowSetuid: true})
	if got := e.runAs("sb", "1000", "/suid"); !strings.HasPrefix(got, "euid=0 ") {
		t.Errorf("setuid file of an operator-built layer as uid 1000 in a sandbox: %q, want euid=0 (the overlay's flags decide)", got)
	}

	e.mu.Lock()
	pid := e.cmd.Process.Pid
	e.mu.Unlock()
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	layers := 0
	for _, m := range mountinfo.Parse(string(text)) {
		if !strings.HasPrefix(m.Point, filepath.Join(e.runDir, "layers")+"/") {
			continue
		}
		layers++
		opts := "," + strings.Join(m.MountOptions, ",") + ","
		if !strings.Contains(opts, ",nosuid,") || !strings.Contains(opts, ",nodev,") || !strings.Contains(opts, ",ro,") {
			t.Errorf("layer mount %s has mount options %v, want ro,nosuid,nodev", m.Point, m.MountOptions)
		}
	}
	if layers < 2 {
		t.Fatalf("%d layer mounts in the daemon's mountinfo, want the image's and tools", layers)
	}
	// On the host, through the layer's own mount: nosuid holds. (Exec'd
	// through the descriptor: uid 1000 cannot search the run directory.)
	f, err := os.Open(filepath.Join(e.layerMount(l.Digest), "suid"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("/proc/self/fd/3")
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("run the layer's setuid file on the host as uid 1000: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != "euid=1000 capeff=0" {
		t.Errorf("setuid file run from the layer mount on the host as uid 1000: %q, want euid=1000", got)
	}
}

// TestMountinfoShowsNoHostPaths: no line of a sandbox's
// /proc/self/mountinfo names the daemon's state or run directory, or a
// layer's mount point (the overlay's lowerdir, upperdir and workdir, the
// binds of /dev, /sys and of the empty directory that hides parts of /proc
// and /sys).
func TestMountinfoShowsNoHostPaths(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, time.Minute)
	src := filepath.Join(e.root, "ws")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.BuildLayer(ctx, "ws", src); err != nil {
		t.Fatal(err)
	}
	// A disk limit too: the upper directory is then on a loop-mounted
	// image of the state directory.
	e.create(&warrenv1.CreateRequest{Id: "mi", Layers: []string{"ws"}, Resources: &warrenv1.Resources{DiskBytes: 64 << 20, CpuMillis: 500}})
	text := e.shOK("mi", "cat /proc/self/mountinfo")
	// The env's root holds the state and run directories; the others
	// are also looked for by what names them relative to their
	// filesystem (a bind's root field).
	forbidden := []string{e.root, e.stateDir, e.runDir, "/layers/", "/sandboxes/", "/upper", "/work", "/devfs", "/empty", "/sysfs"}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	for _, line := range lines {
		for _, f := range forbidden {
			if strings.Contains(line, f) {
				t.Errorf("mountinfo line names %q: %s", f, line)
			}
		}
	}
	if len(lines) < 10 || !strings.Contains(text, " / / ") {
		t.Fatalf("not a sandbox's mountinfo:\n%s", text)
	}
	// Every bind's source is a filesystem's root, a /proc entry, in the
	// sandbox's own /dev directory (named by its id), or a file of the
	// node's views tmpfs, named for what it is (the cgroup skeleton, the
	// CPU views), or the agent's file on the node's agent tmpfs, named
	// for its content.
	for _, m := range mountinfo.Parse(text) {
		view := m.FSType == "tmpfs" && (m.Root == "/cgroup" || strings.HasPrefix(m.Root, "/cpu/"))
		view = view || m.FSType == "tmpfs" && m.Point == "/dev/.warren-agent" && strings.HasPrefix(m.Root, "/warren-agent-")
		if m.Root != "/" && m.FSType != "proc" && !strings.HasPrefix(m.Root+"/", "/mi/") && !view {
			t.Errorf("mount %s shows its source as %s (%s %s)", m.Point, m.Root, m.FSType, m.Source)
		}
	}
	// The overlay names its directories by the descriptors the init
	// stage had open.
	for _, m := range mountinfo.Parse(text) {
		if m.Point != "/" {
			continue
		}
		for _, o := range m.Options {
			k, v, _ := strings.Cut(o, "=")
			if k != "lowerdir" && k != "upperdir" && k != "workdir" {
				continue
			}
			for _, d := range strings.Split(v, ":") {
				if !strings.HasPrefix(d, "/proc/self/fd/") {
					t.Errorf("overlay option %s names %s", k, d)
				}
			}
		}
	}
	t.Logf("a sandbox's mountinfo:\n%s", text)
}

// TestSysfsNamesNoDiskImage: a sandbox does not see, through the node's
// shared sysfs, the backing file of the loop device under a neighbour's
// disk limit (<state>/disks/<id>.img: the state directory and the
// neighbour's id).
func TestSysfsNamesNoDiskImage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "withdisk", Resources: &warrenv1.Resources{DiskBytes: 64 << 20}})
	e.create(&warrenv1.CreateRequest{Id: "reader"})
	// The host side: the disk is a loop device that sysfs describes.
	var found bool
	if ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file"); len(ms) > 0 {
		for _, m := range ms {
			if b, err := os.ReadFile(m); err == nil && strings.Contains(string(b), e.stateDir) {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("no loop device of the host is backed by a disk image in %s", e.stateDir)
	}
	out := e.shOK("reader", "cat /sys/block/loop*/loop/backing_file /sys/dev/block/*/loop/backing_file 2>/dev/null; ls /sys/devices/virtual/block; true")
	if strings.Contains(out, e.stateDir) || strings.Contains(out, "withdisk") || strings.Contains(out, "loop") {
		t.Errorf("a sandbox sees the node's loop devices:\n%s", out)
	}
}

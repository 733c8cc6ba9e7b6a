package fidelity

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/testutil"
)

// testsuitePkg is Debian's package of CPython's regression tests; it
// depends on net-tools (ifconfig, netstat: test_uuid reads MAC addresses
// with them), which the minbase image lacks. Nothing else is added: the
// image's own python3 runs the tests on both sides.
const testsuitePkg = "libpython3.11-testsuite"

var extraPkgs = []string{"net-tools"}

// inputs are the files both sides run: the default Debian image's tree
// (what `warren image build debian` imports) and the extracted packages
// (the layer).
type inputs struct {
	dir    string // the cache directory of these inputs, locked by this run
	rootfs string // the debootstrap tree; never written after it is built
	layer  string // the extracted .debs, /usr-merged
	python string // python3.11's version in rootfs, e.g. 3.11.2-6+deb12u8
	log    []string
}

// cacheDir is where the debootstrap tree and the .debs are kept between
// runs: WARREN_FIDELITY_CACHE, else /var/cache/warren/fidelity. A fresh
// debootstrap takes 35 s to minutes (the mirror's speed); a cached one
// 0 s.
func cacheDir() string {
	if d := os.Getenv("WARREN_FIDELITY_CACHE"); d != "" {
		return d
	}
	return "/var/cache/warren/fidelity"
}

// cacheKey names a cached tree by what built it: the suite, the mirror,
// the architecture and the source of the image builder
// (internal/image/build.go: its debootstrap command line, the packages it
// includes, how it cleans the tree), so that a change to the default
// image builds the tree again. The mirror's content moves too (point
// releases); that is caught by the testsuite's version: when the mirror
// no longer has the testsuite of the cached tree's python3.11, the tree is
// built again.
func cacheKey(mirror string) (string, error) {
	src, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), "internal/image/build.go"))
	if err != nil {
		return "", fmt.Errorf("the cache key reads the image builder's source: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "v2\n%s\n%s\n%s\n", image.DebianSuite, mirror, runtime.GOARCH)
	h.Write(src)
	return image.DebianSuite + "-" + runtime.GOARCH + "-" + hex.EncodeToString(h.Sum(nil)[:6]), nil
}

// prepare returns the cached inputs, building what is missing: the
// Debian tree with image.BuildDebian (the code `warren image build
// debian` runs), the testsuite of exactly its python3.11 version and
// net-tools with apt-get download, extracted with dpkg-deb -x. It holds
// an flock on the cache until the test ends, so that two runs on a host
// do not build or replace it under each other.
func prepare(t *testing.T, ctx context.Context) *inputs {
	t.Helper()
	mirror, err := image.FindMirror(image.AptDir, image.DebianSuite, "main")
	if err != nil {
		t.Fatalf("fidelity: the Debian image needs a mirror: %v (set WARREN_FIDELITY=skip to skip this suite)", err)
	}
	key, err := cacheKey(mirror)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cacheDir(), key)
	pruneCache(t, key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Held until the test ends: the tree is read (imported, copied) after
	// prepare returns.
	t.Cleanup(lockDir(t, dir))
	in := &inputs{dir: dir, rootfs: filepath.Join(dir, "rootfs"), layer: filepath.Join(dir, "layer")}
	for attempt := 0; ; attempt++ {
		if err := in.ensureRootfs(ctx, dir, mirror); err != nil {
			t.Fatalf("fidelity: cannot build the Debian image from %s (the mirror of /etc/apt's sources): %v\n"+
				"the suite needs that mirror reachable; set WARREN_FIDELITY=skip to skip it", mirror, err)
		}
		err := in.ensureLayer(ctx, dir)
		if err == nil {
			return in
		}
		if attempt > 0 || !errors.Is(err, errVersionGone) {
			t.Fatalf("fidelity: cannot fetch %s for python3.11 %s: %v\n"+
				"the suite needs the Debian mirror of the system's apt sources reachable; set WARREN_FIDELITY=skip to skip it", testsuitePkg, in.python, err)
		}
		// The mirror moved on (a point release): build a tree of today's.
		in.logf("%v: building the Debian tree again", err)
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func (in *inputs) logf(format string, args ...any) {
	in.log = append(in.log, fmt.Sprintf(format, args...))
}

// ensureRootfs builds rootfs unless a complete one (marked by
// rootfs.done, written last) is there.
func (in *inputs) ensureRootfs(ctx context.Context, dir, mirror string) error {
	done := filepath.Join(dir, "rootfs.done")
	if _, err := os.Stat(done); err != nil {
		_ = os.RemoveAll(in.rootfs)
		start := time.Now()
		var progress bytes.Buffer
		if err := image.BuildDebian(ctx, in.rootfs, &progress); err != nil {
			return fmt.Errorf("%w\n%s", err, tail(progress.String(), 3000))
		}
		in.logf("debootstrap %s from %s: %v", image.DebianSuite, mirror, time.Since(start).Round(time.Second))
		if err := os.WriteFile(done, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
			return err
		}
	} else {
		b, _ := os.ReadFile(done)
		in.logf("cached Debian tree %s (built %s)", in.rootfs, strings.TrimSpace(string(b)))
	}
	v, err := dpkgVersion(in.rootfs, "python3.11")
	if err != nil {
		return err
	}
	in.python = v
	return nil
}

// errVersionGone: the mirror no longer serves the testsuite of the
// cached tree's python.
var errVersionGone = errors.New("the mirror no longer has that version")

// ensureLayer fetches and extracts the packages unless layer.done names
// the tree's python version.
func (in *inputs) ensureLayer(ctx context.Context, dir string) error {
	done := filepath.Join(dir, "layer.done")
	if b, err := os.ReadFile(done); err == nil && strings.TrimSpace(string(b)) == in.python {
		in.logf("cached %s %s", testsuitePkg, in.python)
		return nil
	}
	debs := filepath.Join(dir, "debs")
	for _, d := range []string{debs, in.layer} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	pkgs := append([]string{testsuitePkg + "=" + in.python}, extraPkgs...)
	if err := aptDownload(ctx, debs, pkgs); err != nil {
		return err
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(files) != len(pkgs) {
		return fmt.Errorf("apt-get download left %d .debs for %d packages: %v", len(files), len(pkgs), files)
	}
	for _, f := range files {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", f, in.layer).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v: %s", f, err, out)
		}
		in.logf("extracted %s", filepath.Base(f))
	}
	if err := mergeUsr(in.layer); err != nil {
		return err
	}
	return os.WriteFile(done, []byte(in.python+"\n"), 0o644)
}

// aptDownload runs apt-get download for pkgs into dir with the host's apt
// sources (signed lists, so the .debs are verified). When the host's
// package lists lack a version (a fresh machine's lists are older than
// the mirror, or absent) it updates them once and tries again; a version
// missing after that is errVersionGone.
func aptDownload(ctx context.Context, dir string, pkgs []string) error {
	run := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		return cmd.CombinedOutput()
	}
	// The download runs as root into dir: apt's _apt user could not write
	// there.
	args := append([]string{"-q", "-o", "APT::Sandbox::User=root", "download"}, pkgs...)
	out, err := run(args...)
	if err == nil {
		return nil
	}
	if upd, uerr := run("-q", "update"); uerr != nil {
		return fmt.Errorf("apt-get download %v: %v: %s\napt-get update: %v: %s", pkgs, err, tail(string(out), 1500), uerr, tail(string(upd), 1500))
	}
	out, err = run(args...)
	if err == nil {
		return nil
	}
	if bytes.Contains(out, []byte("Can't find a source to download version")) || bytes.Contains(out, []byte("not found")) {
		return fmt.Errorf("apt-get download %v: %w: %s", pkgs, errVersionGone, tail(string(out), 1500))
	}
	return fmt.Errorf("apt-get download %v: %v: %s", pkgs, err, tail(string(out), 1500))
}

// dpkgVersion reads an installed package's version from a tree's dpkg
// status file.
func dpkgVersion(root, pkg string) (string, error) {
	f, err := os.Open(filepath.Join(root, "var/lib/dpkg/status"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	in := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			in = false
		case strings.HasPrefix(line, "Package: "):
			in = strings.TrimPrefix(line, "Package: ") == pkg
		case in && strings.HasPrefix(line, "Version: "):
			return strings.TrimPrefix(line, "Version: "), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s is not installed in %s", pkg, root)
}

// mergeUsr moves a layer's /bin, /sbin and /lib into /usr, as dpkg does
// on Debian's merged-/usr trees (where /bin is a symlink to usr/bin). As a
// layer, a real /bin directory would hide the image's symlink, and with
// it /bin/sh.
func mergeUsr(layer string) error {
	for _, d := range []string{"bin", "sbin", "lib"} {
		src := filepath.Join(layer, d)
		ents, err := os.ReadDir(src)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		dst := filepath.Join(layer, "usr", d)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		for _, e := range ents {
			if _, err := os.Lstat(filepath.Join(dst, e.Name())); err == nil {
				return fmt.Errorf("mergeUsr: both /%s/%s and /usr/%s/%s in the layer", d, e.Name(), d, e.Name())
			}
			if err := os.Rename(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		if err := os.Remove(src); err != nil {
			return err
		}
	}
	return nil
}

// pruneCache removes the cache's other trees of this suite and
// architecture (an earlier image builder's: ~400 MB each) that no run
// holds locked.
func pruneCache(t *testing.T, keep string) {
	t.Helper()
	others, _ := filepath.Glob(filepath.Join(cacheDir(), image.DebianSuite+"-"+runtime.GOARCH+"-*"))
	for _, o := range others {
		if filepath.Base(o) == keep {
			continue
		}
		f, err := os.Open(filepath.Join(o, "lock"))
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			if ms, _ := mountinfo.Under(o); len(ms) == 0 {
				_ = os.RemoveAll(o)
				t.Logf("removed the outdated cached tree %s", o)
			}
		}
		f.Close()
	}
}

// lockDir takes an exclusive flock on dir/lock until the returned func.
func lockDir(t *testing.T, dir string) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatal(err)
	}
	return func() { f.Close() }
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

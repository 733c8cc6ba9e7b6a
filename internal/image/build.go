package image

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/mountinfo"
)

// BusyboxPath is where Debian's busybox-static package installs busybox.
var BusyboxPath = "/bin/busybox"

// BuildBusybox builds a minimal root filesystem in dst (created; it must
// not exist or be empty) from the busybox-static package's binary:
// /bin/busybox with a symlink per applet, /bin/sh, /etc/passwd (root and
// nobody), /etc/group, /etc/hostname, and the usual empty directories
// (/tmp is 1777). A missing or dynamically linked busybox is an
// Unavailable error telling to apt-get install busybox-static.
func BuildBusybox(ctx context.Context, dst string) error {
	bb := BusyboxPath
	if err := checkStatic(bb); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, bb, "--list-full").Output()
	if err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, bb+" --list-full")
	}
	if err := emptyDir(dst); err != nil {
		return err
	}
	dirs := []struct {
		p    string
		mode uint32
	}{
		{"bin", 0o755}, {"sbin", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"etc", 0o755}, {"root", 0o700}, {"home", 0o755}, {"tmp", 0o1777},
		{"var/tmp", 0o1777}, {"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555},
		{"run", 0o755}, {"mnt", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(dst, d.p)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "busybox root")
		}
		if err := unix.Chmod(p, d.mode); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "busybox root")
		}
	}
	if err := copyFile(bb, filepath.Join(dst, "bin/busybox"), 0o755); err != nil {
		return err
	}
	applets := strings.Fields(string(out))
	applets = append(applets, "bin/sh")
	sort.Strings(applets)
	for _, a := range applets {
		rel := path.Clean("/" + a)[1:]
		if rel == "" || rel == "bin/busybox" {
			continue
		}
		p := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "busybox root")
		}
		if err := os.Symlink("/bin/busybox", p); err != nil && !errors.Is(err, os.ErrExist) {
			return errdefs.Wrap(errdefs.Internal, err, "busybox root")
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
		"etc/hostname": "warren\n",
		"etc/hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dst, name), []byte(content), 0o644); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "busybox root")
		}
	}
	return nil
}

func checkStatic(bb string) error {
	f, err := elf.Open(bb)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.Unavailablef("busybox not found at %s: apt-get install busybox-static", bb)
		}
		return errdefs.New(errdefs.Unavailable, "%s is not a usable busybox (apt-get install busybox-static): %w", bb, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errdefs.Unavailablef("%s is dynamically linked: apt-get install busybox-static", bb)
		}
	}
	return nil
}

// emptyDir creates dir, or accepts it if it exists and is empty.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "create "+dir)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "read "+dir)
	}
	if len(ents) > 0 {
		return errdefs.Conflictf("%s is not empty", dir)
	}
	return os.Chmod(dir, 0o755)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "copy "+src)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "copy "+src)
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(dst, mode)
	}
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "copy "+src)
	}
	return nil
}

// DebianSuite is the release BuildDebian installs.
const DebianSuite = "bookworm"

// AptDir is where BuildDebian looks for the system's apt sources.
var AptDir = "/etc/apt"

// BuildDebian builds a Debian bookworm root filesystem with python3 and
// git in dst (created; it must not exist or be empty) with
//
//	debootstrap --variant=minbase --include=python3,git,netbase bookworm dst MIRROR
//
// netbase (/etc/services, /etc/protocols), which every Debian install has
// but minbase leaves out: without it getservbyname and getaddrinfo with a
// service name fail ("Servname not supported"; the fidelity suite's
// test_socket and test_asyncio cases).
// where MIRROR is the first URI of the system's apt sources that serves
// bookworm main. debootstrap's output goes to progress (nil discards it).
// It then removes apt's caches and package lists. It needs root and takes
// minutes. On error dst is left for the caller to remove; nothing stays
// mounted in it.
func BuildDebian(ctx context.Context, dst string, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	deb, err := exec.LookPath("debootstrap")
	if err != nil {
		deb = "/usr/sbin/debootstrap"
		if _, serr := os.Stat(deb); serr != nil {
			return errdefs.Unavailablef("debootstrap not found: apt-get install debootstrap")
		}
	}
	mirror, err := FindMirror(AptDir, DebianSuite, "main")
	if err != nil {
		return err
	}
	if err := emptyDir(dst); err != nil {
		return err
	}
	abs, err := filepath.Abs(dst)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "debian root")
	}
	fmt.Fprintf(progress, "debootstrap %s from %s into %s\n", DebianSuite, mirror, abs)
	cmd := exec.CommandContext(ctx, deb, "--variant=minbase", "--include=python3,git,netbase", DebianSuite, abs, mirror)
	cmd.Stdout = progress
	cmd.Stderr = progress
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	if !hasPath(cmd.Env) {
		cmd.Env = append(cmd.Env, "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
	}
	// debootstrap runs dpkg and chroot children: kill the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	runErr := cmd.Run()
	unmountUnder(abs)
	if runErr != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("debootstrap interrupted: %w", ctx.Err())
		}
		return errdefs.Wrap(errdefs.Unavailable, runErr, "debootstrap failed (see its output)")
	}
	return cleanApt(abs)
}

func hasPath(env []string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			return true
		}
	}
	return false
}

// cleanApt removes downloaded packages, package lists and apt's binary
// caches from a root filesystem.
func cleanApt(root string) error {
	globs := []string{
		"var/cache/apt/archives/*.deb",
		"var/cache/apt/archives/partial/*",
		"var/cache/apt/*.bin",
		"var/lib/apt/lists/*",
	}
	for _, g := range globs {
		matches, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "clean apt")
		}
		for _, m := range matches {
			base := filepath.Base(m)
			if base == "lock" || base == "partial" {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return errdefs.Wrap(errdefs.Internal, err, "clean apt")
			}
		}
	}
	return nil
}

// unmountUnder detaches every mount at or below dir (debootstrap mounts
// /proc and /sys in the target and may leave them on failure).
func unmountUnder(dir string) {
	mounts, err := mountinfo.Under(dir)
	if err != nil {
		return
	}
	// Deepest first.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Point) > len(mounts[j].Point) })
	for _, m := range mounts {
		_ = unix.Unmount(m.Point, unix.MNT_DETACH)
	}
}

// FindMirror returns the first URI in the apt sources under aptDir
// (sources.list, then sources.list.d/*.list and deb822 *.sources in name
// order) of a "deb" source for suite with component. Disabled deb822
// entries and URI schemes debootstrap cannot use are skipped.
func FindMirror(aptDir, suite, component string) (string, error) {
	files := []string{filepath.Join(aptDir, "sources.list")}
	more, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*"))
	sort.Strings(more)
	files = append(files, more...)
	for _, f := range files {
		var srcs []aptSource
		switch {
		case strings.HasSuffix(f, ".sources"):
			srcs = parseDeb822(f)
		case strings.HasSuffix(f, ".list") || f == files[0]:
			srcs = parseOneLine(f)
		}
		for _, s := range srcs {
			if s.matches(suite, component) {
				return strings.TrimRight(s.uri, "/"), nil
			}
		}
	}
	return "", errdefs.Unavailablef("no apt source for %s %s in %s (add one to sources.list or sources.list.d)", suite, component, aptDir)
}

type aptSource struct {
	types, suites, components []string
	uri                       string
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (s aptSource) matches(suite, component string) bool {
	if !has(s.types, "deb") || !has(s.suites, suite) || !has(s.components, component) {
		return false
	}
	for _, scheme := range []string{"http://", "https://", "file:/", "ftp://"} {
		if strings.HasPrefix(s.uri, scheme) {
			return true
		}
	}
	return false
}

// parseOneLine reads "deb [options] uri suite component..." lines.
func parseOneLine(file string) []aptSource {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []aptSource
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		// Drop the [ options ] block.
		if i := strings.IndexByte(line, '['); i >= 0 {
			if j := strings.IndexByte(line[i:], ']'); j >= 0 {
				line = line[:i] + " " + line[i+j+1:]
			}
		}
		fs := strings.Fields(line)
		if len(fs) < 4 {
			continue
		}
		out = append(out, aptSource{types: fs[:1], uri: fs[1], suites: fs[2:3], components: fs[3:]})
	}
	return out
}

// parseDeb822 reads deb822 stanzas (Types, URIs, Suites, Components,
// Enabled).
func parseDeb822(file string) []aptSource {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		if len(fields) > 0 && !strings.EqualFold(strings.TrimSpace(fields["enabled"]), "no") {
			for _, uri := range strings.Fields(fields["uris"]) {
				out = append(out, aptSource{
					types:      strings.Fields(fields["types"]),
					uri:        uri,
					suites:     strings.Fields(fields["suites"]),
					components: strings.Fields(fields["components"]),
				})
			}
		}
		fields = map[string]string{}
		last = ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		last = strings.ToLower(strings.TrimSpace(k))
		fields[last] = strings.TrimSpace(v)
	}
	flush()
	return out
}

package container

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
)

// What a sandbox reads about its own size. A sandbox limited to half a
// core and 512 MiB of a 2-core, 24 GiB node saw nproc 2 and its tools
// sized themselves to the node. Three pieces make it see its limits:
//
//   - CPU affinity (cpus.go): its processes may run on ceil(cpu_millis /
//     1000) of the node's CPUs, so sched_getaffinity (nproc, Go, Rust,
//     Node, ninja, pytest-xdist) counts those;
//   - views of the CPU count for what reads files instead (glibc's
//     get_nprocs and so Python's os.cpu_count and sysconf read
//     /sys/devices/system/cpu/online; scripts count /proc/cpuinfo's
//     processors): read-only binds of files with that many CPUs;
//   - its own cgroup, read-only, at /sys/fs/cgroup (cgroups.Views):
//     memory limit, CPU quota and usage, which JVMs, Go, Node and
//     build tools read.
//
// /proc/meminfo is the node's: its numbers change every moment, and a
// view of them needs a filesystem served by a process (LXCFS), which
// would break every sandbox's /proc/meminfo whenever it restarted; and
// sysinfo(2), which glibc's sysconf(_SC_PHYS_PAGES) uses, cannot be
// changed for a process at all. The cgroup's memory.limit_in_bytes or
// memory.max is the number to size by.
//
// The view files live on one small tmpfs per node, <run>/views, shared
// by every sandbox (one file per CPU count, not per sandbox): binds of
// them cost a mount each, no superblock and no page per sandbox.

// viewsDir is where the shared views tmpfs is mounted.
func (b *Backend) viewsDir() string { return filepath.Join(b.opts.RunDir, "views") }

// viewsOptions: a few files of a few KiB each (one cpuinfo and one online
// file per CPU count in use, and the cgroup skeleton's directories).
const viewsOptions = "mode=0755,size=4m,nr_inodes=4096"

// ensureViews mounts the views tmpfs if it is not (an earlier daemon's is
// kept) and makes the cgroup skeleton on it.
func (b *Backend) ensureViews() error {
	dir := b.viewsDir()
	if tmpfsAt(dir, 0, 0) {
		return nil
	}
	b.sharedMu.Lock()
	defer b.sharedMu.Unlock()
	if !tmpfsAt(dir, 0, 0) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "create views directory")
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, viewsOptions); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "mount views tmpfs")
		}
	}
	// The directories the sandbox's cgroup filesystems are mounted on
	// (v2 hosts mount theirs on /sys/fs/cgroup itself).
	for _, v := range cgroups.Views() {
		if v.Dir != "" {
			if err := os.MkdirAll(filepath.Join(dir, "cgroup", v.Dir), 0o555); err != nil {
				return errdefs.Wrap(errdefs.Internal, err, "create cgroup view directories")
			}
		}
	}
	return nil
}

// closeViews unmounts the views tmpfs; live sandboxes keep their binds.
func (b *Backend) closeViews() error {
	if !tmpfsAt(b.viewsDir(), 0, 0) {
		return nil
	}
	if err := unix.Unmount(b.viewsDir(), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount views tmpfs: %w", err)
	}
	return nil
}

// cgroupViewConfig is the init stage's config of the cgroup view of
// group (a cgroups.Group's Name): "cgroup_skel" (bound read-only at
// /sys/fs/cgroup where there are v1 hierarchies) and "cgroups"
// ("dir>source" entries, ';'-separated: the group's directory in each
// hierarchy, bound read-only at /sys/fs/cgroup/dir).
func (b *Backend) cgroupViewConfig(group string, conf map[string]string) {
	vs := cgroups.Views()
	if len(vs) == 0 {
		return
	}
	var sb strings.Builder
	for i, v := range vs {
		if v.Dir != "" {
			conf["cgroup_skel"] = filepath.Join(b.viewsDir(), "cgroup")
		}
		if i > 0 {
			sb.WriteByte(';')
		}
		sb.WriteString(v.Dir + ">" + v.Source(group))
	}
	conf["cgroups"] = sb.String()
}

// cpuViews returns the files a sandbox of n CPUs binds over
// /sys/devices/system/cpu/online and /proc/cpuinfo, writing them the
// first time n is asked for.
func (b *Backend) cpuViews(n int) (online, cpuinfo string, err error) {
	dir := filepath.Join(b.viewsDir(), "cpu")
	online = filepath.Join(dir, "online-"+strconv.Itoa(n))
	cpuinfo = filepath.Join(dir, "cpuinfo-"+strconv.Itoa(n))
	if fileExists(online) && fileExists(cpuinfo) {
		return online, cpuinfo, nil
	}
	b.sharedMu.Lock()
	defer b.sharedMu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", errdefs.Wrap(errdefs.Internal, err, "create CPU views")
	}
	list := "0"
	if n > 1 {
		list = "0-" + strconv.Itoa(n-1)
	}
	host, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "", "", errdefs.Wrap(errdefs.Internal, err, "read /proc/cpuinfo")
	}
	for path, data := range map[string][]byte{online: []byte(list + "\n"), cpuinfo: cpuinfoFor(host, n)} {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o444); err != nil {
			return "", "", errdefs.Wrap(errdefs.Internal, err, "write CPU view")
		}
		if err := os.Rename(tmp, path); err != nil {
			return "", "", errdefs.Wrap(errdefs.Internal, err, "write CPU view")
		}
	}
	return online, cpuinfo, nil
}

// cpuinfoFor is /proc/cpuinfo (host) cut to its first n processors,
// numbered 0 to n-1, each saying its package has n of them ("siblings",
// "cpu cores"), as a machine of n CPUs shows it. Formats without a blank
// line between processors (some architectures put the model first) are
// kept whole.
func cpuinfoFor(host []byte, n int) []byte {
	blocks := bytes.Split(bytes.TrimRight(host, "\n"), []byte("\n\n"))
	var procs [][]byte
	for _, bl := range blocks {
		if bytes.HasPrefix(bl, []byte("processor")) {
			procs = append(procs, bl)
		}
	}
	if len(procs) < n || len(procs) != len(blocks) {
		return host
	}
	var out bytes.Buffer
	for i, bl := range procs[:n] {
		for _, line := range bytes.Split(bl, []byte("\n")) {
			key, _, _ := bytes.Cut(line, []byte(":"))
			switch strings.TrimSpace(string(key)) {
			case "processor":
				line = []byte("processor\t: " + strconv.Itoa(i))
			case "siblings", "cpu cores":
				line = append(append([]byte{}, key...), []byte(": "+strconv.Itoa(n))...)
			case "core id", "apicid", "initial apicid":
				line = append(append([]byte{}, key...), []byte(": "+strconv.Itoa(i))...)
			}
			out.Write(line)
			out.WriteByte('\n')
		}
		out.WriteByte('\n')
	}
	return out.Bytes()
}

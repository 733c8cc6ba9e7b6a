package daemon

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// Version and Commit are set at link time:
//
//	go build -ldflags "-X github.com/warrenrl/warren/internal/daemon.Version=v0.1.0 -X github.com/warrenrl/warren/internal/daemon.Commit=abc123"
var (
	Version = "dev"
	Commit  = ""
)

// Version reports the daemon's version, backends and cgroup mode.
func (m *Manager) Version(ctx context.Context, req *warrenv1.VersionRequest) (_ *warrenv1.VersionResponse, err error) {
	defer m.observe("Version", &err)
	return &warrenv1.VersionResponse{
		Version:    Version,
		Commit:     Commit,
		Backends:   m.backendNames(),
		CgroupMode: CgroupMode(),
	}, nil
}

// CgroupMode detects the host's cgroup layout: "v2" (unified), "hybrid"
// (v1 controllers with a cgroup2 mount at /sys/fs/cgroup/unified) or "v1".
func CgroupMode() string {
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	return cgroupMode("/sys/fs/cgroup", string(mounts))
}

// cgroupMode decides from the cgroup mount's directory (root) and the
// mount table.
func cgroupMode(root, mountinfo string) string {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return "v2"
	}
	if slices.Contains(mountPoints(mountinfo, "cgroup2"), "/sys/fs/cgroup/unified") {
		return "hybrid"
	}
	return "v1"
}

// mountPoints lists the mount points of filesystems of type fstype in a
// /proc/self/mountinfo text.
func mountPoints(mountinfo, fstype string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(mountinfo))
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, p := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(p) < 1 || p[0] != fstype {
			continue
		}
		out = append(out, unescapeOctal(f[4]))
	}
	return out
}

// unescapeOctal undoes mountinfo's \NNN escapes (space, tab, newline, \).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

package container

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// journalless reports whether dir is on an ext4 filesystem without a
// journal, and names its block device. There the inode allocator skips
// inodes freed in the last 5 s (305 s while their inode table block is
// still dirty), reading each candidate's table block; the churn of
// sandbox writable layers makes every new inode scan past thousands (see
// docs/BENCHMARKS.md). The daemon warns about it at start.
func journalless(dir string) (string, bool) {
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) != nil || fs.Type != unix.EXT4_SUPER_MAGIC {
		return "", false
	}
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return "", false
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return "", false
	}
	var name string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "DEVNAME="); ok {
			name = v
		}
	}
	if name == "" || strings.ContainsAny(name, "/*?[") {
		return "", false
	}
	// jbd2 lists every journal it runs as <device>-<journal inode>.
	journals, _ := filepath.Glob("/proc/fs/jbd2/" + name + "-*")
	return name, len(journals) == 0
}

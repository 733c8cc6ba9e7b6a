package container

import (
	"context"
	"io/fs"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
)

var _ backend.DiskUser = (*sandbox)(nil)

// maxUsageEntries bounds one sandbox's usage walk: a tree of millions of
// entries is counted that far (enough to rank it among the largest), not
// walked for minutes while the node's disk is low.
const maxUsageEntries = 1 << 20

// DiskUsage is what the sandbox's writable layer takes of the node's
// disk (backend.DiskUser): with a disk of its own, the blocks its image
// holds (at most its limit; sparse, so one stat) and one inode; otherwise
// the blocks and entries of everything in its upper directory, walked without following symlinks
// and cut at maxUsageEntries or ctx's end. The daemon asks only when the
// node's disk is low.
func (s *sandbox) DiskUsage(ctx context.Context) (backend.LayerUsage, error) {
	if s.disk {
		var st unix.Stat_t
		if err := unix.Stat(s.b.diskImage(s.id), &st); err != nil {
			return backend.LayerUsage{}, fsErr(err, "stat disk image")
		}
		return backend.LayerUsage{Bytes: uint64(st.Blocks) * 512, Inodes: 1}, nil
	}
	var u backend.LayerUsage
	n := 0
	err := filepath.WalkDir(filepath.Join(s.b.stateDir(s.id), "upper"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a tree changing under the walk: count the rest
		}
		if n++; n > maxUsageEntries || ctx.Err() != nil {
			return filepath.SkipAll
		}
		u.Inodes++
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				u.Bytes += uint64(st.Blocks) * 512
			}
		}
		return nil
	})
	return u, err
}

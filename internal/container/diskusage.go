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
// holds (at most its limit; sparse, so one stat); otherwise the blocks of
// everything in its upper directory, walked without following symlinks
// and cut at maxUsageEntries or ctx's end. The daemon asks only when the
// node's disk is low.
func (s *sandbox) DiskUsage(ctx context.Context) (uint64, error) {
	if s.disk {
		var st unix.Stat_t
		if err := unix.Stat(s.b.diskImage(s.id), &st); err != nil {
			return 0, fsErr(err, "stat disk image")
		}
		return uint64(st.Blocks) * 512, nil
	}
	var total uint64
	n := 0
	err := filepath.WalkDir(filepath.Join(s.b.stateDir(s.id), "upper"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a tree changing under the walk: count the rest
		}
		if n++; n > maxUsageEntries || ctx.Err() != nil {
			return filepath.SkipAll
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				total += uint64(st.Blocks) * 512
			}
		}
		return nil
	})
	return total, err
}

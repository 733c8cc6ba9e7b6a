package untrusted

import (
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/tarx/inroot"
)

type devIno struct{ dev, ino uint64 }

func fstatID(fd int) (devIno, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return devIno{}, err
	}
	return devIno{st.Dev, st.Ino}, nil
}

// removeTree removes name below parentfd and everything in it, never
// following a symlink, at any depth with bounded descriptors (the
// daemon's remover: what it cannot remove it skips and names, so a
// rollback takes away as much as it can).
func removeTree(parentfd int, name string) error {
	return inroot.RemoveAll(parentfd, name)
}

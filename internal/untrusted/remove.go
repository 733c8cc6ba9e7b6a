package untrusted

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

type devIno struct{ dev, ino uint64 }

func fstatID(fd int) (devIno, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return devIno{}, err
	}
	return devIno{st.Dev, st.Ino}, nil
}

// removeTree removes name below parentfd and, if it is a directory,
// everything in it, without following symlinks. It holds two descriptors
// whatever the depth: it climbs back with "..", checking each parent's
// device and inode against the one it came from, so a tree moved during
// the walk is not mistaken for another.
func removeTree(parentfd int, name string) error {
	err := unix.Unlinkat(parentfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	top, err := fstatID(parentfd)
	if err != nil {
		return err
	}
	// parents[i] is the identity of the directory holding names[i].
	parents, names := []devIno{top}, []string{name}
	fd, err := unix.Openat(parentfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	for {
		sub, err := emptyDir(fd)
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("remove %s: %w", name, err)
		}
		if sub != "" {
			id, err := fstatID(fd)
			if err == nil {
				var next int
				next, err = unix.Openat(fd, sub, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err == nil {
					unix.Close(fd)
					fd = next
					parents, names = append(parents, id), append(names, sub)
					continue
				}
			}
			unix.Close(fd)
			return fmt.Errorf("remove %s: descend into %s: %w", name, sub, err)
		}
		last := len(names) - 1
		if last == 0 {
			unix.Close(fd)
			if err := unix.Unlinkat(parentfd, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
				return fmt.Errorf("remove %s: %w", name, err)
			}
			return nil
		}
		up, err := unix.Openat(fd, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("remove %s: climb: %w", name, err)
		}
		if id, err := fstatID(up); err != nil || id != parents[last] {
			unix.Close(up)
			return fmt.Errorf("remove %s: the tree moved while it was removed", name)
		}
		if err := unix.Unlinkat(up, names[last], unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
			unix.Close(up)
			return fmt.Errorf("remove %s: %s: %w", name, names[last], err)
		}
		fd, parents, names = up, parents[:last], names[:last]
	}
}

// emptyDir unlinks every non-directory in the directory fd and returns the
// name of a subdirectory it holds, or "" once it is empty.
func emptyDir(fd int) (string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	for {
		names, err := f.Readdirnames(256)
		for _, n := range names {
			uerr := unix.Unlinkat(fd, n, 0)
			if uerr == unix.EISDIR {
				return n, nil
			}
			if uerr != nil && uerr != unix.ENOENT {
				return "", fmt.Errorf("%s: %w", n, uerr)
			}
		}
		if err == io.EOF || len(names) == 0 {
			return "", nil
		}
		if err != nil {
			return "", err
		}
	}
}

// Package treecopy moves and copies directory trees exactly: owners,
// modes (setuid, sticky), times, extended attributes (overlayfs keeps
// opaque directories and redirects in trusted.overlay.*), hard links,
// symlinks, and device nodes and fifos (an overlay upper's whiteouts are
// 0:0 character devices).
//
// It is how a sandbox's writable layer leaves the node's disk for a
// checkpoint directory on another filesystem (a store shared by several
// nodes) and comes back on the node that restores it: a rename where
// both ends share a filesystem, a copy where they do not (EXDEV).
package treecopy

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Move renames src to dst, or, across filesystems, copies the tree to
// dst and removes src. A copy cut short removes what it made of dst, so
// src is then intact and dst absent.
func Move(src, dst string) error {
	err := os.Rename(src, dst)
	if err == nil || !errors.Is(err, unix.EXDEV) {
		return err
	}
	if err := Copy(src, dst); err != nil {
		_ = os.RemoveAll(dst)
		return err
	}
	return os.RemoveAll(src)
}

// Copy copies the tree at src to dst, which must not exist. Directory
// times are set once their contents are in.
func Copy(src, dst string) error {
	c := copier{links: map[inode]string{}}
	if err := c.copy(src, dst); err != nil {
		return err
	}
	// Children's creation changed their parents' mtimes: set them last,
	// deepest first.
	for i := len(c.dirs) - 1; i >= 0; i-- {
		d := c.dirs[i]
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, d.path, []unix.Timespec{d.st.Atim, d.st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("set times of %s: %w", d.path, err)
		}
	}
	return nil
}

type inode struct{ dev, ino uint64 }

type dirTimes struct {
	path string
	st   unix.Stat_t
}

type copier struct {
	links map[inode]string // first copy of each multiply-linked file
	dirs  []dirTimes
}

func (c *copier) copy(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &fs.PathError{Op: "lstat", Path: src, Err: err}
	}
	mode := st.Mode & 0o7777
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Mkdir(dst, 0o700); err != nil {
			return &fs.PathError{Op: "mkdir", Path: dst, Err: err}
		}
		if err := c.meta(src, dst, &st, mode); err != nil {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := c.copy(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		c.dirs = append(c.dirs, dirTimes{dst, st})
		return nil
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		return c.meta(src, dst, &st, 0)
	}
	if st.Nlink > 1 {
		key := inode{uint64(st.Dev), st.Ino}
		if first, ok := c.links[key]; ok {
			return os.Link(first, dst)
		}
		c.links[key] = dst
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := copyData(src, dst); err != nil {
			return err
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknod(dst, st.Mode&unix.S_IFMT|0o600, int(st.Rdev)); err != nil {
			return &fs.PathError{Op: "mknod", Path: dst, Err: err}
		}
	default:
		return fmt.Errorf("%s: unknown file type %#o", src, st.Mode&unix.S_IFMT)
	}
	return c.meta(src, dst, &st, mode)
}

// meta gives dst src's owner, extended attributes, mode (not for
// symlinks: mode 0) and, but for directories (Copy sets theirs last),
// times. The mode goes after the owner: chown clears setuid bits.
func (c *copier) meta(src, dst string, st *unix.Stat_t, mode uint32) error {
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return &fs.PathError{Op: "lchown", Path: dst, Err: err}
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, mode); err != nil {
			return &fs.PathError{Op: "chmod", Path: dst, Err: err}
		}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return nil
}

func copyData(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// io.Copy between files uses copy_file_range (reflinks and
	// server-side copies where the filesystems offer them).
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

func copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return &fs.PathError{Op: "llistxattr", Path: src, Err: err}
	}
	buf := make([]byte, 4096)
	for _, name := range names {
		n, err := unix.Lgetxattr(src, name, buf)
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Lgetxattr(src, name, nil); err == nil {
				buf = make([]byte, n)
				n, err = unix.Lgetxattr(src, name, buf)
			}
		}
		if err != nil {
			return &fs.PathError{Op: "lgetxattr " + name, Path: src, Err: err}
		}
		if err := unix.Lsetxattr(dst, name, buf[:n], 0); err != nil {
			return &fs.PathError{Op: "lsetxattr " + name, Path: dst, Err: err}
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	n, err := unix.Llistxattr(path, nil)
	if err != nil || n == 0 {
		return nil, err
	}
	buf := make([]byte, n)
	if n, err = unix.Llistxattr(path, buf); err != nil {
		return nil, err
	}
	var names []string
	start := 0
	for i, b := range buf[:n] {
		if b == 0 {
			if i > start {
				names = append(names, string(buf[start:i]))
			}
			start = i + 1
		}
	}
	return names, nil
}

// Package inroot resolves paths inside a directory tree the way a process
// chrooted into that tree would see them, so that host-side code (archive
// extraction, sandbox file operations) can never be tricked into touching a
// file outside the tree.
//
// Every multi-component resolution goes through openat2(2) with
// RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS relative to a descriptor of the
// root: "..", absolute paths and absolute or relative symlinks are all
// confined to the root, exactly like chroot(2) confines them. Operations on
// the final component of a path (create, remove, chmod, ...) are done with
// the *at(2) system calls relative to the descriptor of the resolved parent
// directory and never follow a symlink in that final component, so a tree
// that is modified concurrently (a running sandbox) cannot redirect them.
package inroot

import (
	"errors"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// ResolveFlags are the openat2 resolve flags used for every lookup.
const ResolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// maxRetries bounds the EAGAIN retries of openat2: RESOLVE_IN_ROOT returns
// EAGAIN when a concurrent rename or mount might have let ".." escape.
const maxRetries = 128

// Clean returns the canonical absolute form of p as seen from inside the
// root: relative paths are taken relative to "/", and "..", "." and
// duplicate slashes are removed lexically ("/../../x" is "/x").
func Clean(p string) string {
	return path.Clean("/" + p)
}

// Rel returns Clean(p) without its leading slash, as openat2 wants it
// relative to the root descriptor; the root itself is ".".
func Rel(p string) string {
	c := Clean(p)
	if c == "/" {
		return "."
	}
	return c[1:]
}

// Split returns the cleaned parent directory and the final component of
// p. For the root itself base is "".
func Split(p string) (dir, base string) {
	c := Clean(p)
	if c == "/" {
		return "/", ""
	}
	return path.Dir(c), path.Base(c)
}

// OpenRoot opens dir as a root descriptor (O_PATH). The caller closes it.
func OpenRoot(dir string) (int, error) {
	for {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: dir, Err: err}
		}
		return fd, nil
	}
}

// Open resolves p inside the root rootfd, following symlinks (including a
// symlink in the final component, unless flags has O_NOFOLLOW) inside the
// root only, and opens it with flags (O_CLOEXEC is always added) and mode.
// Errors are *os.PathError with the cleaned in-root path and the errno.
func Open(rootfd int, p string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: ResolveFlags,
	}
	if flags&(unix.O_CREAT|unix.O_TMPFILE) != 0 {
		how.Mode = uint64(mode & 07777)
	}
	rel := Rel(p)
	var err error
	for i := 0; i < maxRetries; i++ {
		var fd int
		fd, err = unix.Openat2(rootfd, rel, &how)
		if err == nil {
			return fd, nil
		}
		if err != unix.EAGAIN && err != unix.EINTR {
			break
		}
	}
	return -1, &os.PathError{Op: "open", Path: Clean(p), Err: err}
}

// OpenParent resolves the parent directory of p inside the root and
// returns an O_PATH descriptor of it and the final component of p. For the
// root itself it returns a descriptor of the root and base "".
func OpenParent(rootfd int, p string) (dirfd int, base string, err error) {
	dir, base := Split(p)
	fd, err := Open(rootfd, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// MkdirAll makes sure the directory p exists inside the root, creating
// missing components with mode (not subject to the umask), and returns an
// O_PATH descriptor of it. Existing symlinks on the way are followed inside
// the root. created reports whether the final directory was created.
func MkdirAll(rootfd int, p string, mode uint32) (fd int, created bool, err error) {
	fd, err = Open(rootfd, p, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, false, err
	}
	c := Clean(p)
	comps := strings.Split(c[1:], "/")
	cur, err := Open(rootfd, "/", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, false, err
	}
	for i, comp := range comps {
		prefix := "/" + strings.Join(comps[:i+1], "/")
		next, err := Open(rootfd, prefix, unix.O_PATH|unix.O_DIRECTORY, 0)
		created = false
		if errors.Is(err, unix.ENOENT) {
			merr := unix.Mkdirat(cur, comp, mode&07777)
			switch {
			case merr == nil:
				created = true
				next, err = unix.Openat(cur, comp, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err == nil {
					err = Chmod(next, mode&07777)
				} else {
					err = &os.PathError{Op: "open", Path: prefix, Err: err}
				}
			case merr == unix.EEXIST:
				// Lost a race, or a dangling symlink sits there: resolve
				// again and report what that finds.
				next, err = Open(rootfd, prefix, unix.O_PATH|unix.O_DIRECTORY, 0)
			default:
				err = &os.PathError{Op: "mkdir", Path: prefix, Err: merr}
			}
		}
		unix.Close(cur)
		if err != nil {
			if next >= 0 {
				unix.Close(next)
			}
			return -1, false, err
		}
		cur = next
	}
	return cur, created, nil
}

// Chmod sets the permission bits (including setuid, setgid and sticky) of
// the file fd refers to. fd may be an O_PATH descriptor; it must not be a
// symlink.
func Chmod(fd int, mode uint32) error {
	err := unix.Fchmodat(fd, "", mode&07777, unix.AT_EMPTY_PATH)
	if err == unix.EOPNOTSUPP || err == unix.ENOSYS || err == unix.EINVAL {
		// No fchmodat2 (Linux < 6.6): go through the descriptor's proc
		// link, which names exactly this inode.
		err = unix.Chmod(procFD(fd), mode&07777)
	}
	if err != nil {
		return &os.PathError{Op: "chmod", Path: procFD(fd), Err: err}
	}
	return nil
}

// Lchown sets the owner of the file fd refers to without following it if
// it is a symlink. fd may be an O_PATH descriptor.
func Lchown(fd, uid, gid int) error {
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "chown", Path: procFD(fd), Err: err}
	}
	return nil
}

// Lutimes sets the access and modification times of the file fd refers to
// (a symlink itself if fd is an O_PATH|O_NOFOLLOW descriptor of one).
func Lutimes(fd int, atime, mtime unix.Timespec) error {
	if err := unix.UtimesNanoAt(fd, "", []unix.Timespec{atime, mtime}, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: procFD(fd), Err: err}
	}
	return nil
}

// ProcPath returns a path that names the entry base of the directory
// dirfd without following base: for the path-only xattr calls on symlinks.
func ProcPath(dirfd int, base string) string {
	return procFD(dirfd) + "/" + base
}

func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// Lstat stats the entry base of dirfd without following it; base "" stats
// dirfd itself.
func Lstat(dirfd int, base string) (unix.Stat_t, error) {
	var st unix.Stat_t
	var err error
	if base == "" {
		err = unix.Fstatat(dirfd, "", &st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	} else {
		err = unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	return st, err
}

// Readlink reads the symlink base in dirfd.
func Readlink(dirfd int, base string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, base, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size > 1<<20 {
			return "", unix.ENAMETOOLONG
		}
	}
}

// ReadDirNames returns the sorted names in the directory fd (an O_PATH or
// regular descriptor; it is not consumed).
func ReadDirNames(fd int) ([]string, error) {
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dfd), "dir")
	defer f.Close()
	var names []string
	for {
		batch, err := f.Readdirnames(4096)
		names = append(names, batch...)
		if err == io.EOF || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	sort.Strings(names)
	return names, nil
}

// RemoveAll removes the entry base of dirfd and, if it is a directory,
// everything below it, never following symlinks. A missing entry is not an
// error.
func RemoveAll(dirfd int, base string) error {
	err := unix.Unlinkat(dirfd, base, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	err = unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.ENOTEMPTY && err != unix.EEXIST {
		return err
	}
	sub, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return err
	}
	err = removeChildren(sub)
	unix.Close(sub)
	if err != nil {
		return err
	}
	err = unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	if err == unix.ENOENT {
		return nil
	}
	return err
}

func removeChildren(fd int) error {
	// Loop: a concurrent writer may add entries while we delete.
	for attempt := 0; attempt < 16; attempt++ {
		names, err := ReadDirNames(fd)
		if err != nil {
			return err
		}
		if len(names) == 0 {
			return nil
		}
		for _, name := range names {
			if err := RemoveAll(fd, name); err != nil {
				return err
			}
		}
	}
	return unix.ENOTEMPTY
}

// Errno returns the errno at the bottom of err, or 0.
func Errno(err error) unix.Errno {
	var en unix.Errno
	if errors.As(err, &en) {
		return en
	}
	return 0
}

// Category maps the errno in err to an error category: ENOENT is
// NotFound, ENOSPC/EDQUOT/EFBIG Exhausted, EEXIST/ENOTEMPTY/EBUSY Conflict,
// path and type mistakes Invalid, descriptor exhaustion Unavailable, and
// anything else Internal.
func Category(err error) errdefs.Category {
	switch Errno(err) {
	case unix.ENOENT:
		return errdefs.NotFound
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		return errdefs.Exhausted
	case unix.EEXIST, unix.ENOTEMPTY, unix.EBUSY, unix.ETXTBSY:
		return errdefs.Conflict
	case unix.EISDIR, unix.ENOTDIR, unix.ELOOP, unix.ENAMETOOLONG, unix.EINVAL,
		unix.EXDEV, unix.EACCES, unix.EPERM, unix.EROFS, unix.ENXIO, unix.EMLINK:
		return errdefs.Invalid
	case unix.EMFILE, unix.ENFILE, unix.ENOMEM, unix.EAGAIN:
		return errdefs.Unavailable
	}
	return errdefs.Internal
}

// Describe returns a short human phrase for the errno in err ("no such
// file", "no space left on device", ...), or err's own text.
func Describe(err error) string {
	switch en := Errno(err); en {
	case unix.ENOENT:
		return "no such file"
	case unix.ENOSPC, unix.EDQUOT:
		return "no space left on device"
	case 0:
		return err.Error()
	default:
		return en.Error()
	}
}

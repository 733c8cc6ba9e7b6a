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
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
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
//
// It works at any depth with two descriptors besides dirfd: it descends
// with openat(O_NOFOLLOW) and comes back up with openat(".."), checked
// against the device and inode recorded on the way down, so neither the
// descriptor limit (a recursive walk holds one per level: os.RemoveAll
// gave up on a 21,000-level tree) nor PATH_MAX bounds it. Memory is the
// names of the directories still to descend into, one directory's worth
// per level. Entries it cannot remove are skipped and the walk goes on;
// the first failure is returned as a *RemoveError naming where it was.
func RemoveAll(dirfd int, base string) error { return RemoveAllUntil(dirfd, base, nil) }

// RemoveAllUntil is RemoveAll that gives up, with ErrStopped, once stop
// is closed (checked between directories and batches of entries): a
// daemon that stops does not wait for a tree of millions of entries.
func RemoveAllUntil(dirfd int, base string, stop <-chan struct{}) error {
	err := unix.Unlinkat(dirfd, base, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return &RemoveError{Path: base, Err: err}
	}
	err = unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.ENOTEMPTY && err != unix.EEXIST {
		return &RemoveError{Path: base, Err: err}
	}
	r := &remover{top: dirfd, stop: stop}
	r.run(base)
	if r.err != nil {
		return r.err
	}
	return nil
}

// ErrStopped: RemoveAllUntil's stop closed before it was done; what it
// had not removed yet is still there.
var ErrStopped = errors.New("removal stopped")

// stopped says whether the removal was asked to stop, and records it.
func (r *remover) stopped() bool {
	if r.stop == nil {
		return false
	}
	select {
	case <-r.stop:
		if r.err == nil || r.err.Err != ErrStopped {
			r.err = &RemoveError{Path: r.path(""), Err: ErrStopped, Failed: r.failed}
		}
		return true
	default:
		return false
	}
}

// RemoveTree removes the host path p and everything below it with
// RemoveAll (any depth, bounded descriptors, symlinks never followed); a
// missing p is no error. The error names p's directory and the first
// entry that could not be removed.
func RemoveTree(p string) error { return RemoveTreeUntil(p, nil) }

// RemoveTreeUntil is RemoveTree that stops once stop is closed
// (RemoveAllUntil).
func RemoveTreeUntil(p string, stop <-chan struct{}) error {
	dir, base := filepath.Split(filepath.Clean(p))
	if base == "" || base == "." || base == ".." || base == "/" {
		return &os.PathError{Op: "remove", Path: p, Err: unix.EINVAL}
	}
	if dir == "" {
		dir = "."
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := RemoveAllUntil(fd, base, stop); err != nil {
		return fmt.Errorf("in %s: %w", dir, err)
	}
	return nil
}

// RemoveError is a failure of RemoveAll: Path is the entry that could not
// be removed, relative to the directory RemoveAll was given (shortened in
// the middle when it is very deep), Err the errno or ErrMoved.
type RemoveError struct {
	Path string
	Err  error
	// Failed counts the entries that could not be removed.
	Failed int
}

func (e *RemoveError) Error() string {
	msg := "removing " + e.Path + ": " + e.Err.Error()
	if e.Failed > 1 {
		msg += " (and " + strconv.Itoa(e.Failed-1) + " more entries)"
	}
	return msg
}

func (e *RemoveError) Unwrap() error { return e.Err }

// ErrMoved reports that a directory a walk had descended through was no
// longer where the walk left it when it came back up: someone renamed it
// meanwhile (a live sandbox). The walk stops rather than carry on
// elsewhere.
var ErrMoved = errors.New("a directory on the way was moved during the walk")

// removeLevel is one directory on the remover's path below top.
type removeLevel struct {
	name     string   // its name in its parent
	dev, ino uint64   // its identity, checked on the way back up
	subdirs  []string // non-empty subdirectories still to descend into
	passes   int
	// failed is set once an entry here could not be removed: listing
	// again would only meet it again.
	failed bool
}

type remover struct {
	top    int
	stop   <-chan struct{} // nil: never stop
	stack  []removeLevel
	err    *RemoveError
	failed int
}

// fail records the failure of the entry name in the current directory.
func (r *remover) fail(name string, err error) {
	r.failed++
	if r.err == nil {
		r.err = &RemoveError{Path: r.path(name), Err: err}
	}
	r.err.Failed = r.failed
}

// path names name in the current directory relative to top, eliding the
// middle of a deep path.
func (r *remover) path(name string) string {
	var parts []string
	for i, lv := range r.stack {
		if len(r.stack) > 64 && i == 32 {
			parts = append(parts, "...")
		}
		if len(r.stack) > 64 && i >= 32 && i < len(r.stack)-32 {
			continue
		}
		parts = append(parts, lv.name)
	}
	if name != "" {
		parts = append(parts, name)
	}
	return strings.Join(parts, "/")
}

// maxPasses bounds the listings of one directory: a concurrent writer may
// add entries while we delete (16, as the recursive version allowed).
const maxPasses = 16

func (r *remover) run(base string) {
	cur, ok := r.descend(r.top, base)
	if !ok {
		return
	}
	for len(r.stack) > 0 {
		if r.stopped() {
			break
		}
		lv := &r.stack[len(r.stack)-1]
		if len(lv.subdirs) == 0 {
			if lv.passes < maxPasses && !lv.failed && r.pass(cur, lv) {
				continue
			}
			// Done with this directory: back up and remove it.
			parent, ok := r.up(cur)
			if !ok {
				return
			}
			cur = parent
			name := r.stack[len(r.stack)-1].name
			r.stack = r.stack[:len(r.stack)-1]
			if err := unix.Unlinkat(cur, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
				if !r.failedBelow(err) {
					r.fail(name, err)
				}
			}
			continue
		}
		name := lv.subdirs[len(lv.subdirs)-1]
		lv.subdirs = lv.subdirs[:len(lv.subdirs)-1]
		sub, ok := r.descend(cur, name)
		if ok {
			unix.Close(cur)
			cur = sub
		}
	}
	if cur != r.top {
		unix.Close(cur)
	}
}

// failedBelow tells an rmdir that failed because the directory is not
// empty after something inside it could not be removed (already
// recorded) from a failure of its own.
func (r *remover) failedBelow(err error) bool {
	return r.err != nil && (err == unix.ENOTEMPTY || err == unix.EEXIST)
}

// descend opens the directory name of cur for reading and pushes it.
func (r *remover) descend(cur int, name string) (int, bool) {
	fd, err := unix.Openat(cur, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return -1, false
	}
	if err == unix.ENOTDIR || err == unix.ELOOP {
		// Swapped for a file or symlink meanwhile.
		if err := unix.Unlinkat(cur, name, 0); err != nil && err != unix.ENOENT {
			r.fail(name, err)
		}
		return -1, false
	}
	var st unix.Stat_t
	if err == nil {
		if err = unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		r.fail(name, err)
		return -1, false
	}
	r.stack = append(r.stack, removeLevel{name: name, dev: st.Dev, ino: st.Ino})
	return fd, true
}

// up returns a descriptor of the parent of the directory on top of the
// stack (cur), closing cur, or false if the parent is not the one the
// walk came down through.
func (r *remover) up(cur int) (int, bool) {
	if len(r.stack) == 1 {
		unix.Close(cur)
		return r.top, true
	}
	parent := r.stack[len(r.stack)-2]
	fd, err := unix.Openat(cur, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	unix.Close(cur)
	if err == nil {
		var st unix.Stat_t
		if err = unix.Fstat(fd, &st); err == nil && (st.Dev != parent.dev || st.Ino != parent.ino) {
			err = ErrMoved
		}
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		r.fail("..", err)
		return -1, false
	}
	return fd, true
}

// pass lists the directory cur once from the start, removing what it
// can and noting the non-empty subdirectories. It reports whether it saw
// anything removable, so that another pass may find what a concurrent
// writer added.
func (r *remover) pass(cur int, lv *removeLevel) bool {
	lv.passes++
	if _, err := unix.Seek(cur, 0, io.SeekStart); err != nil {
		r.fail("", err)
		return false
	}
	buf := make([]byte, 32<<10)
	progress := false
	for {
		n, err := unix.Getdents(cur, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			r.fail("", err)
			return false
		}
		if n <= 0 || r.stopped() {
			return progress
		}
		for _, name := range direntNames(buf[:n]) {
			if r.removeEntry(cur, lv, name) {
				progress = true
			}
		}
	}
}

// removeEntry removes name in cur if it is a file or an empty directory,
// queues it if it is a directory with entries, and reports whether it
// did either.
func (r *remover) removeEntry(cur int, lv *removeLevel, name string) bool {
	err := unix.Unlinkat(cur, name, 0)
	if err == nil || err == unix.ENOENT {
		return err == nil
	}
	if err == unix.EISDIR || err == unix.EPERM {
		rerr := unix.Unlinkat(cur, name, unix.AT_REMOVEDIR)
		switch rerr {
		case nil:
			return true
		case unix.ENOENT:
			return false
		case unix.ENOTEMPTY, unix.EEXIST:
			lv.subdirs = append(lv.subdirs, name)
			return true
		case unix.ENOTDIR:
			// Not a directory: the unlink's error is the one to report.
		default:
			err = rerr
		}
	}
	lv.failed = true
	r.fail(name, err)
	return false
}

// direntNames parses a getdents64 buffer, leaving out "." and "..".
func direntNames(buf []byte) []string {
	var names []string
	for len(buf) > 0 {
		reclen := int(binary.NativeEndian.Uint16(buf[16:18]))
		if reclen == 0 || reclen > len(buf) {
			break
		}
		name := buf[19:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if s := string(name); s != "." && s != ".." {
			names = append(names, s)
		}
		buf = buf[reclen:]
	}
	return names
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
// path and type mistakes Invalid, descriptor exhaustion Unavailable, a
// tree moved under a walk (ErrMoved) Conflict, and anything else
// Internal.
func Category(err error) errdefs.Category {
	if errors.Is(err, ErrMoved) {
		return errdefs.Conflict
	}
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

// Package sandboxfs performs file operations inside a sandbox's root
// filesystem from the host.
//
// Paths are sandbox paths: relative ones are relative to "/", and "." and
// ".." are removed lexically first ("/../../x" is "/x"). Every resolution
// then happens inside the root with openat2(RESOLVE_IN_ROOT), so symlinks
// are followed the way a process in the sandbox would follow them: a
// symlink /x -> /etc/shadow reads the sandbox's /etc/shadow, never the
// host's, and nothing a sandbox process does to its tree can make an
// operation touch a host file outside the root.
//
// Read, write, list and archive operations follow a symlink in the final
// component (inside the root); Stat and Remove act on the link itself.
// Files and directories are created owned by the daemon's uid and gid.
//
// The root is the sandbox's own, mounts included, and operations run as
// the daemon: nothing on a kernel pseudo-filesystem (the sandbox's /proc,
// /sys, devpts, cgroupfs, ...) is read, written, listed, stat'ed,
// created or removed (PermissionDenied, see guard.go), and reads and
// writes open regular files only, so a device node or FIFO the sandbox
// planted is refused (Invalid) without being opened. List returns pages
// in directory order (see List).
//
// Errors carry errdefs categories: a missing file is NotFound ("no such
// file: /path"), a type mismatch Invalid, an existing target Conflict, a
// full disk Exhausted, a pseudo-filesystem PermissionDenied.
package sandboxfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// MaxRead is the most ReadFile returns in one call.
const MaxRead = 64 << 20

// FS operates on the files of one sandbox root.
type FS struct {
	root string
	ids  *IDMap // nil: the sandbox's ids are the host's
}

// New returns an FS for root, the host path of a sandbox's root
// filesystem (an overlay mount). Nothing is opened until an operation.
func New(root string) *FS { return &FS{root: root} }

// Root returns the host path given to New.
func (f *FS) Root() string { return f.root }

// FileInfo describes one file.
type FileInfo struct {
	Name       string // base name; "/" for the root
	Path       string // cleaned sandbox path
	Size       int64
	Mode       os.FileMode // Go file mode: type bits, permissions, setuid, setgid, sticky
	IsDir      bool
	IsSymlink  bool
	LinkTarget string // for symlinks, the target as stored
	MTime      time.Time
	Type       string // "file", "dir", "symlink" or "other"
}

// UnixPerm returns the permission bits of Mode in Unix form (0o7777,
// setuid/setgid/sticky included), as the API reports them.
func (fi FileInfo) UnixPerm() uint32 { return UnixPerm(fi.Mode) }

// UnixPerm converts a Go file mode to Unix permission bits (0o7777). Raw
// Unix bits 0o7000 in m are honoured too, so os.FileMode(0o4755) and
// 0o755|os.ModeSetuid both give 0o4755.
func UnixPerm(m os.FileMode) uint32 {
	p := uint32(m) & 0o7777
	if m&os.ModeSetuid != 0 {
		p |= unix.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		p |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		p |= unix.S_ISVTX
	}
	return p
}

func goMode(m uint32) os.FileMode {
	fm := os.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		fm |= os.ModeDir
	case unix.S_IFLNK:
		fm |= os.ModeSymlink
	case unix.S_IFCHR:
		fm |= os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		fm |= os.ModeDevice
	case unix.S_IFIFO:
		fm |= os.ModeNamedPipe
	case unix.S_IFSOCK:
		fm |= os.ModeSocket
	}
	if m&unix.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// pathErr turns a filesystem error about sandbox path p into a
// categorised error naming the path the caller asked for.
func pathErr(p string, err error) error {
	switch inroot.Errno(err) {
	case unix.ENOENT:
		return errdefs.NotFoundf("no such file: %s", p)
	case unix.ENOTDIR:
		return errdefs.Invalidf("not a directory: %s", p)
	case unix.EISDIR:
		return errdefs.Invalidf("is a directory: %s", p)
	case unix.EEXIST:
		return errdefs.AlreadyExistsf("already exists: %s", p)
	case unix.ENOTEMPTY:
		return errdefs.Conflictf("directory not empty: %s", p)
	case unix.EBUSY:
		return errdefs.Conflictf("busy: %s", p)
	case unix.ELOOP:
		return errdefs.Invalidf("too many levels of symbolic links: %s", p)
	case unix.ENAMETOOLONG:
		return errdefs.Invalidf("file name too long: %s", p)
	case unix.ENOSPC, unix.EDQUOT:
		return errdefs.Exhaustedf("no space left on device: %s", p)
	case unix.EFBIG:
		return errdefs.Exhaustedf("file too large: %s", p)
	case unix.ENXIO:
		return errdefs.Invalidf("not a regular file: %s", p)
	case unix.EACCES, unix.EPERM:
		return errdefs.Invalidf("permission denied: %s", p)
	case unix.EROFS:
		return errdefs.Invalidf("read-only file system: %s", p)
	}
	return errdefs.New(inroot.Category(err), "%s: %w", p, err)
}

// enter checks ctx, then opens the root; the caller closes the fd.
func (f *FS) enter(ctx context.Context) (int, error) {
	if err := ctxErr(ctx); err != nil {
		return -1, err
	}
	return f.openRoot()
}

func (f *FS) openRoot() (int, error) {
	fd, err := inroot.OpenRoot(f.root)
	if err != nil {
		if inroot.Errno(err) == unix.ENOENT {
			return -1, errdefs.Unavailablef("sandbox root filesystem is gone")
		}
		return -1, errdefs.Wrap(errdefs.Internal, err, "sandbox root filesystem")
	}
	return fd, nil
}

func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return errdefs.Wrap(errdefs.DeadlineExceeded, err, "file operation")
		}
		return err
	}
	return nil
}

const ioBuf = 256 << 10

// WriteFile writes r to the file at p. It truncates the file, or appends
// to it when append is set; a missing file is created with mode (0 means
// 0644; the umask does not apply), and with mkParents missing parent
// directories are created 0755. The mode of an existing file is left
// alone. A symlink at p is followed inside the sandbox. Writing to "/", a
// directory or a non-regular file is Invalid.
func (f *FS) WriteFile(ctx context.Context, p string, r io.Reader, mode os.FileMode, append, mkParents bool) error {
	return f.asSandboxRoot(func() error { return f.writeFile(ctx, p, r, mode, append, mkParents) })
}

func (f *FS) writeFile(ctx context.Context, p string, r io.Reader, mode os.FileMode, append, mkParents bool) error {
	cp := inroot.Clean(p)
	if cp == "/" {
		return errdefs.Invalidf("cannot write to /")
	}
	rootfd, err := f.enter(ctx)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	perm := UnixPerm(mode)
	if perm == 0 {
		perm = 0o644
	}
	if mkParents {
		dfd, err := mkdirAll(rootfd, path.Dir(cp), 0o755)
		if err != nil {
			return err
		}
		unix.Close(dfd)
	}
	flags := unix.O_WRONLY | unix.O_NONBLOCK
	if append {
		flags |= unix.O_APPEND
	} else {
		flags |= unix.O_TRUNC
	}
	fd, created, err := openForWrite(rootfd, cp, flags, perm)
	if err != nil {
		return err
	}
	file := os.NewFile(uintptr(fd), cp)
	defer file.Close()
	if created {
		if err := inroot.Chmod(fd, perm); err != nil {
			return pathErr(cp, err)
		}
	}
	buf := make([]byte, ioBuf)
	for {
		if err := ctxErr(ctx); err != nil {
			return err
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, werr := file.Write(buf[:n]); werr != nil {
				return pathErr(cp, werr)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("write %s: reading content: %w", cp, rerr)
		}
	}
	if err := file.Close(); err != nil {
		return pathErr(cp, err)
	}
	return nil
}

// ReadFile reads up to length bytes of the file at p from offset off;
// length 0 means to the end of the file, capped at MaxRead. A length over
// MaxRead is Exhausted. It returns the data, the file's full size, and
// whether the data reaches the end of the file.
func (f *FS) ReadFile(ctx context.Context, p string, off, length int64) (data []byte, size int64, eof bool, err error) {
	cp := inroot.Clean(p)
	if off < 0 || length < 0 {
		return nil, 0, false, errdefs.Invalidf("negative offset or length reading %s", cp)
	}
	if length > MaxRead {
		return nil, 0, false, errdefs.Exhaustedf("read of %d bytes exceeds the cap of %d bytes: read in chunks with an offset", length, MaxRead)
	}
	rootfd, err := f.enter(ctx)
	if err != nil {
		return nil, 0, false, err
	}
	defer unix.Close(rootfd)
	fd, st, err := openRegular(rootfd, cp, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, 0, false, err
	}
	file := os.NewFile(uintptr(fd), cp)
	defer file.Close()
	size = st.Size
	if off >= size {
		return []byte{}, size, true, nil
	}
	want := size - off
	if length > 0 && length < want {
		want = length
	}
	if want > MaxRead {
		want = MaxRead
	}
	data = make([]byte, want)
	n, err := file.ReadAt(data, off)
	if err != nil && err != io.EOF {
		return nil, 0, false, pathErr(cp, err)
	}
	data = data[:n]
	return data, size, off+int64(n) >= size, nil
}

func info(dirfd int, base, p string, st unix.Stat_t) FileInfo {
	name := base
	if p == "/" {
		name = "/"
	}
	fi := FileInfo{
		Name:  name,
		Path:  p,
		Size:  st.Size,
		Mode:  goMode(st.Mode),
		MTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.Type = "file"
	case unix.S_IFDIR:
		fi.Type, fi.IsDir = "dir", true
	case unix.S_IFLNK:
		fi.Type, fi.IsSymlink = "symlink", true
		if base != "" {
			fi.LinkTarget, _ = inroot.Readlink(dirfd, base)
		}
	default:
		fi.Type = "other"
	}
	return fi
}

// Stat describes the file at p; a symlink in the final component is
// described, not followed (its target is in LinkTarget).
func (f *FS) Stat(ctx context.Context, p string) (FileInfo, error) {
	cp := inroot.Clean(p)
	rootfd, err := f.enter(ctx)
	if err != nil {
		return FileInfo{}, err
	}
	defer unix.Close(rootfd)
	dirfd, base, st, err := lstatIn(rootfd, cp)
	if err != nil {
		return FileInfo{}, err
	}
	defer unix.Close(dirfd)
	return info(dirfd, base, cp, st), nil
}

// lstatIn opens the parent directory of the sandbox path cp and lstats
// its final component (a symlink is not followed); the caller closes
// dirfd. The entry must not be on a pseudo-filesystem.
func lstatIn(rootfd int, cp string) (dirfd int, base string, st unix.Stat_t, err error) {
	dirfd, base, err = inroot.OpenParent(rootfd, cp)
	if err != nil {
		return -1, "", st, checkFailed(rootfd, cp, err)
	}
	fd := dirfd
	if base != "" {
		fd, err = unix.Openat(dirfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(dirfd)
			return -1, "", st, checkFailed(rootfd, cp, err)
		}
		defer unix.Close(fd)
	}
	if err = checkFS(fd, cp); err != nil {
		unix.Close(dirfd)
		return -1, "", st, err
	}
	if err = unix.Fstat(fd, &st); err != nil {
		unix.Close(dirfd)
		return -1, "", st, pathErr(cp, err)
	}
	return dirfd, base, st, nil
}

// Mkdir creates the directory p with mode (0 means 0755; the umask does
// not apply). Without parents a missing parent is NotFound and an
// existing p Conflict; with parents missing parents are created 0755 and
// an existing directory (or symlink to one) is fine.
func (f *FS) Mkdir(ctx context.Context, p string, mode os.FileMode, parents bool) error {
	return f.asSandboxRoot(func() error { return f.mkdir(ctx, p, mode, parents) })
}

func (f *FS) mkdir(ctx context.Context, p string, mode os.FileMode, parents bool) error {
	cp := inroot.Clean(p)
	perm := UnixPerm(mode)
	if perm == 0 {
		perm = 0o755
	}
	rootfd, err := f.enter(ctx)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	if cp == "/" {
		if parents {
			return nil
		}
		return errdefs.AlreadyExistsf("already exists: /")
	}
	dir, base := inroot.Split(cp)
	var dirfd int
	if parents {
		dirfd, err = mkdirAll(rootfd, dir, 0o755)
	} else {
		dirfd, err = openDirChecked(rootfd, dir)
	}
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.NotFound {
			return errdefs.NotFoundf("no such directory: %s (creating %s)", dir, cp)
		}
		return err
	}
	defer unix.Close(dirfd)
	if err := checkFS(dirfd, dir); err != nil {
		return err
	}
	if err := unix.Mkdirat(dirfd, base, perm&0o777); err != nil {
		if err == unix.EEXIST && parents {
			if fd, oerr := openDirChecked(rootfd, cp); oerr == nil {
				unix.Close(fd)
				return nil
			} else if errdefs.CategoryOf(oerr) == errdefs.PermissionDenied {
				return oerr
			}
		}
		return pathErr(cp, err)
	}
	fd, err := unix.Openat(dirfd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathErr(cp, err)
	}
	defer unix.Close(fd)
	if err := inroot.Chmod(fd, perm); err != nil {
		return pathErr(cp, err)
	}
	return nil
}

// Remove removes the file, symlink (not its target) or empty directory
// at p; with recursive, a directory and everything below it. A non-empty
// directory without recursive is Conflict; "/" is Invalid.
func (f *FS) Remove(ctx context.Context, p string, recursive bool) error {
	cp := inroot.Clean(p)
	if cp == "/" {
		return errdefs.Invalidf("cannot remove /")
	}
	rootfd, err := f.enter(ctx)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	dirfd, base, st, err := lstatIn(rootfd, cp)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	if err := checkFS(dirfd, path.Dir(cp)); err != nil {
		return err
	}
	if err := notMountPoint(dirfd, base, cp); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		err = unix.Unlinkat(dirfd, base, 0)
	} else if recursive {
		err = inroot.RemoveAll(dirfd, base)
	} else {
		err = unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return pathErr(cp, err)
	}
	return nil
}

// checkRoot reports Unavailable when the root is gone (the sandbox was
// deleted).
func (f *FS) checkRoot() error {
	if _, err := os.Stat(f.root); err != nil {
		return errdefs.Unavailablef("sandbox root filesystem is gone")
	}
	return nil
}

// TarOptions changes what TarOut writes.
type TarOptions struct {
	// Sparse writes files with holes as PAX sparse entries
	// (tarx.CreateOptions): what the daemon does when the client asks
	// for it (the archive API's sparse=1; the SDKs' download-to-disk
	// calls ask), not by default, since busybox tar cannot read them.
	Sparse bool `json:"sparse,omitempty"`
}

// TarOut writes the tree at p (or the single file) to w as a tar stream
// with names relative to p (see tarx.Create). Symlinks inside the tree are
// archived, not followed. A tree or file on a pseudo-filesystem is
// PermissionDenied; tarx.Create does not leave the filesystem it starts
// on, so a check of the start is enough.
func (f *FS) TarOut(ctx context.Context, p string, w io.Writer, o TarOptions) error {
	if err := f.checkRoot(); err != nil {
		return err
	}
	cp := inroot.Clean(p)
	rootfd, err := f.enter(ctx)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	fd, st, err := openPath(rootfd, cp)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// Archive the very directory checked: nothing the sandbox renames
		// after the check redirects the walk.
		return tarx.CreateWith(ctx, "/proc/self/fd/"+strconv.Itoa(fd), w, "/", tarx.CreateOptions{MapID: f.mapID(), Sparse: o.Sparse})
	}
	// A single file is resolved again by name (tarx takes a directory as
	// its root); a swap between check and open stays inside the sandbox.
	return tarx.CreateWith(ctx, f.root, w, cp, tarx.CreateOptions{MapID: f.mapID(), Sparse: o.Sparse})
}

// TarIn extracts the tar stream r (plain or gzip) into the directory p,
// created if missing. Entry paths stay inside p; symlinks met on the way
// resolve inside the sandbox. Setuid/setgid bits and file capabilities are
// stripped, device nodes and fifos are rejected (Invalid), owners are not
// kept (files belong to the daemon's uid). On error, what was extracted so
// far stays.
func (f *FS) TarIn(ctx context.Context, p string, r io.Reader) error {
	return f.asSandboxRoot(func() error { return f.tarIn(ctx, p, r) })
}

func (f *FS) tarIn(ctx context.Context, p string, r io.Reader) error {
	if err := f.checkRoot(); err != nil {
		return err
	}
	cp := inroot.Clean(p)
	rootfd, err := f.enter(ctx)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	fd, err := mkdirAll(rootfd, cp, 0o755)
	if err != nil {
		return err
	}
	unix.Close(fd)
	_, err = tarx.Extract(ctx, f.root, r, tarx.Options{Dir: cp, Guard: guardEntry})
	return err
}

// guardEntry keeps each archive entry, whatever symlinks the sandbox
// planted below the extraction directory, off kernel filesystems and off
// mount points (replacing one from the daemon's namespace would detach
// it).
func guardEntry(dirfd int, base, name string) error {
	what := fmt.Sprintf("archive entry %q", name)
	if err := checkFS(dirfd, what); err != nil {
		return err
	}
	err := notMountPoint(dirfd, base, what)
	if errdefs.CategoryOf(err) == errdefs.NotFound {
		return nil // nothing there yet
	}
	return err
}

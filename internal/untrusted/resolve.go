package untrusted

import (
	"errors"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// resolveFlags never follow a symlink and never leave the starting
// directory.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// chunkLen bounds the path handed to one openat2: PATH_MAX is 4,096 and a
// 30,000-deep tree has 60,000-byte names, so parents are walked in pieces.
const chunkLen = 2048

// openat2 opens rel below dirfd without following symlinks (a final
// symlink is ELOOP with O_DIRECTORY, opened itself with O_PATH), retrying
// EINTR/EAGAIN (openat2 returns EAGAIN when a rename races the lookup).
func openat2(dirfd int, rel string, flags int) (int, error) {
	// O_NOFOLLOW only for non-directories: it would turn a final
	// symlink into ENOTDIR, where RESOLVE_NO_SYMLINKS says ELOOP.
	if flags&unix.O_DIRECTORY == 0 {
		flags |= unix.O_NOFOLLOW
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveFlags}
	var err error
	for range 64 {
		var fd int
		fd, err = unix.Openat2(dirfd, rel, &how)
		if err == nil {
			return fd, nil
		}
		if err != unix.EINTR && err != unix.EAGAIN {
			break
		}
	}
	return -1, err
}

// openDirChunked opens the existing directory rel (clean, relative, may be
// long) below dirfd, a chunk of components at a time. The caller closes
// the result.
func openDirChunked(dirfd int, rel string) (int, error) {
	cur := dirfd
	for {
		piece, rest := rel, ""
		if len(rel) > chunkLen {
			i := strings.LastIndexByte(rel[:chunkLen], '/')
			if i <= 0 {
				return -1, unix.ENAMETOOLONG
			}
			piece, rest = rel[:i], rel[i+1:]
		}
		if piece == "" {
			piece = "."
		}
		fd, err := openat2(cur, piece, unix.O_PATH|unix.O_DIRECTORY)
		if cur != dirfd {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		if rest == "" {
			return fd, nil
		}
		cur, rel = fd, rest
	}
}

// destError explains why the destination path p cannot be used.
func destError(p, comp string, err error) error {
	switch inroot.Errno(err) {
	case unix.ELOOP:
		return errdefs.Invalidf("destination %s: %s is a symlink; symlinks in a destination are never followed (a tree copied out of a sandbox may have planted it): pass a resolved path, e.g. $(realpath %s)", p, comp, p)
	case unix.ENOTDIR:
		return errdefs.Invalidf("destination %s: %s is not a directory", p, comp)
	case unix.ENOENT:
		return errdefs.NotFoundf("destination %s: %s does not exist", p, comp)
	}
	return errdefs.New(inroot.Category(err), "destination %s: %s: %w", p, comp, err)
}

// destPath is a destination resolved without following symlinks.
type destPath struct {
	parentfd int    // O_PATH descriptor of the parent of the final component
	base     string // the final component; "" when the path is / or .
	// createdfd/createdName name the first component this resolution
	// created (createdfd is a descriptor of its parent), or -1/"".
	createdfd   int
	createdName string
}

func (d *destPath) close() {
	if d.createdfd >= 0 && d.createdfd != d.parentfd {
		unix.Close(d.createdfd)
	}
	unix.Close(d.parentfd)
}

// removeCreated removes what the resolution created.
func (d *destPath) removeCreated() error {
	if d.createdfd < 0 {
		return nil
	}
	return removeTree(d.createdfd, d.createdName)
}

// components splits p into an anchor ("/" or ".") and its clean
// components. A relative path that climbs with ".." is made absolute with
// getcwd(2), which the kernel answers without symlinks.
func components(p string) (anchor string, comps []string, err error) {
	if p == "" {
		return "", nil, errdefs.Invalidf("empty destination path")
	}
	c := filepath.Clean(p)
	if !filepath.IsAbs(c) && (c == ".." || strings.HasPrefix(c, "../")) {
		wd, err := unix.Getwd()
		if err != nil {
			return "", nil, errdefs.Wrap(errdefs.Internal, err, "getcwd")
		}
		c = filepath.Join(wd, c)
	}
	anchor = "."
	if filepath.IsAbs(c) {
		anchor, c = "/", strings.TrimLeft(c, "/")
	}
	if c == "" || c == "." {
		return anchor, nil, nil
	}
	return anchor, strings.Split(c, "/"), nil
}

// resolveParent resolves every component of p but the last, one at a
// time, refusing symlinks; with mkdir, missing ones are created (0o755).
func resolveParent(p string, mkdir bool) (*destPath, error) {
	anchor, comps, err := components(p)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(anchor, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, destError(p, anchor, err)
	}
	d := &destPath{parentfd: fd, createdfd: -1}
	if len(comps) == 0 {
		return d, nil
	}
	for i, c := range comps[:len(comps)-1] {
		next, created, err := openOrMkdir(d.parentfd, c, mkdir)
		if err != nil {
			_ = d.removeCreated()
			d.close()
			return nil, destError(p, strings.Join(comps[:i+1], "/"), err)
		}
		if created && d.createdfd < 0 {
			d.createdfd, d.createdName = d.parentfd, c
		} else if d.parentfd != d.createdfd {
			unix.Close(d.parentfd)
		}
		d.parentfd = next
	}
	d.base = comps[len(comps)-1]
	return d, nil
}

// openOrMkdir opens the directory name below dirfd (O_PATH, no symlinks),
// creating it first when missing and mkdir is set.
func openOrMkdir(dirfd int, name string, mkdir bool) (fd int, created bool, err error) {
	for range 8 {
		fd, err = openat2(dirfd, name, unix.O_PATH|unix.O_DIRECTORY)
		if err != unix.ENOENT || !mkdir {
			return fd, created, err
		}
		err = unix.Mkdirat(dirfd, name, 0o755)
		if err == nil {
			created = true
		} else if err != unix.EEXIST {
			return -1, false, err
		}
	}
	return -1, false, err
}

// IsDir reports whether p is an existing directory, resolving p without
// following any symlink: a missing p is (false, nil); a symlink anywhere in
// p, its final component included, is an Invalid error.
func IsDir(p string) (bool, error) {
	d, err := resolveParent(p, false)
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.NotFound {
			return false, nil
		}
		return false, err
	}
	defer d.close()
	if d.base == "" {
		return true, nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.parentfd, d.base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, destError(p, p, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return false, destError(p, p, unix.ELOOP)
	case unix.S_IFDIR:
		return true, nil
	}
	return false, nil
}

package untrusted

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// Extract extracts the tar stream r into the directory dest, creating dest
// and its missing parents. See the package documentation for what it
// refuses and what it promises; on error everything it created is gone.
func Extract(ctx context.Context, dest string, r io.Reader, opts Options) (st Stats, err error) {
	dp, err := resolveParent(dest, true)
	if err != nil {
		return st, err
	}
	defer dp.close()
	destfd := dp.parentfd
	if dp.base != "" {
		fd, created, err := openOrMkdir(dp.parentfd, dp.base, true)
		if err != nil {
			_ = dp.removeCreated()
			return st, destError(dest, dest, err)
		}
		defer unix.Close(fd)
		if created && dp.createdfd < 0 {
			dp.createdfd, dp.createdName = dp.parentfd, dp.base
		}
		destfd = fd
	}
	// Registered after the descriptors' closes, so it runs before them.
	var undo cleanup.Cleanup
	defer func() {
		if err != nil {
			if cerr := undo.Clean(); cerr != nil {
				err = fmt.Errorf("%w (removing what was extracted also failed: %v)", err, cerr)
			}
		}
	}()
	undo.Add(dp.removeCreated)
	x := newExtractor(opts)
	x.t = newTree(destfd, dp.createdfd >= 0)
	undo.Add(x.t.rollback)
	defer x.t.close()
	s, err := newStream(ctx, r)
	if err != nil {
		return st, err
	}
	for {
		hdr, err := s.next()
		if err == io.EOF {
			return x.st, nil
		}
		if err != nil {
			return x.st, err
		}
		if err := x.count(hdr); err != nil {
			return x.st, err
		}
		if err := x.entry(s, hdr); err != nil {
			return x.st, err
		}
	}
}

type extractor struct {
	opts                 Options
	maxBytes, maxEntries int64
	st                   Stats
	t                    *tree
	// files are the regular files this extraction created, the only
	// allowed hard-link targets.
	files map[devIno]struct{}
	buf   []byte
}

func newExtractor(opts Options) *extractor {
	x := &extractor{opts: opts, files: map[devIno]struct{}{}, buf: make([]byte, copyBuf)}
	x.maxBytes, x.maxEntries = opts.limits()
	return x
}

// count applies the entry and byte budgets before anything is written.
func (x *extractor) count(hdr *tar.Header) error {
	x.st.Entries++
	if x.maxEntries > 0 && x.st.Entries > x.maxEntries {
		return errdefs.Exhaustedf("the archive has more than %d entries, the limit; raise it with MaxEntries (warren sandbox cp --max-entries) if you trust this sandbox's output", x.maxEntries)
	}
	if isRegular(hdr.Typeflag) {
		if hdr.Size < 0 {
			return errdefs.Invalidf("archive entry %q: negative size", hdr.Name)
		}
		if x.maxBytes > 0 && x.st.Bytes+hdr.Size > x.maxBytes {
			return errdefs.Exhaustedf("archive entry %q (%d bytes): the archive's files exceed the limit of %d bytes; raise it with MaxBytes (warren sandbox cp --max-bytes) if you trust this sandbox's output", hdr.Name, hdr.Size, x.maxBytes)
		}
		x.st.Bytes += hdr.Size
	}
	return nil
}

func isRegular(t byte) bool {
	return t == tar.TypeReg || t == tar.TypeCont || t == tar.TypeGNUSparse
}

// fsErr classifies a filesystem error met while extracting entry name:
// running out of space is Exhausted, descriptor or memory shortage
// Unavailable, an I/O error Internal, a symlink on the way Invalid with
// its own message, and anything else Invalid, since the archive asked
// for it.
func fsErr(name, op string, err error) error {
	switch inroot.Errno(err) {
	case unix.ELOOP:
		return errdefs.Invalidf("archive entry %q: %s: a parent directory is a symlink, and symlinks are never followed", name, op)
	case unix.ENOTDIR:
		return errdefs.Invalidf("archive entry %q: %s: a parent is not a directory", name, op)
	case unix.EXDEV:
		return errdefs.Invalidf("archive entry %q: %s: the path leaves the destination", name, op)
	}
	cat := inroot.Category(err)
	switch cat {
	case errdefs.Exhausted, errdefs.Unavailable, errdefs.Internal:
	default:
		cat = errdefs.Invalid
	}
	return errdefs.New(cat, "archive entry %q: %s: %w", name, op, err)
}

func (x *extractor) entry(s *stream, hdr *tar.Header) error {
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		x.st.Skipped++
		return nil
	case tar.TypeReg, tar.TypeCont, tar.TypeGNUSparse, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	default:
		return errdefs.Invalidf("archive entry %q has unsupported type %q", hdr.Name, hdr.Typeflag)
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "" {
		if hdr.Typeflag != tar.TypeDir {
			return errdefs.Invalidf("archive entry %q would replace the destination directory", hdr.Name)
		}
		return x.destDir(hdr)
	}
	dir, base := splitName(name)
	pfd, parentNew, err := x.t.openDir(dir, true)
	if err != nil {
		return fsErr(hdr.Name, "opening its parent", err)
	}
	e := &target{name: name, pfd: pfd, base: base, parentNew: parentNew}
	e.ours = parentNew || x.t.isRoot(name)
	if err := unix.Fstatat(pfd, base, &e.st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		e.exists = true
	} else if err != unix.ENOENT {
		return fsErr(hdr.Name, "stat", err)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(hdr, e)
	case tar.TypeLink:
		return x.hardlink(hdr, e)
	}
	if err := x.clear(hdr, e); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeSymlink {
		return x.symlink(hdr, e)
	}
	return x.file(s, hdr, e)
}

// target is where an entry goes.
type target struct {
	name      string // clean relative name
	pfd       int    // its parent (borrowed from the tree)
	base      string
	parentNew bool // the parent was created by this extraction
	ours      bool // the entry's name was created by this extraction
	exists    bool
	st        unix.Stat_t // of the existing entry
}

func (e *target) isDir() bool { return e.exists && e.st.Mode&unix.S_IFMT == unix.S_IFDIR }

// clear makes room for a non-directory entry: an existing non-directory is
// replaced (like cp); a directory only when this extraction made it.
func (x *extractor) clear(hdr *tar.Header, e *target) error {
	if !e.exists {
		return nil
	}
	if e.isDir() {
		if !e.ours {
			return errdefs.Conflictf("archive entry %q: a directory of that name already exists at the destination and is not replaced by a non-directory; copy into an empty directory", hdr.Name)
		}
		// The tree's cached parent is e's parent, never below e.
		if err := removeTree(e.pfd, e.base); err != nil {
			return fsErr(hdr.Name, "replacing an earlier entry", err)
		}
		return nil
	}
	if err := unix.Unlinkat(e.pfd, e.base, 0); err != nil && err != unix.ENOENT {
		return fsErr(hdr.Name, "replacing an existing file", err)
	}
	return nil
}

// destDir handles the archive's "./" entry: its mode applies only when the
// destination is new.
func (x *extractor) destDir(hdr *tar.Header) error {
	x.st.Dirs++
	if !x.t.all {
		return nil
	}
	fd, err := openat2(x.t.destfd, ".", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fsErr(hdr.Name, "open", err)
	}
	defer unix.Close(fd)
	return x.meta(hdr, fd, true)
}

func (x *extractor) dir(hdr *tar.Header, e *target) error {
	x.st.Dirs++
	if e.isDir() {
		if !e.ours {
			return nil // a directory the user had keeps its mode
		}
	} else {
		if e.exists {
			if !e.ours {
				return errdefs.Conflictf("archive entry %q: a file of that name already exists at the destination and is not replaced by a directory", hdr.Name)
			}
			if err := unix.Unlinkat(e.pfd, e.base, 0); err != nil && err != unix.ENOENT {
				return fsErr(hdr.Name, "replacing an earlier entry", err)
			}
		}
		if err := unix.Mkdirat(e.pfd, e.base, 0o700); err != nil {
			return fsErr(hdr.Name, "mkdir", err)
		}
		x.t.created(e.name, e.parentNew)
	}
	fd, err := openat2(e.pfd, e.base, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fsErr(hdr.Name, "open", err)
	}
	defer unix.Close(fd)
	return x.meta(hdr, fd, true)
}

func (x *extractor) symlink(hdr *tar.Header, e *target) error {
	if hdr.Linkname == "" {
		return errdefs.Invalidf("archive entry %q: symlink with an empty target", hdr.Name)
	}
	if !x.opts.SymlinksAsIs {
		dir, _ := splitName(e.name)
		if why := linkEscapes(hdr.Linkname, depthOf(dir)); why != "" {
			return errdefs.Invalidf("archive entry %q: symlink to %q could lead outside the destination: %s; allow it with SymlinksAsIs (warren sandbox cp --symlinks-as-is) if you will not open files of the tree through links", hdr.Name, hdr.Linkname, why)
		}
	}
	if err := unix.Symlinkat(hdr.Linkname, e.pfd, e.base); err != nil {
		return fsErr(hdr.Name, "symlink", err)
	}
	x.t.created(e.name, e.parentNew)
	x.st.Symlinks++
	x.dropXattrs(hdr)
	return x.times(hdr, e)
}

// hardlink links e to a regular file this extraction created, and to
// nothing else: not a file that was at the destination before, not a
// symlink, not a path outside.
func (x *extractor) hardlink(hdr *tar.Header, e *target) error {
	tname, err := cleanName(hdr.Linkname)
	if err != nil {
		return err
	}
	if tname == "" {
		return errdefs.Invalidf("archive entry %q: hardlink to the destination directory", hdr.Name)
	}
	tdir, tbase := splitName(tname)
	tpfd := x.t.destfd
	if tdir != "" {
		if tpfd, err = openDirChunked(x.t.destfd, tdir); err != nil {
			return x.badLink(hdr, err)
		}
		defer unix.Close(tpfd)
	}
	fd, err := openat2(tpfd, tbase, unix.O_PATH)
	if err != nil {
		return x.badLink(hdr, err)
	}
	defer unix.Close(fd)
	var tst unix.Stat_t
	if err := unix.Fstat(fd, &tst); err != nil {
		return x.badLink(hdr, err)
	}
	if _, ok := x.files[devIno{tst.Dev, tst.Ino}]; !ok || tst.Mode&unix.S_IFMT != unix.S_IFREG {
		return x.badLink(hdr, nil)
	}
	if e.exists && e.st.Dev == tst.Dev && e.st.Ino == tst.Ino {
		x.st.Hardlinks++
		return nil
	}
	if err := x.clear(hdr, e); err != nil {
		return err
	}
	// Link the very inode checked above, not whatever the name holds now.
	if err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), e.pfd, e.base, unix.AT_SYMLINK_FOLLOW); err != nil {
		return fsErr(hdr.Name, "hardlink", err)
	}
	x.t.created(e.name, e.parentNew)
	x.st.Hardlinks++
	return nil
}

func (x *extractor) badLink(hdr *tar.Header, err error) error {
	msg := fmt.Sprintf("archive entry %q: hardlink target %q is not a regular file this extraction created; hard links to anything else are refused", hdr.Name, hdr.Linkname)
	if err != nil {
		return errdefs.New(errdefs.Invalid, "%s: %w", msg, err)
	}
	return errdefs.Invalidf("%s", msg)
}

func (x *extractor) file(s *stream, hdr *tar.Header, e *target) error {
	fd, err := unix.Openat(e.pfd, e.base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fsErr(hdr.Name, "create", err)
	}
	defer unix.Close(fd)
	x.t.created(e.name, e.parentNew)
	x.st.Files++
	if err := x.content(s, hdr, fd); err != nil {
		return err
	}
	if err := x.meta(hdr, fd, false); err != nil {
		return err
	}
	id, err := fstatID(fd)
	if err != nil {
		return fsErr(hdr.Name, "stat", err)
	}
	x.files[id] = struct{}{}
	return x.times(hdr, e)
}

// mode returns the permission bits to apply for an archive mode and counts
// what the mask took away.
func (x *extractor) mode(m int64, isDir bool) uint32 {
	perm := uint32(m) & 0o7777
	if x.opts.Preserve {
		return perm
	}
	masked := perm & 0o755
	if masked != perm {
		x.st.ModesMasked++
		if perm&0o7000 != 0 {
			x.st.SpecialBits++
		}
	}
	if isDir {
		// Owner rwx, so that the user can always remove the tree.
		masked |= 0o700
	}
	return masked
}

// meta applies the masked mode and the allowed xattrs to fd, open for I/O.
func (x *extractor) meta(hdr *tar.Header, fd int, isDir bool) error {
	if err := unix.Fchmod(fd, x.mode(hdr.Mode, isDir)); err != nil {
		return fsErr(hdr.Name, "chmod", err)
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok {
			if strings.HasPrefix(k, paxACL) {
				x.st.XattrsDropped++
			}
			continue
		}
		if !x.allowed(name) {
			x.st.XattrsDropped++
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
			if en := inroot.Errno(err); en == unix.ENOSPC || en == unix.EDQUOT {
				return fsErr(hdr.Name, "setxattr", err)
			}
			x.st.XattrsDropped++
		}
	}
	return nil
}

const (
	paxXattr = "SCHILY.xattr."
	paxACL   = "SCHILY.acl." // star's ACL records
)

func (x *extractor) dropXattrs(hdr *tar.Header) {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxXattr) || strings.HasPrefix(k, paxACL) {
			x.st.XattrsDropped++
		}
	}
}

func (x *extractor) allowed(name string) bool {
	for _, p := range x.opts.XattrAllow {
		if p != "" && strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// times restores the modification time of the entry (not following a
// symlink); failure is not worth failing the copy for.
func (x *extractor) times(hdr *tar.Header, e *target) error {
	if hdr.ModTime.IsZero() {
		return nil
	}
	ts := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	_ = unix.UtimesNanoAt(e.pfd, e.base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}

func depthOf(dir string) int {
	if dir == "" {
		return 0
	}
	return strings.Count(dir, "/") + 1
}

// linkEscapes says why a symlink in a directory depth levels below the
// destination, pointing at target, could lead outside it, or "". A
// contained target is relative, with every ".." first and no more of them
// than depth: the directories it climbs are real ones below the
// destination (parents are never symlinks), so however the archive's other
// links point, each contained link leads to a name below the destination
// and the whole tree stays closed (issue 18 case 1: "x -> b/c/../../SECRET"
// with "b -> ." is refused here, at x). The same rule as the Python SDK's.
func linkEscapes(target string, depth int) string {
	if strings.HasPrefix(target, "/") {
		return "an absolute target names a host path"
	}
	t := target
	if strings.Contains(t, "//") || strings.Contains(t, "./") || strings.HasSuffix(t, "/.") || t == "." {
		var kept []string
		for _, c := range strings.Split(t, "/") {
			if c != "" && c != "." {
				kept = append(kept, c)
			}
		}
		t = strings.Join(kept, "/")
	}
	for ups := 1; t == ".." || strings.HasPrefix(t, "../"); ups++ {
		if ups > depth {
			return fmt.Sprintf("its target climbs %d levels from a directory %d below the destination", ups, depth)
		}
		t = strings.TrimPrefix(strings.TrimPrefix(t, ".."), "/")
	}
	if t == ".." || strings.HasPrefix(t, "../") || strings.HasSuffix(t, "/..") || strings.Contains(t, "/../") {
		return "a \"..\" after a name climbs through whatever that name is"
	}
	return ""
}

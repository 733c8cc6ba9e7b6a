package tarx

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// Create writes the tree at dir, resolved inside root (symlinks on the way
// are followed inside root only), to w as a tar stream. Entry names are
// relative to dir: the directory itself is "./", its children "a",
// "a/b/", ... If dir is not a directory, the stream holds that single entry
// under its base name.
//
// The stream is canonical: entries in lexical order, numeric owners with
// no user or group names, PAX format with nanosecond modification times,
// no access or change times, hardlinks (by device and inode) written as
// links to the first name met, extended attributes as SCHILY.xattr records
// (host-specific ones such as trusted.overlay.* and security.selinux are
// left out). Symlinks inside the tree are archived, never followed.
// Sockets are skipped. A file that changes size while it is read is
// truncated or zero-padded to the size it had when its header was written.
//
// A missing dir is NotFound. Errors writing to w are returned wrapped.
func Create(ctx context.Context, root string, w io.Writer, dir string) error {
	return CreateMapped(ctx, root, w, dir, nil)
}

// CreateOptions changes what Create writes.
type CreateOptions struct {
	// MapID maps owners (nil: as they are): a sandbox in a user
	// namespace shows host ids as its own.
	MapID func(uint32) uint32
	// Sparse writes a regular file with holes as a PAX sparse entry
	// (format 1.0, as GNU tar writes it: the real name and size in
	// GNU.sparse.* records, the map of data segments at the start of the
	// data, then only the data), so a 6 GB file of holes is a few
	// blocks on the wire. GNU tar, bsdtar, Go's archive/tar and Python's
	// tarfile read it; busybox tar does not, hence not the default.
	Sparse bool
	// Name is the entry's name when dir is a single non-directory
	// (default: its base name), as cp names a copy.
	Name string
}

// CreateMapped is Create with owners passed through mapID.
func CreateMapped(ctx context.Context, root string, w io.Writer, dir string, mapID func(uint32) uint32) error {
	return CreateWith(ctx, root, w, dir, CreateOptions{MapID: mapID})
}

// CreateWith is Create with options.
func CreateWith(ctx context.Context, root string, w io.Writer, dir string, o CreateOptions) error {
	rootfd, err := inroot.OpenRoot(root)
	if err != nil {
		return errdefs.Wrap(inroot.Category(err), err, "opening archive root")
	}
	defer unix.Close(rootfd)
	fd, err := inroot.Open(rootfd, dir, unix.O_PATH, 0)
	if err != nil {
		cat := inroot.Category(err)
		if cat == errdefs.NotFound {
			return errdefs.New(cat, "no such file: %s", inroot.Clean(dir))
		}
		return errdefs.Wrap(cat, err, "opening archive source")
	}
	defer unix.Close(fd)
	c := &creator{ctx: ctx, tw: tar.NewWriter(w), w: w, links: map[devIno]string{}, buf: make([]byte, copyBuf), mapID: o.MapID, sparse: o.Sparse}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "stat archive source")
	}
	c.dev = st.Dev
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		err = c.walk(fd, st)
	} else {
		// A single non-directory (a symlink in the final component was
		// followed): archive what the descriptor refers to.
		name := o.Name
		if name == "" {
			name = path.Base(inroot.Clean(dir))
		}
		err = c.entry(fd, "", name, st)
	}
	if err != nil {
		return err
	}
	if err := c.tw.Close(); err != nil {
		return c.writeErr(err)
	}
	return nil
}

type devIno struct{ dev, ino uint64 }

type creator struct {
	// dev is the filesystem being archived: like tar --one-file-system,
	// mount points below it (a sandbox's /proc, /sys, /dev) are archived
	// as empty directories.
	dev   uint64
	ctx   context.Context
	tw    *tar.Writer
	w     io.Writer           // under tw: sparse entries are written raw
	mapID func(uint32) uint32 // nil: owners as they are
	// sparse: files with holes as PAX sparse entries (CreateOptions).
	sparse bool
	links  map[devIno]string
	// linkBytes is the length of the names in links: past maxLinkBytes
	// further hardlinks are archived as copies, so that many linked files
	// deep in a tree (each name 40 KB at depth 20,000) cannot grow the
	// daemon without bound.
	linkBytes int
	// path is the name of the entry in hand, reused from entry to entry.
	path []byte
	buf  []byte
}

const maxLinkBytes = 64 << 20

func (c *creator) writeErr(err error) error {
	return fmt.Errorf("writing archive: %w", err)
}

func (c *creator) header(name string, st unix.Stat_t) *tar.Header {
	if c.mapID != nil {
		st.Uid, st.Gid = c.mapID(st.Uid), c.mapID(st.Gid)
	}
	return &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:  tar.FormatPAX,
	}
}

// level is one directory on the walk's path from the top: the names of
// its children still to archive (one directory's names at a time per
// level), where its own name ends in c.path, and its identity, checked
// when the walk comes back up to it through "..".
type level struct {
	names     []string
	next      int
	prefixLen int
	dev, ino  uint64
}

// errMoved is returned when a directory on the walk's path is no longer
// where the walk left it: a live sandbox renamed it meanwhile.
var errMoved = errdefs.New(errdefs.Conflict, "the tree moved while it was archived (a directory on the way was renamed); try again once it holds still")

// walk writes the directory top (an O_PATH descriptor, not consumed) and
// everything below it. It holds one descriptor besides top whatever the
// depth (a 20,000-deep tree held 20,000 in a recursive walk, all of the
// daemon's): it descends with openat(O_NOFOLLOW) and comes back up with
// openat(".."), checked against the parent's recorded device and inode.
// Memory is the names of one directory per level plus the current path.
func (c *creator) walk(top int, st unix.Stat_t) error {
	names, ok, err := c.dirHeader(top, "./", st)
	if err != nil || !ok {
		return err
	}
	stack := []level{{names: names, dev: st.Dev, ino: st.Ino}}
	cur := top
	defer func() {
		if cur != top {
			unix.Close(cur)
		}
	}()
	for len(stack) > 0 {
		lv := &stack[len(stack)-1]
		if lv.next == len(lv.names) {
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				break
			}
			up, err := c.up(cur, top, len(stack) == 1, stack[len(stack)-1])
			if err != nil {
				return err
			}
			cur = up
			continue
		}
		n := lv.names[lv.next]
		lv.names[lv.next] = ""
		lv.next++
		c.path = append(c.path[:lv.prefixLen], n...)
		sub, sst, names, err := c.child(cur, n)
		if err != nil {
			return err
		}
		if sub < 0 {
			continue
		}
		if cur != top {
			unix.Close(cur)
		}
		cur = sub
		stack = append(stack, level{names: names, prefixLen: len(c.path) + 1, dev: sst.Dev, ino: sst.Ino})
		c.path = append(c.path, '/')
	}
	return nil
}

// up returns a descriptor of the parent of cur, which must be the
// directory parent, closing cur: top itself when toTop.
func (c *creator) up(cur, top int, toTop bool, parent level) (int, error) {
	if toTop {
		unix.Close(cur)
		return top, nil
	}
	fd, err := unix.Openat(cur, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	unix.Close(cur)
	if err != nil {
		return top, errdefs.Wrap(inroot.Category(err), err, "back up to "+shortName(string(c.path[:parent.prefixLen])))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != parent.dev || st.Ino != parent.ino {
		unix.Close(fd)
		return top, errMoved
	}
	return fd, nil
}

// child archives the entry n of the directory cur, named c.path. For a
// directory with children on the same filesystem it returns an O_PATH
// descriptor of it, its stat and its sorted names, to descend into;
// otherwise sub is -1.
func (c *creator) child(cur int, n string) (sub int, st unix.Stat_t, names []string, err error) {
	name := string(c.path)
	cst, err := inroot.Lstat(cur, n)
	if err == unix.ENOENT {
		return -1, st, nil, nil // removed while we walk
	}
	if err != nil {
		return -1, st, nil, errdefs.Wrap(inroot.Category(err), err, "stat "+shortName(name))
	}
	if cst.Mode&unix.S_IFMT != unix.S_IFDIR {
		return -1, st, nil, c.entry(cur, n, name, cst)
	}
	sub, err = unix.Openat(cur, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return -1, st, nil, nil
	}
	if err != nil {
		return -1, st, nil, errdefs.Wrap(inroot.Category(err), err, "open "+shortName(name))
	}
	if err := unix.Fstat(sub, &st); err != nil {
		unix.Close(sub)
		return -1, st, nil, errdefs.Wrap(errdefs.Internal, err, "stat "+shortName(name))
	}
	names, ok, err := c.dirHeader(sub, name+"/", st)
	if err != nil || !ok || len(names) == 0 {
		unix.Close(sub)
		return -1, st, nil, err
	}
	return sub, st, names, nil
}

// dirHeader writes the header of the directory fd (an O_PATH descriptor)
// and returns its sorted names; ok is false for a mount point, whose
// contents are left out.
func (c *creator) dirHeader(fd int, name string, st unix.Stat_t) (names []string, ok bool, err error) {
	if err := ctxErr(c.ctx); err != nil {
		return nil, false, err
	}
	hdr := c.header(name, st)
	hdr.Typeflag = tar.TypeDir
	if err := c.addXattrs(hdr, xattrSrc{fd: -1, path: xattrPath(fd, "")}); err != nil {
		return nil, false, err
	}
	if err := c.tw.WriteHeader(hdr); err != nil {
		return nil, false, c.writeErr(err)
	}
	if st.Dev != c.dev {
		return nil, false, nil
	}
	names, err = inroot.ReadDirNames(fd)
	if err != nil {
		return nil, false, errdefs.Wrap(inroot.Category(err), err, "reading directory "+shortName(name))
	}
	return names, true, nil
}

// shortName keeps error messages readable when a sandbox nests
// directories 20,000 deep: names over 256 bytes lose their middle.
func shortName(name string) string {
	const keep = 120
	if len(name) <= 2*keep+16 {
		return name
	}
	return name[:keep] + "/.../" + name[len(name)-keep:]
}

// xattrPath names an entry for the path-based xattr calls: base in dirfd,
// not followed, or dirfd itself when base is "".
func xattrPath(dirfd int, base string) string {
	if base == "" {
		return "/proc/self/fd/" + fmt.Sprint(dirfd) + "/."
	}
	return inroot.ProcPath(dirfd, base)
}

// entry writes the non-directory base of dirfd (or, when base is "", the
// file dirfd itself refers to) under name.
func (c *creator) entry(dirfd int, base, name string, st unix.Stat_t) error {
	if err := ctxErr(c.ctx); err != nil {
		return err
	}
	hdr := c.header(name, st)
	var f *os.File
	var segs []segment // non-nil: a sparse entry of these data segments
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		// Open first and describe what we opened: the tree may be live.
		// O_NONBLOCK keeps a fifo swapped in from blocking us.
		var fd int
		var err error
		if base == "" {
			// Re-open the O_PATH descriptor for reading via its proc link.
			fd, err = unix.Open("/proc/self/fd/"+fmt.Sprint(dirfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		} else {
			fd, err = unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		}
		if err == unix.ENOENT {
			return nil
		}
		if err != nil {
			return errdefs.Wrap(inroot.Category(err), err, "open "+shortName(name))
		}
		f = os.NewFile(uintptr(fd), name)
		defer f.Close()
		if err := unix.Fstat(fd, &st); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "stat "+shortName(name))
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil // swapped for something else meanwhile
		}
		hdr = c.header(name, st)
		key := devIno{uint64(st.Dev), st.Ino}
		if st.Nlink > 1 {
			if first, ok := c.links[key]; ok {
				hdr.Typeflag = tar.TypeLink
				hdr.Linkname = first
				if err := c.tw.WriteHeader(hdr); err != nil {
					return c.writeErr(err)
				}
				return nil
			}
			if c.linkBytes+len(name) <= maxLinkBytes {
				c.links[key] = name
				c.linkBytes += len(name)
			}
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Size = st.Size
		if c.sparse && st.Blocks*512 < st.Size {
			// Fewer blocks than bytes: it may have holes.
			segs = dataSegments(fd, st.Size)
		}
	case unix.S_IFLNK:
		var target string
		var err error
		if base == "" {
			err = unix.EINVAL
		} else {
			target, err = inroot.Readlink(dirfd, base)
		}
		if err == unix.ENOENT {
			return nil
		}
		if err != nil {
			return errdefs.Wrap(inroot.Category(err), err, "readlink "+shortName(name))
		}
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = target
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor = int64(unix.Major(uint64(st.Rdev)))
		hdr.Devminor = int64(unix.Minor(uint64(st.Rdev)))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil // sockets and unknown types cannot be archived
	}
	src := xattrSrc{fd: -1, path: xattrPath(dirfd, base)}
	if f != nil {
		src = xattrSrc{fd: int(f.Fd())}
	}
	if err := c.addXattrs(hdr, src); err != nil {
		return err
	}
	if segs != nil {
		return c.sparseFile(f, hdr, segs)
	}
	if err := c.tw.WriteHeader(hdr); err != nil {
		return c.writeErr(err)
	}
	if f == nil || hdr.Size == 0 {
		return nil
	}
	return c.copyRange(c.tw, f, hdr.Name, 0, hdr.Size)
}

// copyRange writes n bytes of f from off, the part past f's end (it
// shrank since its header was written) as zeros.
func (c *creator) copyRange(w io.Writer, f *os.File, name string, off, n int64) error {
	remaining := n
	for remaining > 0 {
		if err := ctxErr(c.ctx); err != nil {
			return err
		}
		chunk := c.buf
		if int64(len(chunk)) > remaining {
			chunk = chunk[:remaining]
		}
		got, err := f.ReadAt(chunk, off)
		if got == 0 && err == io.EOF {
			// The file shrank: pad with zeros to the announced size.
			clear(chunk)
			got = len(chunk)
		} else if err != nil && err != io.EOF {
			return errdefs.Wrap(inroot.Category(err), err, "reading "+shortName(name))
		}
		if _, werr := w.Write(chunk[:got]); werr != nil {
			return c.writeErr(werr)
		}
		off += int64(got)
		remaining -= int64(got)
	}
	return nil
}

// xattrSrc names where to read extended attributes: an open descriptor
// (fd >= 0), or a path whose final component is not followed.
type xattrSrc struct {
	fd   int
	path string
}

func (s xattrSrc) list(buf []byte) (int, error) {
	if s.fd >= 0 {
		return unix.Flistxattr(s.fd, buf)
	}
	return unix.Llistxattr(s.path, buf)
}

func (s xattrSrc) get(name string, buf []byte) (int, error) {
	if s.fd >= 0 {
		return unix.Fgetxattr(s.fd, name, buf)
	}
	return unix.Lgetxattr(s.path, name, buf)
}

// addXattrs reads the extended attributes of src into hdr's PAX records.
// A filesystem without xattr support simply contributes none.
func (c *creator) addXattrs(hdr *tar.Header, src xattrSrc) error {
	names := listXattrs(src)
	for _, name := range names {
		if skipXattr(name) {
			continue
		}
		val, ok := getXattr(src, name)
		if !ok {
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords[paxXattr+name] = string(val)
	}
	return nil
}

func listXattrs(src xattrSrc) []string {
	for attempt := 0; attempt < 8; attempt++ {
		size, err := src.list(nil)
		if err != nil || size <= 0 {
			return nil
		}
		buf := make([]byte, size)
		n, err := src.list(buf)
		if err == unix.ERANGE {
			continue // grew meanwhile
		}
		if err != nil {
			return nil
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		return names
	}
	return nil
}

func getXattr(src xattrSrc, name string) ([]byte, bool) {
	for attempt := 0; attempt < 8; attempt++ {
		size, err := src.get(name, nil)
		if err != nil {
			return nil, false
		}
		buf := make([]byte, size)
		n, err := src.get(name, buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return nil, false
		}
		return buf[:n], true
	}
	return nil, false
}

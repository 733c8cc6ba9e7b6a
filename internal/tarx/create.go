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
	c := &creator{ctx: ctx, tw: tar.NewWriter(w), links: map[devIno]string{}, buf: make([]byte, copyBuf)}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "stat archive source")
	}
	c.dev = st.Dev
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		err = c.dir(fd, "./", st)
	} else {
		// A single non-directory (a symlink in the final component was
		// followed): archive what the descriptor refers to.
		err = c.entry(fd, "", path.Base(inroot.Clean(dir)), st)
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
	links map[devIno]string
	buf   []byte
}

func (c *creator) writeErr(err error) error {
	return fmt.Errorf("writing archive: %w", err)
}

func (c *creator) header(name string, st unix.Stat_t) *tar.Header {
	return &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:  tar.FormatPAX,
	}
}

// dir writes the directory fd (an O_PATH descriptor) and its children.
func (c *creator) dir(fd int, name string, st unix.Stat_t) error {
	if err := ctxErr(c.ctx); err != nil {
		return err
	}
	hdr := c.header(name, st)
	hdr.Typeflag = tar.TypeDir
	if err := c.addXattrs(hdr, xattrSrc{fd: -1, path: xattrPath(fd, "")}); err != nil {
		return err
	}
	if err := c.tw.WriteHeader(hdr); err != nil {
		return c.writeErr(err)
	}
	if st.Dev != c.dev {
		return nil
	}
	names, err := inroot.ReadDirNames(fd)
	if err != nil {
		return errdefs.Wrap(inroot.Category(err), err, "reading directory "+name)
	}
	prefix := name
	if prefix == "./" {
		prefix = ""
	}
	for _, n := range names {
		cst, err := inroot.Lstat(fd, n)
		if err == unix.ENOENT {
			continue // removed while we walk
		}
		if err != nil {
			return errdefs.Wrap(inroot.Category(err), err, "stat "+prefix+n)
		}
		if cst.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == unix.ENOENT {
				continue
			}
			if err != nil {
				return errdefs.Wrap(inroot.Category(err), err, "open "+prefix+n)
			}
			var sst unix.Stat_t
			err = unix.Fstat(sub, &sst)
			if err == nil {
				err = c.dir(sub, prefix+n+"/", sst)
			}
			unix.Close(sub)
			if err != nil {
				return err
			}
			continue
		}
		if err := c.entry(fd, n, prefix+n, cst); err != nil {
			return err
		}
	}
	return nil
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
			return errdefs.Wrap(inroot.Category(err), err, "open "+name)
		}
		f = os.NewFile(uintptr(fd), name)
		defer f.Close()
		if err := unix.Fstat(fd, &st); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "stat "+name)
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
			c.links[key] = name
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Size = st.Size
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
			return errdefs.Wrap(inroot.Category(err), err, "readlink "+name)
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
	if err := c.tw.WriteHeader(hdr); err != nil {
		return c.writeErr(err)
	}
	if f == nil || hdr.Size == 0 {
		return nil
	}
	return c.copyFile(f, hdr)
}

func (c *creator) copyFile(f *os.File, hdr *tar.Header) error {
	remaining := hdr.Size
	var off int64
	for remaining > 0 {
		if err := ctxErr(c.ctx); err != nil {
			return err
		}
		chunk := c.buf
		if int64(len(chunk)) > remaining {
			chunk = chunk[:remaining]
		}
		n, err := f.ReadAt(chunk, off)
		if n == 0 && err == io.EOF {
			// The file shrank: pad with zeros to the announced size.
			clear(chunk)
			n = len(chunk)
		} else if err != nil && err != io.EOF {
			return errdefs.Wrap(inroot.Category(err), err, "reading "+hdr.Name)
		}
		if _, werr := c.tw.Write(chunk[:n]); werr != nil {
			return c.writeErr(werr)
		}
		off += int64(n)
		remaining -= int64(n)
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

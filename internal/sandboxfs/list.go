package sandboxfs

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"path"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// Page sizes of List: a directory of 300,000 entries read whole grew the
// daemon by 174 MB; a page of 10,000 FileInfos is a few MB.
const (
	DefaultPageSize = 1000
	MaxPageSize     = 10000
)

// maxPageBytes ends a page early when its names, paths and symlink
// targets reach it: 10,000 symlinks with 4 KiB targets would otherwise
// make a 40 MB page.
const maxPageBytes = 4 << 20

// direntBuf is the getdents buffer: 32 KiB holds about 1,000 entries of
// 10-byte names, so a default page takes a few system calls.
const direntBuf = 32 << 10

// A page token is version, directory device, directory inode and the
// getdents d_off to resume from, base64url: opaque to clients, and a
// token of another directory (or the same path replaced) is refused.
const (
	tokenVersion = 1
	tokenLen     = 1 + 8 + 8 + 8
)

type cookie struct {
	dev, ino uint64
	off      int64
}

func (c cookie) encode() string {
	b := make([]byte, tokenLen)
	b[0] = tokenVersion
	binary.BigEndian.PutUint64(b[1:], c.dev)
	binary.BigEndian.PutUint64(b[9:], c.ino)
	binary.BigEndian.PutUint64(b[17:], uint64(c.off))
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeToken(tok string) (cookie, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != tokenLen || b[0] != tokenVersion {
		return cookie{}, errdefs.Invalidf("bad page token: send back the next_page_token of the previous page, or none for the first page")
	}
	return cookie{
		dev: binary.BigEndian.Uint64(b[1:]),
		ino: binary.BigEndian.Uint64(b[9:]),
		off: int64(binary.BigEndian.Uint64(b[17:])),
	}, nil
}

// List returns one page of the entries of the directory at p (a symlink
// to a directory is followed inside the sandbox), at most pageSize (0:
// DefaultPageSize; more than MaxPageSize is MaxPageSize; fewer when the
// page's names and symlink targets reach 4 MiB), and the token
// of the next page, "" after the last one. token is "" for the first
// page, else the token the previous page returned for the same directory
// (another one is Invalid). Entries come in the directory's own order
// (getdents), not sorted; entries added or removed while paging may or
// may not be seen, the others are seen exactly once. Entries that are
// symlinks are described, not followed. Memory is bounded by the page,
// whatever the directory's size.
func (f *FS) List(ctx context.Context, p string, pageSize int, token string) ([]FileInfo, string, error) {
	cp := inroot.Clean(p)
	if pageSize < 0 {
		return nil, "", errdefs.Invalidf("negative page size %d", pageSize)
	}
	if pageSize == 0 {
		pageSize = DefaultPageSize
	}
	pageSize = min(pageSize, MaxPageSize)
	var from cookie
	if token != "" {
		var err error
		if from, err = decodeToken(token); err != nil {
			return nil, "", err
		}
	}
	rootfd, err := f.enter(ctx)
	if err != nil {
		return nil, "", err
	}
	defer unix.Close(rootfd)
	pfd, st, err := openPath(rootfd, cp)
	if err != nil {
		return nil, "", err
	}
	defer unix.Close(pfd)
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, "", errdefs.Invalidf("not a directory: %s", cp)
	}
	if token != "" && (from.dev != st.Dev || from.ino != st.Ino) {
		return nil, "", errdefs.Invalidf("page token is for another directory than %s (or it was replaced): start again without a token", cp)
	}
	fd, err := openAt(pfd, token, from.off, cp)
	if err != nil {
		return nil, "", err
	}
	r := pager{ctx: ctx, fd: fd, cp: cp, buf: make([]byte, direntBuf)}
	out, off, more, err := r.page(pageSize)
	if err != nil || !more {
		unix.Close(fd)
		return out, "", err
	}
	next := cookie{dev: st.Dev, ino: st.Ino, off: off}.encode()
	if _, err := unix.Seek(fd, off, 0); err == nil {
		keepCursor(next, fd)
	} else {
		unix.Close(fd)
	}
	return out, next, nil
}

// openAt returns the directory behind pfd open for reading at the page
// of token: the kept cursor of that page if there is one, else a new
// descriptor that seeks to off.
func openAt(pfd int, token string, off int64, cp string) (int, error) {
	if token != "" {
		if fd, ok := takeCursor(token); ok {
			return fd, nil
		}
	}
	fd, err := reopen(pfd, unix.O_RDONLY|unix.O_DIRECTORY, cp)
	if err != nil || token == "" {
		return fd, err
	}
	if _, err := unix.Seek(fd, off, 0); err != nil {
		unix.Close(fd)
		return -1, errdefs.Invalidf("page token does not fit directory %s: start again without a token", cp)
	}
	return fd, nil
}

// pager reads one page of a directory with getdents, parsing the
// dirents itself to know each entry's d_off (where the next one starts).
type pager struct {
	ctx context.Context
	fd  int
	cp  string
	buf []byte
}

// page returns up to n entries, the d_off after the last one and whether
// the directory has more.
func (r *pager) page(n int) (out []FileInfo, off int64, more bool, err error) {
	out = make([]FileInfo, 0, min(n, 256))
	size := 0
	full := func() bool { return len(out) == n || size >= maxPageBytes }
	for {
		if err := ctxErr(r.ctx); err != nil {
			return nil, 0, false, err
		}
		nb, err := unix.Getdents(r.fd, r.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, 0, false, pathErr(r.cp, err)
		}
		if nb == 0 {
			return out, off, false, nil
		}
		for b := r.buf[:nb]; len(b) > 0; {
			if full() {
				return out, off, true, nil
			}
			name, doff, reclen, ok := dirent(b)
			if !ok {
				return nil, 0, false, errdefs.Internalf("list %s: malformed directory entry", r.cp)
			}
			b = b[reclen:]
			off = doff
			if name == "." || name == ".." {
				continue
			}
			st, err := inroot.Lstat(r.fd, name)
			if err == unix.ENOENT {
				continue // removed meanwhile
			}
			if err != nil {
				return nil, 0, false, pathErr(path.Join(r.cp, name), err)
			}
			fi := info(r.fd, name, path.Join(r.cp, name), st)
			size += len(fi.Name) + len(fi.Path) + len(fi.LinkTarget)
			out = append(out, fi)
		}
		if full() {
			// The buffer ended with the page: one more read tells
			// whether anything follows, so the last page has no token.
			return out, off, r.peek(off), nil
		}
	}
}

// peek reports whether the directory has entries past off, then seeks
// back there (a failed read counts as more: the next page reports it).
func (r *pager) peek(off int64) bool {
	for {
		nb, err := unix.Getdents(r.fd, r.buf)
		if err == unix.EINTR {
			continue
		}
		_, _ = unix.Seek(r.fd, off, 0)
		return err != nil || nb > 0
	}
}

// dirent parses the linux_dirent64 at the start of b: d_ino u64, d_off
// s64, d_reclen u16, d_type u8, then the NUL-terminated name.
func dirent(b []byte) (name string, off int64, reclen int, ok bool) {
	const hdr = 19
	if len(b) < hdr {
		return "", 0, 0, false
	}
	off = int64(binary.NativeEndian.Uint64(b[8:]))
	reclen = int(binary.NativeEndian.Uint16(b[16:]))
	if reclen < hdr || reclen > len(b) {
		return "", 0, 0, false
	}
	nameb := b[hdr:reclen]
	for i, c := range nameb {
		if c == 0 {
			nameb = nameb[:i]
			break
		}
	}
	return string(nameb), off, reclen, true
}

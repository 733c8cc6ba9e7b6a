package untrusted

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/holes"
)

const copyBuf = 256 << 10

// content writes the current entry's data to fd, seeking over all-zero
// blocks and ftruncating to the final size, so holes stay holes.
func (x *extractor) content(s *stream, hdr *tar.Header, fd int) error {
	var off int64
	for {
		if err := ctxErr(s.ctx); err != nil {
			return err
		}
		n, rerr := holes.Fill(s.tr, x.buf)
		if err := holes.WriteAt(fd, x.buf[:n], off); err != nil {
			return fsErr(hdr.Name, "write", err)
		}
		off += int64(n)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return s.readErr(rerr, fmt.Sprintf("reading archive entry %q", hdr.Name))
		}
	}
	if off != hdr.Size {
		return errdefs.Invalidf("archive entry %q: truncated archive (%d of %d bytes)", hdr.Name, off, hdr.Size)
	}
	if err := unix.Ftruncate(fd, off); err != nil {
		return fsErr(hdr.Name, "truncate", err)
	}
	return nil
}

// ExtractFile writes the single regular file of the tar stream r to the
// path dest, whose parent must exist. dest is resolved without following
// any symlink (a symlink anywhere in it is Invalid) and an existing
// regular file there is replaced atomically: the data goes to a temporary
// file in the same directory, renamed over dest once complete, so a failed
// copy leaves dest as it was. The same budgets, mode mask, xattr
// allowlist and hole handling as Extract apply.
func ExtractFile(ctx context.Context, dest string, r io.Reader, opts Options) (st Stats, err error) {
	dp, err := resolveParent(dest, false)
	if err != nil {
		return st, err
	}
	defer dp.close()
	if dp.base == "" {
		return st, errdefs.Invalidf("destination %s is a directory, not a file name", dest)
	}
	if err := checkFileDest(dest, dp); err != nil {
		return st, err
	}
	s, err := newStream(ctx, r)
	if err != nil {
		return st, err
	}
	hdr, err := s.next()
	if err == io.EOF {
		return st, errdefs.Invalidf("empty archive: no file to write to %s", dest)
	}
	if err != nil {
		return st, err
	}
	x := newExtractor(opts)
	if !isRegular(hdr.Typeflag) {
		return x.st, errdefs.Invalidf("archive entry %q is not a regular file", hdr.Name)
	}
	if err := x.count(hdr); err != nil {
		return x.st, err
	}
	var undo cleanup.Cleanup
	defer undo.Clean()
	tmp, fd, err := createTemp(dp.parentfd)
	if err != nil {
		return x.st, fsErr(dest, "create a temporary file", err)
	}
	defer unix.Close(fd)
	undo.Add(func() error { return unix.Unlinkat(dp.parentfd, tmp, 0) })
	x.st.Files++
	if err := x.content(s, hdr, fd); err != nil {
		return x.st, err
	}
	if err := x.meta(hdr, fd, false); err != nil {
		return x.st, err
	}
	if _, err := s.next(); err != io.EOF {
		if err == nil {
			err = errdefs.Invalidf("the archive holds more than one file (a second entry %q)", hdr.Name)
		}
		return x.st, err
	}
	_ = x.times(hdr, &target{pfd: dp.parentfd, base: tmp})
	// renameat replaces a name, never follows it: a symlink planted at
	// dest since the check is replaced, not written through.
	if err := unix.Renameat(dp.parentfd, tmp, dp.parentfd, dp.base); err != nil {
		return x.st, fsErr(dest, "rename into place", err)
	}
	undo.Release()
	return x.st, nil
}

// checkFileDest refuses a destination that is a symlink or a directory.
func checkFileDest(dest string, dp *destPath) error {
	var st unix.Stat_t
	err := unix.Fstatat(dp.parentfd, dp.base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return destError(dest, dest, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return destError(dest, dest, unix.ELOOP)
	case unix.S_IFDIR:
		return errdefs.Conflictf("destination %s is a directory", dest)
	case unix.S_IFREG:
		return nil
	}
	return errdefs.Invalidf("destination %s exists and is not a regular file", dest)
}

func createTemp(dirfd int) (string, int, error) {
	var b [8]byte
	for range 16 {
		_, _ = rand.Read(b[:])
		name := ".warren-cp-" + hex.EncodeToString(b[:])
		fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != unix.EEXIST {
			return name, fd, err
		}
	}
	return "", -1, unix.EEXIST
}

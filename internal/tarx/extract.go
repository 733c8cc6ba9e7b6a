// Package tarx extracts and creates tar streams safely.
//
// Extract resolves every path of an archive inside the destination root
// only (see package inroot): "../", absolute paths and symlinks — whether
// they come with the archive or already sit in the root — are all confined
// to the root, as if the extraction ran chrooted into it. Symlinks in the
// archive may point anywhere (they are resolved later, inside the sandbox),
// but extraction never follows one out of the root.
//
// Create writes a directory tree as a canonical tar stream: entries in
// lexical order, relative names, numeric owners only, no access or change
// times, hardlinks detected by inode. The same tree always gives the same
// bytes, which is what the image store hashes.
package tarx

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/holes"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// DefaultMaxFiles is the entry limit when Options.MaxFiles is 0.
const DefaultMaxFiles = 1_000_000

// Options control Extract.
type Options struct {
	// Dir is the directory inside root to extract into; "" is root itself.
	// It is resolved inside root (symlinks included) and created if
	// missing. Archive paths are relative to Dir and cannot leave it
	// lexically, but symlinks met on the way are resolved against root,
	// as a process chrooted into root would resolve them.
	Dir string
	// AllowDevices lets character and block devices and fifos be created.
	// Otherwise such an entry is an Invalid error naming it, unless
	// SkipDevices is set.
	AllowDevices bool
	// SkipDevices silently drops device and fifo entries (counted in
	// Stats.DevicesSkipped) instead of failing, when AllowDevices is false.
	SkipDevices bool
	// KeepSetuid keeps the setuid and setgid bits and security.capability
	// xattrs of regular files. Otherwise they are stripped and counted in
	// Stats.SetuidStripped.
	KeepSetuid bool
	// KeepOwners applies the archive's numeric uid and gid. Otherwise
	// everything belongs to the extracting process.
	KeepOwners bool
	// MaxFiles limits the number of entries: 0 means DefaultMaxFiles, a
	// negative value means no limit. Exceeding it is an Exhausted error.
	MaxFiles int64
	// MaxBytes limits the total size of regular file contents; 0 means no
	// limit. Exceeding it is an Exhausted error.
	MaxBytes int64
	// Guard, if set, is called before an entry is created at, or
	// replaces what is at, base in the directory dirfd (an O_PATH
	// descriptor; name is the archive entry); its error stops the
	// extraction. Sandbox file calls refuse kernel filesystems and mount
	// points with it.
	Guard func(dirfd int, base, name string) error
}

// Stats counts what Extract did.
type Stats struct {
	Entries        int64 // archive entries processed
	Files          int64 // regular files written
	Dirs           int64
	Symlinks       int64
	Hardlinks      int64
	Devices        int64 // device nodes and fifos created
	DevicesSkipped int64 // device nodes and fifos dropped (SkipDevices)
	Bytes          int64 // regular file content written
	SetuidStripped int64 // files whose setuid/setgid bits or capabilities were removed
	XattrsSkipped  int64 // extended attributes the filesystem refused
}

// Extract extracts the tar stream r, plain or gzip-compressed (detected by
// its magic number), into the directory root (see Options.Dir). Existing
// entries are replaced, except that a directory entry over an existing
// directory only updates its metadata. Modification times are restored;
// extended attributes are restored where the filesystem allows.
//
// Errors carry a category: a corrupt or truncated archive, an unsafe or
// inconsistent entry, or a device entry that is not allowed is Invalid;
// exceeding a limit, or ENOSPC/EDQUOT, is Exhausted. ctx is checked between
// entries and while copying file contents.
//
// On error the tree is left partially extracted: the caller removes it (or
// discards the sandbox) when it needs all-or-nothing.
func Extract(ctx context.Context, root string, r io.Reader, opts Options) (Stats, error) {
	x := &extractor{ctx: ctx, opts: opts, dirIndex: map[string]int{}}
	if x.opts.MaxFiles == 0 {
		x.opts.MaxFiles = DefaultMaxFiles
	}
	rootfd, err := inroot.OpenRoot(root)
	if err != nil {
		return x.st, errdefs.Wrap(inroot.Category(err), err, "opening extraction root")
	}
	defer unix.Close(rootfd)
	x.rootfd = rootfd
	x.base = inroot.Clean(opts.Dir)
	if x.base != "/" {
		fd, _, err := inroot.MkdirAll(rootfd, x.base, 0o755)
		if err != nil {
			return x.st, errdefs.Wrap(inroot.Category(err), err, "creating extraction directory")
		}
		unix.Close(fd)
	}

	src := &SourceReader{R: r}
	br := bufio.NewReaderSize(src, 64<<10)
	var body io.Reader = br
	var gz *gzip.Reader
	magic, _ := br.Peek(6)
	gzipped, err := IsGzip(magic)
	if err != nil {
		return x.st, err
	}
	if gzipped {
		gz, err = gzip.NewReader(br)
		if err != nil {
			return x.st, x.readErr(src, err, "reading gzip header")
		}
		body = gz
	}
	tail := &TailReader{R: body}
	tr := tar.NewReader(tail)
	for {
		if err := ctxErr(ctx); err != nil {
			return x.st, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return x.st, x.readErr(src, err, "reading archive")
		}
		x.st.Entries++
		if x.opts.MaxFiles > 0 && x.st.Entries > x.opts.MaxFiles {
			return x.st, errdefs.Exhaustedf("archive has more than %d entries", x.opts.MaxFiles)
		}
		if err := x.entry(tr, hdr, src); err != nil {
			return x.st, err
		}
	}
	if tail.N == 0 {
		if src.Err != nil {
			return x.st, x.readErr(src, src.Err, "reading archive")
		}
		return x.st, errdefs.Invalidf("empty archive")
	}
	if !tail.EndsWithZeros() {
		if src.Err != nil {
			return x.st, x.readErr(src, src.Err, "reading archive")
		}
		return x.st, errdefs.Invalidf("truncated archive: no end-of-archive marker")
	}
	if gz != nil {
		// Read the rest of the gzip member so that its checksum is verified;
		// tolerate (bounded) padding after the tar end.
		if _, err := io.Copy(io.Discard, io.LimitReader(gz, 16<<20)); err != nil {
			return x.st, x.readErr(src, err, "reading gzip trailer")
		}
	}
	x.applyDirTimes()
	return x.st, nil
}

type dirTime struct {
	path         string
	atime, mtime time.Time
}

type extractor struct {
	ctx      context.Context
	opts     Options
	rootfd   int
	base     string
	st       Stats
	dirs     []dirTime
	dirIndex map[string]int
}

// SourceReader remembers the first error of the caller's reader R (in
// Err), so that a failing transfer is not reported as a corrupt archive.
// Extract and the host-side extractor (package untrusted) read through it.
type SourceReader struct {
	R   io.Reader
	Err error
}

func (s *SourceReader) Read(p []byte) (int, error) {
	n, err := s.R.Read(p)
	if err != nil && err != io.EOF && s.Err == nil {
		s.Err = err
	}
	return n, err
}

// IsGzip reports whether an archive that starts with magic (its first
// six bytes, or all of a shorter one) is gzip-compressed. Archives
// compressed with zstd, xz or bzip2 are refused (Invalid): only plain and
// gzip-compressed tar is read.
func IsGzip(magic []byte) (bool, error) {
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		return true, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return false, errdefs.Invalidf("unsupported archive compression: zstd (send a plain or gzip-compressed tar)")
	case bytes.HasPrefix(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return false, errdefs.Invalidf("unsupported archive compression: xz (send a plain or gzip-compressed tar)")
	case bytes.HasPrefix(magic, []byte("BZh")):
		return false, errdefs.Invalidf("unsupported archive compression: bzip2 (send a plain or gzip-compressed tar)")
	}
	return false, nil
}

// TailReader passes a tar stream through from R, counting the bytes read
// (N) and keeping the last 1024 of them, to check for the two zero blocks
// that end an archive (archive/tar accepts a stream cut at a block
// boundary).
type TailReader struct {
	R    io.Reader
	N    int64
	tail [1024]byte
}

func (t *TailReader) Read(p []byte) (int, error) {
	n, err := t.R.Read(p)
	if n > 0 {
		t.N += int64(n)
		if n >= len(t.tail) {
			copy(t.tail[:], p[n-len(t.tail):n])
		} else {
			copy(t.tail[:], t.tail[n:])
			copy(t.tail[len(t.tail)-n:], p[:n])
		}
	}
	return n, err
}

// EndsWithZeros reports whether the last 1024 bytes read were zeros: the
// end-of-archive marker.
func (t *TailReader) EndsWithZeros() bool {
	if t.N < int64(len(t.tail)) {
		return false
	}
	for _, b := range t.tail {
		if b != 0 {
			return false
		}
	}
	return true
}

func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errdefs.Wrap(errdefs.DeadlineExceeded, err, "extraction interrupted")
	}
	return fmt.Errorf("extraction interrupted: %w", err)
}

// readErr classifies an error from the archive reader: the caller's
// reader failing is passed through, anything else is a corrupt archive.
func (x *extractor) readErr(src *SourceReader, err error, what string) error {
	if src.Err != nil {
		return fmt.Errorf("%s: %w", what, src.Err)
	}
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		return errdefs.New(errdefs.Invalid, "%s: truncated archive: %w", what, io.ErrUnexpectedEOF)
	}
	return errdefs.New(errdefs.Invalid, "%s: corrupt archive: %w", what, err)
}

// fsErr classifies a filesystem error met while extracting entry name:
// running out of space is Exhausted, descriptor or memory shortage
// Unavailable, an I/O error Internal, and anything else (a file under a
// file, a hardlink to nothing, ...) Invalid, since the archive asked for it.
func fsErr(name, op string, err error) error {
	cat := inroot.Category(err)
	switch cat {
	case errdefs.Exhausted, errdefs.Unavailable, errdefs.Internal:
	default:
		cat = errdefs.Invalid
	}
	return errdefs.New(cat, "extracting %q: %s: %w", name, op, err)
}

func isDevice(t byte) bool {
	return t == tar.TypeChar || t == tar.TypeBlock || t == tar.TypeFifo
}

func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header, src *SourceReader) error {
	name := hdr.Name
	if strings.IndexByte(name, 0) >= 0 || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return errdefs.Invalidf("archive entry %q: NUL byte in name", name)
	}
	p := path.Join(x.base, inroot.Clean(name))
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		x.st.Entries--
		return nil
	case tar.TypeReg, tar.TypeCont, tar.TypeGNUSparse,
		tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if !x.opts.AllowDevices {
			if x.opts.SkipDevices {
				x.st.DevicesSkipped++
				return nil
			}
			return errdefs.Invalidf("archive entry %q is a device node or fifo; devices are not allowed", name)
		}
	default:
		return errdefs.Invalidf("archive entry %q has unsupported type %q", name, hdr.Typeflag)
	}

	if p == x.base {
		if hdr.Typeflag != tar.TypeDir {
			return errdefs.Invalidf("archive entry %q would replace the extraction directory", name)
		}
		return x.rootDir(hdr, p)
	}

	dir, base := path.Split(p)
	dirfd, _, err := inroot.MkdirAll(x.rootfd, dir, 0o755)
	if err != nil {
		return fsErr(name, "creating parent directory", err)
	}
	defer unix.Close(dirfd)

	est, err := inroot.Lstat(dirfd, base)
	exists := err == nil
	if err != nil && err != unix.ENOENT {
		return fsErr(name, "stat", err)
	}
	if x.opts.Guard != nil {
		if err := x.opts.Guard(dirfd, base, name); err != nil {
			return err
		}
	}

	if hdr.Typeflag == tar.TypeLink {
		return x.hardlink(hdr, p, dirfd, base, exists, est)
	}
	if exists && !(hdr.Typeflag == tar.TypeDir && est.Mode&unix.S_IFMT == unix.S_IFDIR) {
		if err := inroot.RemoveAll(dirfd, base); err != nil {
			return fsErr(name, "replacing existing entry", err)
		}
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(hdr, p, dirfd, base)
	case tar.TypeSymlink:
		return x.symlink(hdr, dirfd, base)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return x.device(hdr, dirfd, base)
	default:
		return x.file(tr, hdr, dirfd, base, src)
	}
}

func (x *extractor) rootDir(hdr *tar.Header, p string) error {
	fd, err := inroot.Open(x.rootfd, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fsErr(hdr.Name, "open", err)
	}
	defer unix.Close(fd)
	if err := x.meta(hdr, fd, -1, "", false); err != nil {
		return err
	}
	x.st.Dirs++
	x.recordDirTime(hdr, p)
	return nil
}

func (x *extractor) dir(hdr *tar.Header, p string, dirfd int, base string) error {
	err := unix.Mkdirat(dirfd, base, 0o700)
	if err != nil && err != unix.EEXIST {
		return fsErr(hdr.Name, "mkdir", err)
	}
	fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fsErr(hdr.Name, "open", err)
	}
	defer unix.Close(fd)
	if err := x.meta(hdr, fd, dirfd, base, false); err != nil {
		return err
	}
	x.st.Dirs++
	x.recordDirTime(hdr, p)
	return nil
}

func (x *extractor) recordDirTime(hdr *tar.Header, p string) {
	dt := dirTime{path: p, atime: hdr.AccessTime, mtime: hdr.ModTime}
	if i, ok := x.dirIndex[p]; ok {
		x.dirs[i] = dt
		return
	}
	x.dirIndex[p] = len(x.dirs)
	x.dirs = append(x.dirs, dt)
}

// applyDirTimes sets directory times last, since creating their entries
// changed them. Directories replaced since are skipped.
func (x *extractor) applyDirTimes() {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if d.mtime.IsZero() {
			continue
		}
		fd, err := inroot.Open(x.rootfd, d.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		_ = inroot.Lutimes(fd, timespec(d.atime, d.mtime), timespec(d.mtime, d.mtime))
		unix.Close(fd)
	}
}

func timespec(t, fallback time.Time) unix.Timespec {
	if t.IsZero() {
		t = fallback
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

func (x *extractor) symlink(hdr *tar.Header, dirfd int, base string) error {
	if hdr.Linkname == "" {
		return errdefs.Invalidf("archive entry %q: symlink with an empty target", hdr.Name)
	}
	if err := unix.Symlinkat(hdr.Linkname, dirfd, base); err != nil {
		return fsErr(hdr.Name, "symlink", err)
	}
	fd, err := unix.Openat(dirfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fsErr(hdr.Name, "open", err)
	}
	defer unix.Close(fd)
	x.st.Symlinks++
	return x.meta(hdr, fd, dirfd, base, true)
}

func (x *extractor) device(hdr *tar.Header, dirfd int, base string) error {
	mode := uint32(0)
	switch hdr.Typeflag {
	case tar.TypeChar:
		mode = unix.S_IFCHR
	case tar.TypeBlock:
		mode = unix.S_IFBLK
	default:
		mode = unix.S_IFIFO
	}
	dev := int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
	if err := unix.Mknodat(dirfd, base, mode|0o600, dev); err != nil {
		return fsErr(hdr.Name, "mknod", err)
	}
	fd, err := unix.Openat(dirfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fsErr(hdr.Name, "open", err)
	}
	defer unix.Close(fd)
	x.st.Devices++
	return x.meta(hdr, fd, dirfd, base, false)
}

func (x *extractor) hardlink(hdr *tar.Header, p string, dirfd int, base string, exists bool, est unix.Stat_t) error {
	if hdr.Linkname == "" {
		return errdefs.Invalidf("archive entry %q: hardlink with an empty target", hdr.Name)
	}
	target := path.Join(x.base, inroot.Clean(hdr.Linkname))
	if target == p {
		return nil
	}
	tdirfd, tbase, err := inroot.OpenParent(x.rootfd, target)
	if err == nil && tbase == "" {
		unix.Close(tdirfd)
		err = unix.EPERM
	}
	if err != nil {
		return errdefs.New(errdefs.Invalid, "archive entry %q: hardlink target %q does not resolve inside the root: %w", hdr.Name, hdr.Linkname, err)
	}
	defer unix.Close(tdirfd)
	tst, err := inroot.Lstat(tdirfd, tbase)
	if err != nil {
		return errdefs.New(errdefs.Invalid, "archive entry %q: hardlink target %q does not exist in the archive: %w", hdr.Name, hdr.Linkname, err)
	}
	if tst.Mode&unix.S_IFMT == unix.S_IFDIR {
		return errdefs.Invalidf("archive entry %q: hardlink target %q is a directory", hdr.Name, hdr.Linkname)
	}
	if exists {
		if est.Dev == tst.Dev && est.Ino == tst.Ino {
			x.st.Hardlinks++
			return nil
		}
		if err := inroot.RemoveAll(dirfd, base); err != nil {
			return fsErr(hdr.Name, "replacing existing entry", err)
		}
	}
	if err := unix.Linkat(tdirfd, tbase, dirfd, base, 0); err != nil {
		return fsErr(hdr.Name, fmt.Sprintf("hardlink to %q", hdr.Linkname), err)
	}
	x.st.Hardlinks++
	return nil
}

const copyBuf = 256 << 10

func (x *extractor) file(tr *tar.Reader, hdr *tar.Header, dirfd int, base string, src *SourceReader) error {
	if hdr.Size < 0 {
		return errdefs.Invalidf("archive entry %q: negative size", hdr.Name)
	}
	if x.opts.MaxBytes > 0 && x.st.Bytes+hdr.Size > x.opts.MaxBytes {
		return errdefs.Exhaustedf("archive entry %q: archive contents exceed the limit of %d bytes", hdr.Name, x.opts.MaxBytes)
	}
	fd, err := unix.Openat(dirfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fsErr(hdr.Name, "create", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	x.st.Files++
	// All-zero blocks are skipped, so a sparse file (an entry of a PAX or
	// GNU sparse archive, which the reader expands, or zeros written out)
	// takes on the sandbox's disk what it took where it was made.
	buf := make([]byte, copyBuf)
	var written int64
	for {
		if err := ctxErr(x.ctx); err != nil {
			return err
		}
		n, rerr := holes.Fill(tr, buf)
		if err := holes.WriteAt(fd, buf[:n], written); err != nil {
			return fsErr(hdr.Name, "write", err)
		}
		written += int64(n)
		x.st.Bytes += int64(n)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return x.readErr(src, rerr, fmt.Sprintf("reading archive entry %q", hdr.Name))
		}
	}
	if written != hdr.Size && hdr.Typeflag != tar.TypeGNUSparse {
		return errdefs.Invalidf("archive entry %q: truncated archive (%d of %d bytes)", hdr.Name, written, hdr.Size)
	}
	if err := unix.Ftruncate(fd, written); err != nil {
		return fsErr(hdr.Name, "truncate", err)
	}
	return x.meta(hdr, fd, dirfd, base, false)
}

// meta applies owner, mode, xattrs and (except for directories, whose
// times are set at the end) times to the entry fd refers to. fd is open for
// I/O for regular files and directories, O_PATH otherwise; dirfd/base name
// the entry for the path-based xattr calls on symlinks and devices.
func (x *extractor) meta(hdr *tar.Header, fd, dirfd int, base string, isLink bool) error {
	if x.opts.KeepOwners {
		if err := inroot.Lchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fsErr(hdr.Name, "chown", err)
		}
	}
	isReg := hdr.Typeflag != tar.TypeDir && !isLink && !isDevice(hdr.Typeflag)
	if !isLink {
		mode := uint32(hdr.Mode) & 0o7777
		if isReg && !x.opts.KeepSetuid && mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			mode &^= unix.S_ISUID | unix.S_ISGID
			x.st.SetuidStripped++
		}
		if err := inroot.Chmod(fd, mode); err != nil {
			return fsErr(hdr.Name, "chmod", err)
		}
	}
	if err := x.xattrs(hdr, fd, dirfd, base, isReg); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeDir && !hdr.ModTime.IsZero() {
		if err := inroot.Lutimes(fd, timespec(hdr.AccessTime, hdr.ModTime), timespec(hdr.ModTime, hdr.ModTime)); err != nil {
			return fsErr(hdr.Name, "set times", err)
		}
	}
	return nil
}

const paxXattr = "SCHILY.xattr."

func (x *extractor) xattrs(hdr *tar.Header, fd, dirfd int, base string, isReg bool) error {
	strippedCap := false
	for k, v := range hdr.PAXRecords {
		if !strings.HasPrefix(k, paxXattr) {
			continue
		}
		name := k[len(paxXattr):]
		if name == "" || skipXattr(name) {
			continue
		}
		if name == "security.capability" && !x.opts.KeepSetuid {
			strippedCap = true
			continue
		}
		var err error
		if isReg || hdr.Typeflag == tar.TypeDir {
			// Regular files and directories are open for I/O.
			err = unix.Fsetxattr(fd, name, []byte(v), 0)
		} else {
			err = unix.Lsetxattr(inroot.ProcPath(dirfd, base), name, []byte(v), 0)
		}
		if err != nil {
			if en := inroot.Errno(err); en == unix.ENOSPC || en == unix.EDQUOT {
				return fsErr(hdr.Name, "setxattr", err)
			}
			x.st.XattrsSkipped++
		}
	}
	if strippedCap && isReg && hdr.Mode&(unix.S_ISUID|unix.S_ISGID) == 0 {
		x.st.SetuidStripped++
	}
	return nil
}

// skipXattr reports xattrs that describe the host rather than the file.
func skipXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") ||
		name == "security.selinux" || name == "security.ima" || name == "security.evm"
}

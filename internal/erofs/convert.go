// Package erofs converts OCI layer tar streams into EROFS filesystem
// images that the kernel mounts read-only, as one lower layer of a
// sandbox's overlay.
//
// Convert reads an uncompressed layer (a "diff" in OCI terms) into an
// in-memory tree, spooling file contents to a temporary file, and then
// writes the image (uncompressed, 4 KiB blocks, fixed build time: the same
// layer always gives the same bytes) with one of two builders:
//
//   - mkfs.erofs of erofs-utils >= 1.8 (Options.Mkfs, see FindMkfs), fed
//     a canonical tar stream that Warren writes from the validated tree
//     (mkfs.erofs --tar=f --aufs): hardlinks are real, one inode with
//     nlink = its number of names;
//   - github.com/erofs/go-erofs, in process, the fallback. What v0.3.1 can
//     and cannot write (checked against its source): xattrs, any prefix,
//     inline; devices and fifos with rdev; setuid/setgid/sticky bits,
//     uid/gid up to 2^32-1, mtime with ns: yes. Hardlinks: NO, every path
//     is its own inode. Hardlinked files are written as independent
//     copies of the same content (same data, same metadata, nlink 1): a
//     reader sees identical files, but a write to one in the sandbox does
//     not show in the other, and the data is stored once per name.
//
// Both see the same tree, so both give the same files, modes, owners,
// times, xattrs and whiteouts; only hardlinks (and the bytes of the image)
// differ.
//
// OCI whiteouts become overlayfs whiteouts: ".wh.NAME" a 0/0 character
// device NAME, ".wh..wh..opq" the xattr trusted.overlay.opaque=y on its
// directory. A directory holding whiteouts also gets an empty
// trusted.overlay.origin (as mkfs.erofs sets it): overlayfs then never
// lists such a directory directly, which would show its whiteouts as
// entries when no other layer has that directory. Other overlay xattrs in
// the layer are dropped, so a layer cannot forge whiteouts or redirects.
//
// Unsafe input is rejected with errdefs.Invalid ("../" paths, hardlinks
// that leave the layer or point nowhere, unsupported entry types, names
// or xattrs the format cannot hold, directories named ".wh.*") or
// errdefs.Exhausted (limits), before either builder sees anything.
// Symlink targets are stored verbatim: they are resolved by the kernel
// inside the sandbox's root, never on the host. Device nodes and fifos
// are dropped (the sandbox gets its own /dev); setuid bits are kept
// unless Options.StripSetuid.
package erofs

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	goerofs "github.com/erofs/go-erofs"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx"
)

// BuilderVersion identifies the go-erofs conversion; it is recorded with
// each blob (Stats.Builder). Changing how a layer is converted must change
// it: warren-erofs/2 added trusted.overlay.origin to directories holding
// whiteouts and refuses directories named ".wh.*".
const BuilderVersion = builderPrefix + " go-erofs/v0.3.1"

const builderPrefix = "warren-erofs/2"

// BlockSize is the EROFS block size used (the page size of x86-64 and
// most arm64 kernels, which mount only images with blocks <= page size).
const BlockSize = 4096

// Limits.
const (
	DefaultMaxFiles = 1_000_000
	maxNameLen      = 255  // EROFS_NAME_LEN
	maxPathLen      = 4096 // PATH_MAX
	maxXattrName    = 255  // name length after the prefix (u8)
	maxXattrValue   = 65535
	maxXattrsPerEnt = 64 << 10 // total xattr bytes of one inode
)

// Overlayfs conventions.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	metaPrefix     = ".wh..wh."
	// OpaqueXattr marks a directory as opaque for overlayfs.
	OpaqueXattr = "trusted.overlay.opaque"
	// OriginXattr, present (empty) on a lower directory, makes overlayfs
	// merge-list it, hiding its whiteouts, even when no other layer has it.
	OriginXattr = "trusted.overlay.origin"
)

// Options control Convert.
type Options struct {
	// MaxFiles limits the entries of a layer: 0 means DefaultMaxFiles, a
	// negative value means no limit. Exceeding it is Exhausted.
	MaxFiles int64
	// MaxBytes limits the total size of regular file contents; 0 means no
	// limit. Exceeding it is Exhausted.
	MaxBytes int64
	// StripSetuid clears setuid/setgid bits and drops security.capability.
	StripSetuid bool
	// TempDir holds the spool file (unlinked at once); "" is os.TempDir.
	TempDir string
	// ExpectDiffID, if set ("sha256:<hex>"), is checked against the
	// sha256 of the whole tar stream; a mismatch is Invalid.
	ExpectDiffID string
	// Mkfs, if set, builds the image with this mkfs.erofs instead of
	// go-erofs (see FindMkfs). It writes out directly when out is an
	// *os.File, else a temporary file in TempDir that is then copied.
	Mkfs *Mkfs
	// Progress, if set, is called now and then while the image is built
	// with the bytes done so far: bytes of the image written (go-erofs)
	// or of the layer handed to mkfs.erofs, about the tar's size.
	Progress func(done int64)
}

// Stats describes a converted layer.
type Stats struct {
	// Builder is what wrote the image: BuilderVersion or
	// Mkfs.BuilderVersion ("warren-erofs/2 mkfs.erofs/1.8.6").
	Builder        string
	DiffID         string // sha256 of the tar stream read, "sha256:<hex>"
	TarBytes       int64  // length of the tar stream
	Entries        int64  // tar entries processed
	Files          int64  // regular files (each name of a hardlinked file counted)
	Dirs           int64
	Symlinks       int64
	Hardlinks      int64 // hardlink entries (copies with go-erofs, links with mkfs.erofs)
	Whiteouts      int64 // ".wh." entries turned into 0/0 char devices
	Opaques        int64 // opaque directory markers
	Bytes          int64 // regular file content
	DevicesSkipped int64 // device nodes and fifos dropped
	SetuidStripped int64
	XattrsSkipped  int64 // xattrs dropped (overlay, selinux, ...)
	// RootOpaque is set when the layer marks its root opaque: overlayfs
	// ignores that, so the layers below must be dropped by whoever stacks
	// the layers (image.Store does).
	RootOpaque bool
	// MaxID is the highest uid or gid of the layer's entries: a sandbox
	// in a user namespace of 65,536 ids sees the layer as it is only
	// when it is below that.
	MaxID uint32
}

// Inodes is the number of inodes of the image, counting each name of a
// hardlinked file (one inode per name with go-erofs).
func (s Stats) Inodes() int64 { return s.Files + s.Dirs + s.Symlinks + s.Whiteouts }

type node struct {
	mode     uint32 // unix mode with type bits
	uid, gid uint32
	mtime    int64
	mtimeNs  uint32
	size     int64
	off      int64  // spool offset of the contents
	target   string // symlink
	rdev     uint32
	xattrs   map[string]string
	children map[string]*node // directories
	explicit bool             // a directory that had its own tar entry
	whiteout bool
	linked   bool // a regular file that several names may share (hardlinks)
}

func (n *node) isDir() bool { return n.mode&sIFMT == sIFDIR }

const (
	sIFMT  = 0o170000
	sIFDIR = 0o040000
	sIFREG = 0o100000
	sIFLNK = 0o120000
	sIFCHR = 0o020000
)

func newDir(mode uint32) *node {
	return &node{mode: sIFDIR | mode, children: map[string]*node{}}
}

type converter struct {
	ctx   context.Context
	opts  Options
	root  *node
	spool *os.File
	off   int64
	st    Stats
	buf   []byte
}

// Convert reads the uncompressed layer tar stream r to its end and writes
// its EROFS image to out (from offset 0; out is not truncated or closed).
// The diffID of r is in the returned Stats. On error out holds garbage.
func Convert(ctx context.Context, r io.Reader, out io.WriteSeeker, opts Options) (Stats, error) {
	c := &converter{ctx: ctx, opts: opts, root: newDir(0o755), buf: make([]byte, 256<<10)}
	c.root.explicit = false
	if c.opts.MaxFiles == 0 {
		c.opts.MaxFiles = DefaultMaxFiles
	}
	spool, err := os.CreateTemp(opts.TempDir, ".erofs-spool-")
	if err != nil {
		return c.st, errdefs.Wrap(errnoCategory(err), err, "creating spool file")
	}
	_ = os.Remove(spool.Name())
	defer spool.Close()
	c.spool = spool

	h := sha256.New()
	cr := &countReader{r: io.TeeReader(r, h)}
	if err := c.read(cr); err != nil {
		return c.st, err
	}
	c.st.TarBytes = cr.n
	c.st.DiffID = digestOf(h)
	if opts.ExpectDiffID != "" && opts.ExpectDiffID != c.st.DiffID {
		return c.st, errdefs.Invalidf("layer diffID mismatch: the content has %s, expected %s", c.st.DiffID, opts.ExpectDiffID)
	}
	if err := ctxErr(ctx); err != nil {
		return c.st, err
	}
	if opts.Mkfs != nil {
		c.st.Builder = opts.Mkfs.BuilderVersion()
		return c.st, opts.Mkfs.build(ctx, c, out)
	}
	c.st.Builder = BuilderVersion
	if opts.Progress != nil {
		out = &progressWriter{w: out, fn: opts.Progress}
	}
	w := goerofs.Create(out, goerofs.WithBlockSize(BlockSize), goerofs.WithBuildTime(0, 0))
	if err := w.CopyFrom(&treeFS{c: c}); err != nil {
		return c.st, writeErr(err)
	}
	if err := w.Close(); err != nil {
		return c.st, writeErr(err)
	}
	return c.st, nil
}

// progressWriter reports the bytes written through it.
type progressWriter struct {
	w  io.WriteSeeker
	fn func(int64)
	n  int64
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	p.fn(p.n)
	return n, err
}

func (p *progressWriter) Seek(off int64, whence int) (int64, error) { return p.w.Seek(off, whence) }

func writeErr(err error) error {
	if errdefs.CategoryOf(err) != errdefs.Unknown {
		return err
	}
	return errdefs.Wrap(errnoCategory(err), err, "writing EROFS image")
}

func errnoCategory(err error) errdefs.Category {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errdefs.Exhausted
	}
	return errdefs.Internal
}

func digestOf(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errdefs.Wrap(errdefs.DeadlineExceeded, err, "layer conversion interrupted")
	}
	return fmt.Errorf("layer conversion interrupted: %w", err)
}

func (c *converter) read(cr *countReader) error {
	tail := &tarx.TailReader{R: cr}
	tr := tar.NewReader(tail)
	sawEnd := false
	for {
		if err := ctxErr(c.ctx); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			sawEnd = true
			break
		}
		if err != nil {
			return readErr(err, "reading layer")
		}
		c.st.Entries++
		c.st.MaxID = max(c.st.MaxID, uint32(max(hdr.Uid, hdr.Gid, 0)))
		if c.opts.MaxFiles > 0 && c.st.Entries > c.opts.MaxFiles {
			return errdefs.Exhaustedf("layer has more than %d entries", c.opts.MaxFiles)
		}
		if err := c.entry(tr, hdr); err != nil {
			return err
		}
	}
	if !sawEnd || cr.n == 0 {
		return errdefs.Invalidf("empty or truncated layer")
	}
	if !tail.EndsWithZeros() {
		return errdefs.Invalidf("truncated layer: no end-of-archive marker")
	}
	// The diffID covers the whole stream: read what follows the end
	// marker (padding), bounded.
	n, err := io.Copy(io.Discard, io.LimitReader(cr, 64<<20))
	if err != nil {
		return readErr(err, "reading layer")
	}
	if n == 64<<20 {
		return errdefs.Invalidf("layer has more than 64 MiB of data after the end of the archive")
	}
	return nil
}

func readErr(err error, what string) error {
	if errdefs.CategoryOf(err) != errdefs.Unknown {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err == io.ErrUnexpectedEOF {
		return errdefs.New(errdefs.Invalid, "%s: truncated archive: %w", what, err)
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) {
		return errdefs.Wrap(errdefs.Unavailable, err, what)
	}
	return errdefs.New(errdefs.Invalid, "%s: corrupt archive: %w", what, err)
}

// cleanName validates a tar entry name and returns its components.
// Leading "/" and "./" are dropped; ".." anywhere is refused.
func cleanName(name string) ([]string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return nil, errdefs.Invalidf("layer entry %q: NUL byte in name", name)
	}
	if len(name) > maxPathLen {
		return nil, errdefs.Invalidf("layer entry %.64q...: path longer than %d bytes", name, maxPathLen)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return nil, errdefs.Invalidf("layer entry %q: path escapes the layer root (\"..\")", name)
		}
		if len(p) > maxNameLen {
			return nil, errdefs.Invalidf("layer entry %q: name component longer than %d bytes", name, maxNameLen)
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// dirOf returns the directory node at parts, creating missing
// directories (0755 root:root, as the runtime would).
func (c *converter) dirOf(name string, parts []string) (*node, error) {
	d := c.root
	for i, p := range parts {
		if strings.HasPrefix(p, whiteoutPrefix) {
			// A whiteout's name as a directory: Docker would make a
			// directory of that name, overlayfs and mkfs.erofs --aufs read
			// it as a whiteout. Refused, as commits refuse such names.
			return nil, errdefs.Invalidf("layer entry %q: directory %q: names starting with %q are reserved for whiteouts", name, strings.Join(parts[:i+1], "/"), whiteoutPrefix)
		}
		n, ok := d.children[p]
		if !ok || n.whiteout {
			if ok {
				c.st.Whiteouts--
			}
			n = newDir(0o755)
			d.children[p] = n
			c.st.Dirs++
		} else if !n.isDir() {
			return nil, errdefs.Invalidf("layer entry %q: %q is not a directory in this layer", name, strings.Join(parts[:i+1], "/"))
		}
		d = n
	}
	return d, nil
}

func (c *converter) entry(tr *tar.Reader, hdr *tar.Header) error {
	name := hdr.Name
	if strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return errdefs.Invalidf("layer entry %q: NUL byte in link name", name)
	}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		c.st.Entries--
		return nil
	case tar.TypeReg, tar.TypeRegA, tar.TypeCont, tar.TypeGNUSparse, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		c.st.DevicesSkipped++
		return nil
	default:
		return errdefs.Invalidf("layer entry %q has unsupported type %q", name, hdr.Typeflag)
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || int64(hdr.Uid) > 1<<32-2 || int64(hdr.Gid) > 1<<32-2 {
		return errdefs.Invalidf("layer entry %q: uid/gid %d/%d out of range", name, hdr.Uid, hdr.Gid)
	}
	parts, err := cleanName(name)
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		if hdr.Typeflag != tar.TypeDir {
			return errdefs.Invalidf("layer entry %q would replace the layer root", name)
		}
		c.root.explicit = true
		return c.setMeta(c.root, hdr)
	}
	base := parts[len(parts)-1]
	parent, err := c.dirOf(name, parts[:len(parts)-1])
	if err != nil {
		return err
	}

	// Whiteouts.
	if strings.HasPrefix(base, whiteoutPrefix) {
		switch {
		case base == opaqueMarker:
			if len(parts) == 1 {
				c.st.RootOpaque = true
			}
			if parent.xattrs == nil {
				parent.xattrs = map[string]string{}
			}
			parent.xattrs[OpaqueXattr] = "y"
			c.st.Opaques++
		case strings.HasPrefix(base, metaPrefix):
			// AUFS bookkeeping (.wh..wh.plnk, .wh..wh.aufs): no meaning.
		default:
			target := base[len(whiteoutPrefix):]
			if target == "" || target == "." || target == ".." {
				return errdefs.Invalidf("layer entry %q: invalid whiteout", name)
			}
			if old, ok := parent.children[target]; ok && !old.whiteout {
				// Whiteouts hide lower layers only: an entry of the same
				// layer stays.
				return nil
			}
			if _, ok := parent.children[target]; !ok {
				c.st.Whiteouts++
			}
			parent.children[target] = &node{mode: sIFCHR, whiteout: true}
		}
		return nil
	}

	old := parent.children[base]
	if old != nil && old.whiteout {
		c.st.Whiteouts--
		old = nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if old != nil && old.isDir() {
			old.explicit = true
			return c.setMeta(old, hdr)
		}
		n := newDir(0)
		n.explicit = true
		c.replace(parent, base, old, n)
		c.st.Dirs++
		return c.setMeta(n, hdr)
	case tar.TypeSymlink:
		if hdr.Linkname == "" {
			return errdefs.Invalidf("layer entry %q: symlink with an empty target", name)
		}
		if len(hdr.Linkname) >= maxPathLen {
			return errdefs.Invalidf("layer entry %q: symlink target longer than %d bytes", name, maxPathLen-1)
		}
		n := &node{mode: sIFLNK | 0o777, target: hdr.Linkname}
		c.replace(parent, base, old, n)
		c.st.Symlinks++
		return c.setMeta(n, hdr)
	case tar.TypeLink:
		return c.hardlink(parent, base, old, hdr)
	default:
		n := &node{mode: sIFREG}
		if err := c.content(tr, hdr, n); err != nil {
			return err
		}
		c.replace(parent, base, old, n)
		c.st.Files++
		return c.setMeta(n, hdr)
	}
}

// replace binds name in dir to n, forgetting what was there.
func (c *converter) replace(dir *node, name string, old, n *node) {
	if old != nil {
		c.forget(old)
	}
	dir.children[name] = n
}

// forget updates the counters for a subtree that is replaced.
func (c *converter) forget(n *node) {
	switch n.mode & sIFMT {
	case sIFDIR:
		c.st.Dirs--
		for _, ch := range n.children {
			c.forget(ch)
		}
	case sIFLNK:
		c.st.Symlinks--
	case sIFCHR:
		c.st.Whiteouts--
	default:
		c.st.Files--
		c.st.Bytes -= n.size
	}
}

func (c *converter) hardlink(parent *node, base string, old *node, hdr *tar.Header) error {
	if hdr.Linkname == "" {
		return errdefs.Invalidf("layer entry %q: hardlink with an empty target", hdr.Name)
	}
	tparts, err := cleanName(hdr.Linkname)
	if err != nil {
		return errdefs.Invalidf("layer entry %q: hardlink target %q leaves the layer", hdr.Name, hdr.Linkname)
	}
	if len(tparts) == 0 {
		return errdefs.Invalidf("layer entry %q: hardlink to the layer root", hdr.Name)
	}
	t := c.root
	for _, p := range tparts {
		if t == nil || !t.isDir() {
			t = nil
			break
		}
		t = t.children[p]
	}
	if t == nil || t.whiteout {
		return errdefs.Invalidf("layer entry %q: hardlink target %q is not in this layer", hdr.Name, hdr.Linkname)
	}
	if t.mode&sIFMT != sIFREG {
		return errdefs.Invalidf("layer entry %q: hardlink target %q is not a regular file", hdr.Name, hdr.Linkname)
	}
	if t == old {
		return nil
	}
	if c.opts.MaxBytes > 0 && c.st.Bytes+t.size > c.opts.MaxBytes {
		return errdefs.Exhaustedf("layer entry %q: layer contents exceed the limit of %d bytes", hdr.Name, c.opts.MaxBytes)
	}
	// Both names point at one node: mkfs.erofs writes one inode, go-erofs
	// (which cannot share an inode between names) a copy per name.
	t.linked = true
	c.replace(parent, base, old, t)
	c.st.Files++
	c.st.Hardlinks++
	c.st.Bytes += t.size
	return nil
}

func (c *converter) content(tr *tar.Reader, hdr *tar.Header, n *node) error {
	if hdr.Size < 0 {
		return errdefs.Invalidf("layer entry %q: negative size", hdr.Name)
	}
	if c.opts.MaxBytes > 0 && c.st.Bytes+hdr.Size > c.opts.MaxBytes {
		return errdefs.Exhaustedf("layer entry %q: layer contents exceed the limit of %d bytes", hdr.Name, c.opts.MaxBytes)
	}
	n.off = c.off
	var written int64
	for {
		if err := ctxErr(c.ctx); err != nil {
			return err
		}
		k, rerr := tr.Read(c.buf)
		if k > 0 {
			if _, werr := c.spool.Write(c.buf[:k]); werr != nil {
				return errdefs.Wrap(errnoCategory(werr), werr, "spooling layer contents")
			}
			written += int64(k)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return readErr(rerr, fmt.Sprintf("reading layer entry %q", hdr.Name))
		}
	}
	if written != hdr.Size && hdr.Typeflag != tar.TypeGNUSparse {
		return errdefs.Invalidf("layer entry %q: truncated (%d of %d bytes)", hdr.Name, written, hdr.Size)
	}
	if c.opts.MaxBytes > 0 && c.st.Bytes+written > c.opts.MaxBytes {
		return errdefs.Exhaustedf("layer entry %q: layer contents exceed the limit of %d bytes", hdr.Name, c.opts.MaxBytes)
	}
	n.size = written
	c.off += written
	c.st.Bytes += written
	return nil
}

const paxXattr = "SCHILY.xattr."

func (c *converter) setMeta(n *node, hdr *tar.Header) error {
	n.uid, n.gid = uint32(hdr.Uid), uint32(hdr.Gid)
	if n.mode&sIFMT != sIFLNK {
		perm := uint32(hdr.Mode) & 0o7777
		if n.mode&sIFMT == sIFREG && c.opts.StripSetuid && perm&0o6000 != 0 {
			perm &^= 0o6000
			c.st.SetuidStripped++
		}
		n.mode = n.mode&sIFMT | perm
	}
	if mt := hdr.ModTime; !mt.IsZero() && mt.Unix() > 0 {
		n.mtime, n.mtimeNs = mt.Unix(), uint32(mt.Nanosecond())
	} else {
		n.mtime, n.mtimeNs = 0, 0
	}
	// Keep an opaque marker set by an earlier ".wh..wh..opq" entry.
	opaque := n.xattrs[OpaqueXattr]
	n.xattrs = nil
	if opaque != "" {
		n.xattrs = map[string]string{OpaqueXattr: opaque}
	}
	total := 0
	keys := make([]string, 0, len(hdr.PAXRecords))
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxXattr) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := hdr.PAXRecords[k]
		xn := k[len(paxXattr):]
		if !keepXattr(xn) {
			c.st.XattrsSkipped++
			continue
		}
		if xn == "security.capability" && c.opts.StripSetuid {
			c.st.SetuidStripped++
			continue
		}
		if len(xattrSuffix(xn)) > maxXattrName || len(v) > maxXattrValue {
			return errdefs.Invalidf("layer entry %q: xattr %.64q too long", hdr.Name, xn)
		}
		total += 4 + len(xn) + len(v)
		if total > maxXattrsPerEnt {
			return errdefs.Invalidf("layer entry %q: more than %d bytes of xattrs", hdr.Name, maxXattrsPerEnt)
		}
		if n.xattrs == nil {
			n.xattrs = map[string]string{}
		}
		n.xattrs[xn] = v
	}
	return nil
}

// keepXattr reports the xattrs a layer may carry: user.*, file
// capabilities and POSIX ACLs. trusted.* (overlay whiteouts, redirects,
// metacopy) and LSM labels of the build host are dropped.
func keepXattr(name string) bool {
	switch {
	case strings.HasPrefix(name, "user.") && len(name) > len("user."):
		return true
	case name == "security.capability",
		name == "system.posix_acl_access", name == "system.posix_acl_default":
		return true
	}
	return false
}

func xattrSuffix(name string) string {
	for _, p := range []string{"user.", "system.posix_acl_access", "system.posix_acl_default", "trusted.", "security."} {
		if strings.HasPrefix(name, p) {
			return name[len(p):]
		}
	}
	return name
}

// --- the tree as an fs.FS for go-erofs's CopyFrom ---

type treeFS struct{ c *converter }

func (t *treeFS) lookup(name string) (*node, error) {
	if !validPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	n := t.c.root
	if name == "." {
		return n, nil
	}
	for _, p := range strings.Split(name, "/") {
		if !n.isDir() {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		ch, ok := n.children[p]
		if !ok {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		n = ch
	}
	return n, nil
}

// validPath is fs.ValidPath without its UTF-8 rule: a layer's names are
// bytes, and Latin-1 names are as valid in a tar as on Linux.
func validPath(name string) bool {
	if name == "." {
		return true
	}
	for _, p := range strings.Split(name, "/") {
		if p == "" || p == "." || p == ".." {
			return false
		}
	}
	return true
}

func (t *treeFS) Open(name string) (fs.File, error) {
	n, err := t.lookup(name)
	if err != nil {
		return nil, err
	}
	f := &treeFile{info: fileInfo{name: path.Base(name), n: n}}
	if n.mode&sIFMT == sIFREG && n.size > 0 {
		f.r = io.NewSectionReader(t.c.spool, n.off, n.size)
	}
	return f, nil
}

func (t *treeFS) Stat(name string) (fs.FileInfo, error) {
	n, err := t.lookup(name)
	if err != nil {
		return nil, err
	}
	return fileInfo{name: path.Base(name), n: n}, nil
}

func (t *treeFS) ReadDir(name string) ([]fs.DirEntry, error) {
	n, err := t.lookup(name)
	if err != nil {
		return nil, err
	}
	if !n.isDir() {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
	}
	out := make([]fs.DirEntry, 0, len(n.children))
	for nm, ch := range n.children {
		out = append(out, fs.FileInfoToDirEntry(fileInfo{name: nm, n: ch}))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out, nil
}

// ReadLink is used by go-erofs for symlink targets.
func (t *treeFS) ReadLink(name string) (string, error) {
	n, err := t.lookup(name)
	if err != nil {
		return "", err
	}
	return n.target, nil
}

type treeFile struct {
	info fileInfo
	r    *io.SectionReader
}

func (f *treeFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *treeFile) Close() error               { return nil }
func (f *treeFile) Read(p []byte) (int, error) {
	if f.r == nil {
		return 0, io.EOF
	}
	return f.r.Read(p)
}

type fileInfo struct {
	name string
	n    *node
}

func (fi fileInfo) Name() string       { return fi.name }
func (fi fileInfo) Size() int64        { return fi.n.size }
func (fi fileInfo) ModTime() time.Time { return time.Unix(fi.n.mtime, int64(fi.n.mtimeNs)) }
func (fi fileInfo) IsDir() bool        { return fi.n.isDir() }
func (fi fileInfo) Mode() fs.FileMode {
	m := fs.FileMode(fi.n.mode & 0o777)
	if fi.n.mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if fi.n.mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if fi.n.mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch fi.n.mode & sIFMT {
	case sIFDIR:
		m |= fs.ModeDir
	case sIFLNK:
		m |= fs.ModeSymlink
	case sIFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	}
	return m
}

func (fi fileInfo) Sys() any {
	n := fi.n
	nlink := 1
	xattrs := n.xattrs
	if n.isDir() {
		nlink = 2
		whiteouts := false
		for _, ch := range n.children {
			if ch.isDir() {
				nlink++
			}
			whiteouts = whiteouts || ch.whiteout
		}
		if whiteouts {
			xattrs = make(map[string]string, len(n.xattrs)+1)
			for k, v := range n.xattrs {
				xattrs[k] = v
			}
			xattrs[OriginXattr] = ""
		}
	}
	return &goerofs.Stat{
		Mode:    fi.Mode(),
		Size:    n.size,
		Rdev:    n.rdev,
		UID:     n.uid,
		GID:     n.gid,
		Mtime:   uint64(n.mtime),
		MtimeNs: n.mtimeNs,
		Nlink:   nlink,
		Xattrs:  xattrs,
	}
}

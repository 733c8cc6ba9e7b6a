package erofs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

// MkfsEnv names the environment variable that selects the mkfs.erofs of
// the daemon and the tests: a path, "auto" or "off" (see SelectMkfs).
const MkfsEnv = "WARREN_MKFS_EROFS"

// MkfsPrefix is where scripts/erofs-utils.sh installs Debian trixie's
// erofs-utils; its bin/mkfs.erofs runs it through its own loader.
const MkfsPrefix = "/opt/warren/erofs-utils"

// MkfsSearchPath is what FindMkfs tries, in order, before $PATH.
var MkfsSearchPath = []string{MkfsPrefix + "/bin/mkfs.erofs"}

// Minimum mkfs.erofs version: --tar=f and --aufs came with erofs-utils 1.8
// (tar input in 1.7, --aufs in 1.8), so did -Uclear and --mkfs-time.
const minMkfsMajor, minMkfsMinor = 1, 8

// Mkfs is an erofs-utils mkfs.erofs that can build layers from tar streams.
type Mkfs struct {
	Path    string // the executable (a wrapper script is fine)
	Version string // as it reports it, e.g. "1.8.6"
}

// BuilderVersion identifies conversions by this mkfs.erofs, e.g.
// "warren-erofs/2 mkfs.erofs/1.8.6".
func (m *Mkfs) BuilderVersion() string { return builderPrefix + " mkfs.erofs/" + m.Version }

func (m *Mkfs) String() string { return "mkfs.erofs " + m.Version + " (" + m.Path + ")" }

// "mkfs.erofs (erofs-utils) 1.8.6", or "mkfs.erofs 1.5" before 1.6.
var mkfsVersionRe = regexp.MustCompile(`mkfs\.erofs\s+(?:\(erofs-utils\)\s+)?v?(\d+)\.(\d+)(\.\d+)?`)

// ProbeMkfs runs path --version and returns it if it is erofs-utils'
// mkfs.erofs >= 1.8; otherwise an Unavailable error saying why.
func ProbeMkfs(path string) (*Mkfs, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Env = mkfsEnv("")
	out, err := cmd.CombinedOutput()
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "mkfs.erofs "+path+": not installed")
		}
		return nil, errdefs.New(errdefs.Unavailable, "mkfs.erofs %s --version: %w: %s", path, err, firstLine(out))
	}
	m := mkfsVersionRe.FindSubmatch(out)
	if m == nil {
		return nil, errdefs.Unavailablef("mkfs.erofs %s: no mkfs.erofs version in %q", path, firstLine(out))
	}
	major, _ := strconv.Atoi(string(m[1]))
	minor, _ := strconv.Atoi(string(m[2]))
	v := string(m[1]) + "." + string(m[2]) + string(m[3])
	if major < minMkfsMajor || major == minMkfsMajor && minor < minMkfsMinor {
		return nil, errdefs.Unavailablef("mkfs.erofs %s is erofs-utils %s; --tar=f --aufs needs >= %d.%d", path, v, minMkfsMajor, minMkfsMinor)
	}
	return &Mkfs{Path: path, Version: v}, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// FindMkfs returns the first usable mkfs.erofs >= 1.8 of MkfsSearchPath
// and $PATH. When there is none the error (Unavailable) tells, for each
// place, why not, and quotes the last failure of scripts/erofs-utils.sh.
func FindMkfs() (*Mkfs, error) {
	var why []string
	cands := append([]string(nil), MkfsSearchPath...)
	if p, err := exec.LookPath("mkfs.erofs"); err == nil {
		cands = append(cands, p)
	} else {
		why = append(why, "no mkfs.erofs in $PATH")
	}
	seen := map[string]bool{}
	for _, c := range cands {
		if seen[c] {
			continue
		}
		seen[c] = true
		m, err := ProbeMkfs(c)
		if err == nil {
			return m, nil
		}
		why = append(why, strings.TrimPrefix(err.Error(), "mkfs.erofs "))
	}
	msg := "no mkfs.erofs >= 1.8 (" + strings.Join(why, "; ") + "); scripts/erofs-utils.sh installs one in " + MkfsPrefix
	if b, err := os.ReadFile(MkfsPrefix + ".error"); err == nil && len(bytes.TrimSpace(b)) > 0 {
		msg += ", and its last attempt failed: " + strings.TrimSpace(string(b))
	}
	return nil, errdefs.Unavailablef("%s", msg)
}

// SelectMkfs resolves a setting ("auto" or "", "off", or a path):
//   - "off": nil, nil, nil (go-erofs);
//   - "auto": FindMkfs's result, or nil with why (go-erofs);
//   - a path: that mkfs.erofs, or an error if it is not usable.
func SelectMkfs(setting string) (m *Mkfs, why error, err error) {
	switch setting {
	case "off", "none", "go-erofs":
		return nil, errors.New("mkfs.erofs turned off"), nil
	case "", "auto":
		m, why := FindMkfs()
		return m, why, nil
	}
	m, err = ProbeMkfs(setting)
	return m, nil, err
}

// mkfsArgs are the options of every build, for the image at dst read from
// a tar on stdin:
//
//	--tar=f        a full image from a tarball (data copied in), on stdin
//	--aufs         .wh.NAME -> 0/0 char device, .wh..wh..opq -> opaque xattr
//	-b4096         BlockSize, as go-erofs
//	-T0 --mkfs-time  build time 0 but each file keeps its own mtime
//	-Uclear        no random UUID: the same layer gives the same bytes
//	--quiet        nothing on stdout
//
// No -z: uncompressed. uid/gid are kept (no --all-root, --force-uid).
func mkfsArgs(dst string) []string {
	return []string{"--quiet", "--tar=f", "--aufs", "-b" + strconv.Itoa(BlockSize), "-T0", "--mkfs-time", "-Uclear", dst}
}

func mkfsEnv(tmp string) []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	if tmp != "" {
		env = append(env, "TMPDIR="+tmp)
	}
	return env
}

// erofsMagic is the superblock magic at offset 1024.
const erofsMagic = 0xE0F5E1E2

// build writes c's tree as a tar stream to mkfs.erofs, which writes the
// image to out.
func (m *Mkfs) build(ctx context.Context, c *converter, out io.WriteSeeker) error {
	tmpDir := c.opts.TempDir
	if tmpDir == "" {
		tmpDir = os.TempDir()
	}
	dst, direct := out.(*os.File)
	if !direct {
		f, err := os.CreateTemp(tmpDir, ".erofs-image-")
		if err != nil {
			return errdefs.Wrap(errnoCategory(err), err, "mkfs.erofs: creating the image file")
		}
		_ = os.Remove(f.Name())
		defer f.Close()
		dst = f
	}
	// mkfs.erofs opens its destination by name: /proc/self/fd/3 reopens
	// our file, whatever its name is meanwhile.
	cmd := exec.Command(m.Path, mkfsArgs("/proc/self/fd/3")...)
	cmd.ExtraFiles = []*os.File{dst}
	cmd.Env = mkfsEnv(tmpDir)
	stderr := &tailBuffer{max: 8 << 10}
	cmd.Stderr = stderr
	cmd.Stdout = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "mkfs.erofs")
	}
	if err := cmd.Start(); err != nil {
		stdin.Close()
		return errdefs.Wrap(errdefs.Unavailable, err, "starting "+m.String())
	}
	// Kill it on cancellation; the tar writer then fails with EPIPE.
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	werr := c.writeTar(stdin)
	if cerr := stdin.Close(); werr == nil {
		werr = cerr
	}
	waitErr := cmd.Wait()
	stop()
	if err := ctxErr(ctx); err != nil {
		return err
	}
	if werr != nil && !errors.Is(werr, syscall.EPIPE) {
		// Our side failed (the spool, say): mkfs.erofs only saw a
		// truncated stream.
		return errdefs.Wrap(errnoCategory(werr), werr, "feeding mkfs.erofs")
	}
	if waitErr != nil {
		msg := strings.TrimSpace(stderr.String())
		cat := errdefs.Internal
		if strings.Contains(msg, "No space left") || strings.Contains(msg, "Disk quota exceeded") {
			cat = errdefs.Exhausted
		}
		return errdefs.New(cat, "%s failed on a validated layer: %w: %s", m, waitErr, msg)
	}
	if werr != nil {
		return errdefs.Wrap(errnoCategory(werr), werr, "feeding mkfs.erofs")
	}
	var sb [4]byte
	if _, err := dst.ReadAt(sb[:], 1024); err != nil || binary.LittleEndian.Uint32(sb[:]) != erofsMagic {
		return errdefs.Internalf("%s wrote no EROFS image (superblock: %x, %v): %s", m, sb, err, strings.TrimSpace(stderr.String()))
	}
	if !direct {
		if _, err := out.Seek(0, io.SeekStart); err != nil {
			return writeErr(err)
		}
		if _, err := io.Copy(out, io.NewSectionReader(dst, 0, 1<<62)); err != nil {
			return writeErr(err)
		}
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// --- the canonical tar stream mkfs.erofs reads ---
//
// The tree, depth first, names sorted, each directory before its contents:
// POSIX pax, every entry with a pax header holding its path (and link
// target, uid/gid/size when they do not fit the ustar fields, mtime when
// it has nanoseconds, xattrs as SCHILY.xattr.*). A file with several names
// is written once, its other names as hardlinks to the first. For --aufs,
// whiteouts are empty ".wh.NAME" files (mkfs.erofs makes them 0/0
// character devices and gives their directory trusted.overlay.origin) and
// an opaque directory is followed by its ".wh..wh..opq" entry. The stream
// is an OCI layer with the tree's meaning, except for an opaque root.
//
// archive/tar's writer is not used because it writes a pax mtime with
// nanoseconds as "S.F" with F's trailing zeros trimmed, which mkfs.erofs
// 1.8 reads as F nanoseconds (sscanf "%d" of the digits after the dot):
// 1.5 s would become 1 s + 5 ns. Here F always has nine digits.

type tarStream struct {
	w        *bufio.Writer
	n        int64
	progress func(int64)
	hdr      [512]byte
	pax      bytes.Buffer
	spool    *os.File
	buf      []byte
}

// countWriter counts bytes for progress reports, made at least every
// 64 KiB (bufio passes large writes through whole).
type countWriter struct {
	w  io.Writer
	t  *tarStream
	fn func(int64)
}

func (cw *countWriter) Write(p []byte) (int, error) {
	done := 0
	for len(p) > 0 {
		k := min(len(p), 64<<10)
		n, err := cw.w.Write(p[:k])
		done += n
		cw.t.n += int64(n)
		if cw.fn != nil {
			cw.fn(cw.t.n)
		}
		if err != nil {
			return done, err
		}
		p = p[k:]
	}
	return done, nil
}

func (c *converter) writeTar(w io.Writer) error {
	t := &tarStream{spool: c.spool, buf: c.buf}
	t.w = bufio.NewWriterSize(&countWriter{w: w, t: t, fn: c.opts.Progress}, 64<<10)
	links := map[*node]string{}
	if err := c.writeDir(t, "", c.root, links); err != nil {
		return err
	}
	var end [1024]byte
	if _, err := t.w.Write(end[:]); err != nil {
		return err
	}
	return t.w.Flush()
}

func (c *converter) writeDir(t *tarStream, p string, n *node, links map[*node]string) error {
	if err := ctxErr(c.ctx); err != nil {
		return err
	}
	name := p
	if name == "" {
		name = "./"
	}
	// An opaque directory is followed by its ".wh..wh..opq" entry, which
	// --aufs turns into trusted.overlay.opaque=y; except the root, where
	// mkfs.erofs 1.8 fails on it (ENOTDIR): there the xattr is written as
	// a pax record.
	xattrs := n.xattrs
	opaque := xattrs[OpaqueXattr] != "" && p != ""
	if opaque {
		xattrs = make(map[string]string, len(n.xattrs))
		for k, v := range n.xattrs {
			if k != OpaqueXattr {
				xattrs[k] = v
			}
		}
	}
	if err := t.entry(name, '5', n, 0, "", xattrs); err != nil {
		return err
	}
	if opaque {
		if err := t.entry(join(p, opaqueMarker), '0', &node{}, 0, "", nil); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(n.children))
	for nm := range n.children {
		names = append(names, nm)
	}
	sort.Strings(names)
	for _, nm := range names {
		ch := n.children[nm]
		cp := join(p, nm)
		var err error
		switch {
		case ch.whiteout:
			err = t.entry(join(p, whiteoutPrefix+nm), '0', &node{}, 0, "", nil)
		case ch.isDir():
			err = c.writeDir(t, cp, ch, links)
		case ch.mode&sIFMT == sIFLNK:
			err = t.entry(cp, '2', ch, 0, ch.target, ch.xattrs)
		default:
			if first, ok := links[ch]; ok {
				err = t.entry(cp, '1', ch, 0, first, nil)
				break
			}
			if ch.linked {
				links[ch] = cp
			}
			if err = t.entry(cp, '0', ch, ch.size, "", ch.xattrs); err == nil {
				err = t.data(ch)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

const (
	maxOctal7  = 1<<21 - 1 // 7 octal digits
	maxOctal11 = 1<<33 - 1 // 11 octal digits
)

// entry writes a pax header and a ustar header.
func (t *tarStream) entry(name string, typ byte, n *node, size int64, link string, xattrs map[string]string) error {
	t.pax.Reset()
	t.record("path", name)
	if link != "" {
		t.record("linkpath", link)
	}
	if n.uid > maxOctal7 {
		t.record("uid", strconv.FormatUint(uint64(n.uid), 10))
	}
	if n.gid > maxOctal7 {
		t.record("gid", strconv.FormatUint(uint64(n.gid), 10))
	}
	if size > maxOctal11 {
		t.record("size", strconv.FormatInt(size, 10))
	}
	if n.mtimeNs != 0 || n.mtime > maxOctal11 {
		t.record("mtime", fmt.Sprintf("%d.%09d", n.mtime, n.mtimeNs))
	}
	if len(xattrs) > 0 {
		keys := make([]string, 0, len(xattrs))
		for k := range xattrs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			t.record(paxXattr+k, xattrs[k])
		}
	}
	if err := t.header("././@PaxHeader", 'x', 0o644, 0, 0, int64(t.pax.Len()), 0, ""); err != nil {
		return err
	}
	if _, err := t.w.Write(t.pax.Bytes()); err != nil {
		return err
	}
	if err := t.pad(int64(t.pax.Len())); err != nil {
		return err
	}
	uid, gid, mtime := int64(n.uid), int64(n.gid), n.mtime
	if uid > maxOctal7 {
		uid = 0
	}
	if gid > maxOctal7 {
		gid = 0
	}
	if mtime > maxOctal11 {
		mtime = 0
	}
	hsize := size
	if hsize > maxOctal11 {
		hsize = 0
	}
	return t.header(name, typ, int64(n.mode&0o7777), uid, gid, hsize, mtime, link)
}

// record appends one pax record, "LEN KEY=VALUE\n", LEN counting itself.
func (t *tarStream) record(k, v string) {
	body := len(k) + len(v) + 3 // " ", "=", "\n"
	n := body + len(strconv.Itoa(body))
	if len(strconv.Itoa(n)) != len(strconv.Itoa(body)) {
		n = body + len(strconv.Itoa(n))
	}
	t.pax.WriteString(strconv.Itoa(n))
	t.pax.WriteByte(' ')
	t.pax.WriteString(k)
	t.pax.WriteByte('=')
	t.pax.WriteString(v)
	t.pax.WriteByte('\n')
}

func (t *tarStream) header(name string, typ byte, mode, uid, gid, size, mtime int64, link string) error {
	h := &t.hdr
	*h = [512]byte{}
	copy(h[0:100], name) // the pax path is what counts; this is informative
	octal(h[100:108], mode)
	octal(h[108:116], uid)
	octal(h[116:124], gid)
	octal(h[124:136], size)
	octal(h[136:148], mtime)
	h[156] = typ
	copy(h[157:257], link)
	copy(h[257:265], "ustar\x0000")
	octal(h[329:337], 0)
	octal(h[337:345], 0)
	for i := 148; i < 156; i++ {
		h[i] = ' '
	}
	var sum int64
	for _, b := range h {
		sum += int64(b)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	_, err := t.w.Write(h[:])
	return err
}

// octal writes v as zero-padded octal digits and a NUL into f.
func octal(f []byte, v int64) {
	s := strconv.FormatInt(v, 8)
	for len(s) < len(f)-1 {
		s = "0" + s
	}
	copy(f, s)
	f[len(f)-1] = 0
}

func (t *tarStream) pad(n int64) error {
	if r := n % 512; r != 0 {
		var z [512]byte
		_, err := t.w.Write(z[:512-r])
		return err
	}
	return nil
}

// data copies a file's contents from the spool.
func (t *tarStream) data(n *node) error {
	if n.size == 0 {
		return nil
	}
	sr := io.NewSectionReader(t.spool, n.off, n.size)
	k, err := io.CopyBuffer(struct{ io.Writer }{t.w}, sr, t.buf)
	if err != nil {
		return err
	}
	if k != n.size {
		return fmt.Errorf("spool: %d of %d bytes: %w", k, n.size, io.ErrUnexpectedEOF)
	}
	return t.pad(n.size)
}

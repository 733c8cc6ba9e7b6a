package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// Overlayfs xattrs of an upper directory.
const (
	overlayOpaque   = "trusted.overlay.opaque"
	overlayRedirect = "trusted.overlay.redirect"
)

// CommitUpper makes the overlayfs upper directory upper (a sandbox's
// writable layer) the named layer name, replacing one of that name.
// Overlayfs whiteouts in it (0/0 character devices) become whiteouts of
// the layer and opaque directories (trusted.overlay.opaque=y) opaque
// directories of the layer, so that the layer stacked on the lower layers
// the upper directory was made on reproduces the overlay's view. A file
// whose name starts with ".wh." cannot be represented (the prefix marks
// whiteouts in layer tarballs): it is an Invalid error naming it. A
// directory renamed with redirect_dir (trusted.overlay.redirect) is
// refused as Unavailable; the container backend mounts with it off.
//
// The caller keeps the tree still while it is read (the daemon freezes
// the sandbox); changes racing the commit may or may not be in it.
//
// What the sandbox wrote is untrusted: unless opts.KeepSetuid, setuid and
// setgid bits and security.capability xattrs are stripped (a setuid-root
// file left in the layer would give euid 0 to every user of every sandbox
// made from it). The record says which, and how many files lost them.
func (s *Store) CommitUpper(ctx context.Context, name, upper string, opts CommitOptions) (NamedLayer, error) {
	return s.buildLayer(name, func(nl *NamedLayer) (LayerMeta, error) {
		m, stripped, err := s.importUpperStream(ctx, upper, opts)
		nl.SetuidKept, nl.SetuidStripped = opts.KeepSetuid, stripped
		return m, err
	})
}

// CommitOptions tune CommitUpper.
type CommitOptions struct {
	// KeepSetuid keeps the setuid/setgid bits and file capabilities of
	// the sandbox's files, for a sandbox whose writer is trusted (an
	// operator installing sudo, say).
	KeepSetuid bool
	// Omit leaves out the regular files at these paths (relative:
	// "etc/hosts") whose content is exactly the given bytes: files the
	// platform wrote into the writable layer (internal/etcfiles) that the
	// sandbox did not change.
	Omit map[string][]byte
	// IDs is the user-namespace mapping of the sandbox whose upper this
	// is (nil: none): its upper directory keeps host ids, Base+N for id N
	// inside, which the layer gets back as N (owners, ACL entries, the
	// root id of file capabilities). A host id outside the range, which
	// the sandbox saw as the overflow id, gets that id: 65534.
	IDs *IDShift
}

// IDShift is a user-namespace mapping: ids 0..Size-1 inside are Base..
// on the host.
type IDShift struct {
	Base, Size uint32
}

// inside is host id id as the sandbox sees it.
func (m *IDShift) inside(id uint32) uint32 {
	if id >= m.Base && id-m.Base < m.Size {
		return id - m.Base
	}
	return overflowID
}

const overflowID = 65534

// shift turns hdr's host ids into the sandbox's.
func (m *IDShift) shift(hdr *tar.Header) {
	hdr.Uid, hdr.Gid = int(m.inside(uint32(hdr.Uid))), int(m.inside(uint32(hdr.Gid)))
	hdr.Uname, hdr.Gname = "", ""
	for _, k := range []string{"SCHILY.xattr.system.posix_acl_access", "SCHILY.xattr.system.posix_acl_default"} {
		if v, ok := hdr.PAXRecords[k]; ok {
			setXattr(hdr, k, m.shiftACL(v))
		}
	}
	if v, ok := hdr.PAXRecords[capXattr]; ok {
		setXattr(hdr, capXattr, m.shiftCaps(v))
	}
}

// shiftACL shifts the ids of a POSIX ACL xattr (version 2: a 4-byte
// header, then 8-byte entries of tag, permissions and id), those of named
// users (tag 2) and groups (tag 8).
func (m *IDShift) shiftACL(v string) string {
	b := []byte(v)
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		return v
	}
	for off := 4; off < len(b); off += 8 {
		tag := binary.LittleEndian.Uint16(b[off:])
		if tag == 2 || tag == 8 {
			binary.LittleEndian.PutUint32(b[off+4:], m.inside(binary.LittleEndian.Uint32(b[off+4:])))
		}
	}
	return string(b)
}

// shiftCaps turns a file capability that names the sandbox's root as its
// root id (version 3, 24 bytes, which a root in a user namespace writes)
// into the version 2 form (20 bytes) that a layer's root means.
func (m *IDShift) shiftCaps(v string) string {
	b := []byte(v)
	const v3 = 0x03000000
	if len(b) != 24 || binary.LittleEndian.Uint32(b)&0xff000000 != v3 {
		return v
	}
	if binary.LittleEndian.Uint32(b[20:]) != m.Base {
		return v
	}
	out := b[:20]
	binary.LittleEndian.PutUint32(out, binary.LittleEndian.Uint32(b)&^0xff000000|0x02000000)
	return string(out)
}

func (s *Store) importUpperStream(ctx context.Context, upper string, opts CommitOptions) (LayerMeta, int64, error) {
	if err := checkSourceDir(upper, "commit source", errdefs.Internal); err != nil {
		return LayerMeta{}, 0, err
	}
	rootfd, err := inroot.OpenRoot(upper)
	if err != nil {
		return LayerMeta{}, 0, errdefs.Wrap(inroot.Category(err), err, "commit source")
	}
	defer unix.Close(rootfd)

	// tarx.Create -> whiteout translation, setuid stripping -> EROFS
	// conversion. Stripping here, not in the conversion, keeps the diffID
	// the hash of what the layer holds.
	treeR, created := treeStream(ctx, upper)
	layerR, layerW := io.Pipe()
	filtered := make(chan error, 1)
	var stripped int64
	go func() {
		var err error
		stripped, err = upperToLayer(rootfd, treeR, layerW, opts)
		treeR.CloseWithError(errPipelineStopped)
		layerW.CloseWithError(err)
		filtered <- err
	}()
	m, err := s.ImportLayer(ctx, layerR, LayerOptions{})
	layerR.CloseWithError(errPipelineStopped)
	ferr, cerr := <-filtered, <-created
	// The first failure in the pipeline is the cause; the later stages
	// only see a closed pipe.
	if cerr != nil && !errors.Is(cerr, errPipelineStopped) {
		return m, 0, fmt.Errorf("reading %s: %w", upper, cerr)
	}
	if ferr != nil && !errors.Is(ferr, errPipelineStopped) {
		return m, 0, ferr
	}
	return m, stripped, err
}

// upperToLayer copies the canonical tar stream of an upper directory from
// r to w, turning overlayfs whiteouts and opaque directories into OCI
// whiteout entries, unless opts.KeepSetuid dropping setuid/setgid bits
// and file capabilities, and leaving out opts.Omit's unchanged files; it
// returns how many entries lost privileges. rootfd is the upper
// directory, for reading the overlay xattrs that the tar stream leaves
// out.
func upperToLayer(rootfd int, r io.Reader, w io.Writer, opts CommitOptions) (int64, error) {
	keepSetuid := opts.KeepSetuid
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	var stripped int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return stripped, err
		}
		// tar.Reader fills in the deprecated Xattrs too, which Writer
		// writes back: what is dropped goes from both.
		for k := range hdr.PAXRecords {
			// Only meaningful to overlayfs mounted with userxattr: a
			// sandbox must not be able to forge whiteouts with them.
			if strings.HasPrefix(k, "SCHILY.xattr.user.overlay.") {
				dropXattr(hdr, k)
			}
		}
		if opts.IDs != nil {
			opts.IDs.shift(hdr)
		}
		if !keepSetuid && stripPrivileges(hdr) {
			stripped++
		}
		if hdr.Name == "./" {
			if err := tw.WriteHeader(hdr); err != nil {
				return stripped, err
			}
			continue
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		dir, base := path.Split(name)
		if strings.HasPrefix(base, whiteoutPrefix) {
			return stripped, errdefs.Invalidf("cannot commit /%s: names starting with %q mark whiteouts in layers", name, whiteoutPrefix)
		}
		switch {
		case hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0:
			wh := &tar.Header{Name: dir + whiteoutPrefix + base, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: hdr.ModTime, Format: tar.FormatPAX}
			if err := tw.WriteHeader(wh); err != nil {
				return stripped, err
			}
		case hdr.Typeflag == tar.TypeDir:
			opaque, redirect := overlayDirXattrs(rootfd, name)
			if redirect {
				return stripped, errdefs.Unavailablef("cannot commit /%s: it is a renamed directory (overlayfs redirect_dir); mount overlays with redirect_dir=off", name)
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return stripped, err
			}
			if opaque {
				op := &tar.Header{Name: name + "/" + whiteoutPrefix + whiteoutPrefix + ".opq", Typeflag: tar.TypeReg, Mode: 0o600, ModTime: hdr.ModTime, Format: tar.FormatPAX}
				if err := tw.WriteHeader(op); err != nil {
					return stripped, err
				}
			}
		default:
			var body io.Reader = tr
			if want, ok := opts.Omit[name]; ok && hdr.Typeflag == tar.TypeReg && hdr.Size == int64(len(want)) {
				got, err := io.ReadAll(tr)
				if err != nil {
					return stripped, err
				}
				if bytes.Equal(got, want) {
					continue
				}
				body = bytes.NewReader(got)
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return stripped, err
			}
			if _, err := io.Copy(tw, body); err != nil {
				return stripped, err
			}
		}
	}
	return stripped, tw.Close()
}

const whiteoutPrefix = ".wh."

// capXattr is the PAX record of a file capability (security.capability).
const capXattr = "SCHILY.xattr.security.capability"

// stripPrivileges clears what would raise the privileges of whoever execs
// the entry: setuid and setgid bits (kept on directories, where setgid only
// chooses new files' group) and file capabilities. It reports whether the
// entry had any.
func stripPrivileges(hdr *tar.Header) bool {
	had := false
	if hdr.Typeflag != tar.TypeDir && hdr.Mode&0o6000 != 0 {
		hdr.Mode &^= 0o6000
		had = true
	}
	if _, ok := hdr.PAXRecords[capXattr]; ok {
		dropXattr(hdr, capXattr)
		had = true
	}
	return had
}

// dropXattr removes the PAX record key (SCHILY.xattr.NAME) from hdr, and
// from the deprecated Xattrs that tar.Reader fills in and Writer writes.
// setXattr sets a PAX xattr record and its deprecated Xattrs twin, which
// tar.Writer would otherwise write back as it was.
func setXattr(hdr *tar.Header, key, v string) {
	hdr.PAXRecords[key] = v
	if hdr.Xattrs != nil {
		hdr.Xattrs[strings.TrimPrefix(key, "SCHILY.xattr.")] = v
	}
}

func dropXattr(hdr *tar.Header, key string) {
	delete(hdr.PAXRecords, key)
	delete(hdr.Xattrs, strings.TrimPrefix(key, "SCHILY.xattr."))
}

// errPipelineStopped closes a pipe of the commit pipeline whose reader
// stopped (because it failed).
var errPipelineStopped = errors.New("commit pipeline stopped")

// overlayDirXattrs reads whether the directory rel (inside the upper
// directory rootfd; symlinks never leave it) is opaque or redirected.
func overlayDirXattrs(rootfd int, rel string) (opaque, redirect bool) {
	fd, err := inroot.Open(rootfd, rel, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return false, false // gone meanwhile, or no longer a directory
	}
	defer unix.Close(fd)
	p := "/proc/self/fd/" + strconv.Itoa(fd)
	var buf [8]byte
	if n, err := unix.Getxattr(p, overlayOpaque, buf[:]); err == nil && n == 1 && buf[0] == 'y' {
		opaque = true
	}
	if _, err := unix.Getxattr(p, overlayRedirect, nil); err == nil {
		redirect = true
	}
	return opaque, redirect
}

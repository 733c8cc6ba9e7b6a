package untrusted

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx"
)

const (
	// DefaultMaxBytes bounds the regular-file content (apparent size) of
	// one extraction: 1 GiB.
	DefaultMaxBytes = 1 << 30
	// DefaultMaxEntries bounds the entries of one extraction.
	DefaultMaxEntries = 1_000_000
)

// Options control Extract and ExtractFile. The zero value is the safe
// default.
type Options struct {
	// MaxBytes bounds the total apparent size of regular files: 0 means
	// DefaultMaxBytes, a negative value no limit. Exceeding it is
	// Exhausted.
	MaxBytes int64
	// MaxEntries bounds the number of archive entries: 0 means
	// DefaultMaxEntries, a negative value no limit.
	MaxEntries int64
	// Preserve keeps the archive's permission bits (setuid, setgid and
	// sticky included) instead of masking them with 0o755.
	Preserve bool
	// SymlinksAsIs keeps every symlink with the target text the sandbox
	// wrote. By default a symlink whose target could lead outside the
	// destination (absolute, or climbing above it, or ".." after a name)
	// is refused (Invalid), so that opening files of the tree later stays
	// inside it. Either way no link is ever followed by an extraction.
	SymlinksAsIs bool
	// XattrAllow lists the extended-attribute name prefixes that are
	// applied (e.g. "user."); every other xattr and ACL is dropped.
	XattrAllow []string
}

func (o Options) limits() (maxBytes, maxEntries int64) {
	maxBytes, maxEntries = o.MaxBytes, o.MaxEntries
	if maxBytes == 0 {
		maxBytes = DefaultMaxBytes
	}
	if maxEntries == 0 {
		maxEntries = DefaultMaxEntries
	}
	return maxBytes, maxEntries
}

// Stats counts what an extraction did and what it refused to carry over.
type Stats struct {
	Entries   int64 // archive entries read
	Files     int64 // regular files written
	Dirs      int64
	Symlinks  int64
	Hardlinks int64
	Bytes     int64 // apparent size of the regular files written
	// Skipped counts device nodes and FIFOs, which are never created.
	Skipped int64
	// ModesMasked counts entries whose permission bits lost bits to the
	// 0o755 mask; SpecialBits those of them that had setuid, setgid or
	// sticky.
	ModesMasked int64
	SpecialBits int64
	// XattrsDropped counts extended attributes and ACLs not applied.
	XattrsDropped int64
}

// stream reads a plain or gzip-compressed tar stream and checks that it
// ends properly.
type stream struct {
	ctx  context.Context
	src  *tarx.SourceReader
	gz   *gzip.Reader
	tail *tarx.TailReader
	tr   *tar.Reader
}

func newStream(ctx context.Context, r io.Reader) (*stream, error) {
	s := &stream{ctx: ctx, src: &tarx.SourceReader{R: r}}
	br := bufio.NewReaderSize(s.src, 64<<10)
	var body io.Reader = br
	magic, _ := br.Peek(6)
	gzipped, err := tarx.IsGzip(magic)
	if err != nil {
		return nil, err
	}
	if gzipped {
		if s.gz, err = gzip.NewReader(br); err != nil {
			return nil, s.readErr(err, "reading gzip header")
		}
		body = s.gz
	}
	s.tail = &tarx.TailReader{R: body}
	s.tr = tar.NewReader(s.tail)
	return s, nil
}

// next returns the next header, or io.EOF after a well-formed end.
func (s *stream) next() (*tar.Header, error) {
	if err := ctxErr(s.ctx); err != nil {
		return nil, err
	}
	for {
		hdr, err := s.tr.Next()
		if err == io.EOF {
			return nil, s.end()
		}
		if err != nil {
			return nil, s.readErr(err, "reading archive")
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if strings.IndexByte(hdr.Name, 0) >= 0 || strings.IndexByte(hdr.Linkname, 0) >= 0 {
			return nil, errdefs.Invalidf("archive entry %q: NUL byte in name", hdr.Name)
		}
		return hdr, nil
	}
}

func (s *stream) end() error {
	if s.src.Err != nil {
		return s.readErr(s.src.Err, "reading archive")
	}
	if s.tail.N == 0 {
		return errdefs.Invalidf("empty archive")
	}
	if !s.tail.EndsWithZeros() {
		return errdefs.Invalidf("truncated archive: no end-of-archive marker")
	}
	if s.gz != nil {
		// Read the rest of the gzip member so that its checksum is
		// verified; tolerate bounded padding after the tar end.
		if _, err := io.Copy(io.Discard, io.LimitReader(s.gz, 16<<20)); err != nil {
			return s.readErr(err, "reading gzip trailer")
		}
	}
	return io.EOF
}

// readErr classifies an error from the archive reader: the caller's
// reader failing is passed through, anything else is a corrupt archive.
func (s *stream) readErr(err error, what string) error {
	if s.src.Err != nil {
		return fmt.Errorf("%s: %w", what, s.src.Err)
	}
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		return errdefs.New(errdefs.Invalid, "%s: truncated archive: %w", what, io.ErrUnexpectedEOF)
	}
	return errdefs.New(errdefs.Invalid, "%s: corrupt archive: %w", what, err)
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

// cleanName turns an archive name into a clean relative path ("" for the
// destination itself). Leading slashes are dropped, like tar does; a ".."
// component is refused rather than interpreted.
func cleanName(n string) (string, error) {
	s := strings.Trim(n, "/")
	if s == ".." || strings.HasPrefix(s, "../") || strings.HasSuffix(s, "/..") || strings.Contains(s, "/../") {
		return "", errdefs.Invalidf("archive entry %q: a \"..\" component would leave the destination", n)
	}
	// Whole-string searches, not a split: names of a 30,000-deep tree have
	// 30,000 components.
	dirty := s == "." || strings.HasPrefix(s, "./") || strings.HasSuffix(s, "/.") ||
		strings.Contains(s, "/./") || strings.Contains(s, "//")
	if !dirty {
		return s, nil
	}
	var b strings.Builder
	for rest := s; rest != ""; {
		var c string
		c, rest, _ = strings.Cut(rest, "/")
		if c == "" || c == "." {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(c)
	}
	return b.String(), nil
}

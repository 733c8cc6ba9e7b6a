package image

import (
	"context"
	"errors"
	"math/bits"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Residency is how much of a layer blob's content is in this node's page
// cache: with on-demand loading, what sandboxes have read of the layer.
//
// A block of the blob can be cached in two places: in the blob file's own
// page cache (EROFS metadata always; everything when the mount reads the
// blob through the page cache), and in the page cache of the mounted
// layer's files and directories (file contents; with a directio mount the
// only copy). Resident counts each block of the blob once, whichever cache
// holds it, by mapping cached file pages back to the blob with FIEMAP.
type Residency struct {
	Size     int64 `json:"size"`     // blob bytes
	Resident int64 `json:"resident"` // blob bytes cached in either place, each once
	Blob     int64 `json:"blob"`     // in the blob file's page cache (mincore)
	Files    int64 `json:"files"`    // in the page cache of the mounted layer's files and directories
	Mounted  bool  `json:"mounted"`
}

// Residency measures one layer blob. When the layer is mounted on this
// node, it walks the mounted tree (one open per file, no data read); the
// metadata blocks of the blob the walk itself brought into the page cache
// are dropped again, so that a measurement does not count its own reads.
// Blocks a sandbox reads during the walk may be dropped too (they are
// read again when needed, and not counted this time).
func (s *Store) Residency(ctx context.Context, digest string) (Residency, error) {
	var r Residency
	bp, err := s.BlobPath(digest)
	if err != nil {
		return r, err
	}
	f, err := os.Open(bp)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return r, errdefs.NotFoundf("layer %s not found", digest)
		}
		return r, errdefs.Wrap(errdefs.Internal, err, "residency "+digest)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return r, errdefs.Wrap(errdefs.Internal, err, "residency "+digest)
	}
	r.Size = fi.Size()
	if r.Size == 0 {
		return r, nil
	}
	s.residencyMu.Lock()
	defer s.residencyMu.Unlock()
	before, err := cachedPages(f, r.Size)
	if err != nil {
		return r, errdefs.Wrap(errdefs.Internal, err, "residency "+digest)
	}
	r.Blob = min(before.count()*pageSize, r.Size)
	union := before.clone()
	var unmapped int64
	if s.mounts != nil {
		pc, ok, werr := s.mounts.CachedExtents(ctx, digest[len("sha256:"):], union.setRange)
		if ok {
			// Also after a failed walk: drop what it read.
			after, err := cachedPages(f, r.Size)
			if err == nil {
				after.andNot(before)
				after.runs(func(off, n int64) {
					_ = unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED)
				})
			}
			if werr == nil && err != nil {
				werr = errdefs.Wrap(errdefs.Internal, err, "residency "+digest)
			}
			r.Mounted, r.Files, unmapped = true, pc.Bytes, pc.Unmapped
		}
		if werr != nil {
			return r, werr
		}
	}
	r.Resident = min(union.count()*pageSize+unmapped, r.Size)
	return r, nil
}

// pageSize is the unit of residency: the page cache's page (4 KiB on
// x86-64, the EROFS block size of the layers Warren writes).
var pageSize = int64(os.Getpagesize())

// pageSet is a set of page indices of a blob.
type pageSet struct {
	words []uint64
	pages int64
}

func newPageSet(size int64) pageSet {
	n := (size + pageSize - 1) / pageSize
	return pageSet{words: make([]uint64, (n+63)/64), pages: n}
}

func (p pageSet) clone() pageSet {
	return pageSet{words: append([]uint64(nil), p.words...), pages: p.pages}
}

func (p pageSet) set(i int64) {
	if i >= 0 && i < p.pages {
		p.words[i/64] |= 1 << (i % 64)
	}
}

// setRange adds the pages holding bytes [off, off+n).
func (p pageSet) setRange(off, n int64) {
	if n <= 0 {
		return
	}
	for i := off / pageSize; i <= (off+n-1)/pageSize && i < p.pages; i++ {
		p.set(i)
	}
}

func (p pageSet) count() int64 {
	var n int
	for _, w := range p.words {
		n += bits.OnesCount64(w)
	}
	return int64(n)
}

func (p pageSet) andNot(q pageSet) {
	for i := range p.words {
		if i < len(q.words) {
			p.words[i] &^= q.words[i]
		}
	}
}

// runs calls fn(off, n) for every run of consecutive pages, in bytes.
func (p pageSet) runs(fn func(off, n int64)) {
	start := int64(-1)
	for i := int64(0); i <= p.pages; i++ {
		in := i < p.pages && p.words[i/64]&(1<<(i%64)) != 0
		switch {
		case in && start < 0:
			start = i
		case !in && start >= 0:
			fn(start*pageSize, (i-start)*pageSize)
			start = -1
		}
	}
}

// cachedPages returns the pages of f (size bytes) in the page cache:
// mincore on a mapping, which reads nothing.
func cachedPages(f *os.File, size int64) (pageSet, error) {
	ps := newPageSet(size)
	const window = 1 << 30 // map at most 1 GiB at a time
	vec := make([]byte, min(window, size+pageSize-1)/pageSize)
	for off := int64(0); off < size; off += window {
		n := min(window, size-off)
		mem, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return ps, err
		}
		pages := (n + pageSize - 1) / pageSize
		_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
		_ = unix.Munmap(mem)
		if e != 0 {
			return ps, e
		}
		for i := int64(0); i < pages; i++ {
			if vec[i]&1 != 0 {
				ps.set(off/pageSize + i)
			}
		}
	}
	return ps, nil
}

package layermount

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// What a sandbox reads of a layer ends up in one of two page caches: the
// blob file's (EROFS metadata always; everything when EROFS reads the
// blob through the page cache) and that of the EROFS inodes of the mount
// (file and directory contents). With direct I/O only the second holds
// the data, so the blob's residency alone would miss it. CachedExtents
// walks the mounted tree and reports, for every cached page of a file or
// directory, where its content lies in the blob (FIEMAP), so that the
// caller can count each block of the blob once, whichever cache holds it.

// PageCache is what CachedExtents found in the page cache of a mount.
type PageCache struct {
	// Bytes of the layer's files and directories in the page cache.
	Bytes int64 `json:"bytes"`
	// Unmapped are cached bytes of files FIEMAP could not place in the
	// blob (none for the uncompressed layers Warren writes).
	Unmapped int64 `json:"unmapped"`
	// Files and Dirs walked.
	Files int64 `json:"files"`
	Dirs  int64 `json:"dirs"`
}

// CachedExtents walks the mount of key and calls mark(off, n) for each
// range of the blob whose content is in the page cache of a file or
// directory of the mount (ranges may repeat). ok is false when key is
// not mounted.
//
// The walk itself reads directories and inodes: the directory pages it
// brought into the cache are dropped again (posix_fadvise DONTNEED of the
// pages that were not cached before), those of the blob are the caller's
// to drop. The dentries and inodes it looked up stay in the kernel's
// caches, as after any `find`. Callers run one walk of a layer at a time:
// a concurrent walk's pages would look like a sandbox's.
func (c *Cache) CachedExtents(ctx context.Context, key string, mark func(off, n int64)) (pc PageCache, ok bool, err error) {
	c.mu.Lock()
	e := c.ents[key]
	c.mu.Unlock()
	if e == nil {
		return pc, false, nil
	}
	e.mu.Lock()
	if !e.mounted {
		e.mu.Unlock()
		return pc, false, nil
	}
	// Holding the root open keeps the superblock while we walk without
	// the lock: an unmount meanwhile detaches it (see unmount).
	fd, err := unix.Open(c.MountPoint(key), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	e.mu.Unlock()
	if err != nil {
		return pc, false, errdefs.New(errdefs.Internal, "layer %s: open mount: %w", key, err)
	}
	w := walker{ctx: ctx, mark: mark, pc: &pc}
	err = w.dir(fd)
	if err != nil {
		return pc, true, errdefs.New(errdefs.CategoryOf(err), "layer %s: page cache walk: %w", key, err)
	}
	return pc, true, nil
}

type walker struct {
	ctx   context.Context
	mark  func(off, n int64)
	pc    *PageCache
	buf   []byte // getdents
	vec   []byte // mincore
	steps int
}

// pageSize is the page cache's unit (mincore and cachestat count pages).
var pageSize = int64(os.Getpagesize())

// dir measures and walks the directory open at fd, and closes fd.
func (w *walker) dir(fd int) error {
	defer unix.Close(fd)
	w.pc.Dirs++
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	// Which of its pages are cached before we read it: those were read
	// by a sandbox (count them), the others we bring in (drop them).
	pages := (st.Size + pageSize - 1) / pageSize
	before := make([]bool, pages)
	var cached []int64
	for i := range pages {
		var cs unix.Cachestat_t
		if err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: uint64(i * pageSize), Len: uint64(pageSize)}, &cs, 0); err != nil {
			return err
		}
		if cs.Cache > 0 {
			before[i] = true
			cached = append(cached, i)
		}
	}
	if len(cached) > 0 {
		w.account(fd, cached)
	}

	var subdirs []string
	err := w.entries(fd, func(name string, typ byte) error {
		switch typ {
		case unix.DT_DIR:
			subdirs = append(subdirs, name)
		case unix.DT_REG:
			w.file(fd, name)
		}
		return nil
	})
	for _, name := range subdirs {
		if err != nil {
			break
		}
		sub, oerr := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if oerr != nil {
			continue // an immutable tree: nothing to do but skip
		}
		err = w.dir(sub)
	}
	// Lookups of the children are done: drop the pages we read.
	for i := range pages {
		if !before[i] {
			_ = unix.Fadvise(fd, i*pageSize, pageSize, unix.FADV_DONTNEED)
		}
	}
	return err
}

// entries calls fn for every entry of the directory at fd but . and ..
func (w *walker) entries(fd int, fn func(name string, typ byte) error) error {
	if w.buf == nil {
		w.buf = make([]byte, 64<<10)
	}
	for {
		n, err := unix.Getdents(fd, w.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		// struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, name.
		for b := w.buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return errors.New("malformed directory entry")
			}
			typ := b[18]
			name := b[19:reclen]
			for i, ch := range name {
				if ch == 0 {
					name = name[:i]
					break
				}
			}
			b = b[reclen:]
			if s := string(name); s != "." && s != ".." {
				if err := fn(s, typ); err != nil {
					return err
				}
			}
		}
		if w.steps++; w.steps%64 == 0 {
			if err := w.ctx.Err(); err != nil {
				return errdefs.Wrap(errdefs.DeadlineExceeded, err, "walk")
			}
		}
	}
}

// file measures the regular file name in the directory at dirfd. Opening
// it reads no data; errors skip the file.
func (w *walker) file(dirfd int, name string) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	w.pc.Files++
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{}, &cs, 0); err != nil || cs.Cache == 0 {
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size <= 0 {
		return
	}
	pages, err := w.residentPages(fd, st.Size)
	if err != nil {
		// Cannot tell which pages: count them, unplaced.
		w.pc.Bytes += int64(cs.Cache) * pageSize
		w.pc.Unmapped += int64(cs.Cache) * pageSize
		return
	}
	w.account(fd, pages)
}

// residentPages lists the cached pages of the file at fd (mincore on a
// mapping: it reads nothing).
func (w *walker) residentPages(fd int, size int64) ([]int64, error) {
	const window = 1 << 30
	var out []int64
	for off := int64(0); off < size; off += window {
		n := min(window, size-off)
		mem, err := unix.Mmap(fd, off, int(n), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return nil, err
		}
		np := int((n + pageSize - 1) / pageSize)
		if cap(w.vec) < np {
			w.vec = make([]byte, np)
		}
		vec := w.vec[:np]
		_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
		_ = unix.Munmap(mem)
		if e != 0 {
			return nil, e
		}
		for i, v := range vec {
			if v&1 != 0 {
				out = append(out, off/pageSize+int64(i))
			}
		}
	}
	return out, nil
}

// account adds the cached pages (indices, ascending) of the file or
// directory at fd and marks where they lie in the blob. Pages in holes
// were never read from the blob and mark nothing.
func (w *walker) account(fd int, pages []int64) {
	w.pc.Bytes += int64(len(pages)) * pageSize
	exts, err := fiemap(fd)
	if err != nil {
		w.pc.Unmapped += int64(len(pages)) * pageSize
		return
	}
	j := 0
	for _, p := range pages {
		lo, hi := p*pageSize, (p+1)*pageSize
		for j < len(exts) && exts[j].logical+exts[j].length <= lo {
			j++
		}
		for k := j; k < len(exts) && exts[k].logical < hi; k++ {
			x := exts[k]
			a, b := max(lo, x.logical), min(hi, x.logical+x.length)
			switch {
			case a >= b:
			case x.unplaced:
				w.pc.Unmapped += b - a
			default:
				w.mark(x.physical+(a-x.logical), b-a)
			}
		}
	}
}

type extent struct {
	logical, physical, length int64
	unplaced                  bool // no usable physical address
}

// FS_IOC_FIEMAP, _IOWR('f', 11, struct fiemap) (32 bytes), and the
// layout of struct fiemap_extent (56 bytes).
const (
	fsIocFiemap      = 0xC020660B
	fiemapHeader     = 32
	fiemapExtentSize = 56
	fiemapExtentLast = 0x1
	// FIEMAP_EXTENT_UNKNOWN (no location) and _ENCODED (compressed: the
	// physical range is not the logical one's size).
	fiemapExtentUnplaced = 0x2 | 0x8
	fiemapBatch          = 64
)

// fiemap returns the extents of the file at fd: where its bytes lie on
// the filesystem's device, which for a file-backed EROFS mount is the
// blob.
func fiemap(fd int) ([]extent, error) {
	var out []extent
	buf := make([]byte, fiemapHeader+fiemapBatch*fiemapExtentSize)
	start := uint64(0)
	for {
		clear(buf)
		ne := binary.NativeEndian
		ne.PutUint64(buf[0:], start)      // fm_start
		ne.PutUint64(buf[8:], ^uint64(0)) // fm_length
		ne.PutUint32(buf[16:], 0)         // fm_flags
		ne.PutUint32(buf[24:], fiemapBatch)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
			return nil, e
		}
		n := int(ne.Uint32(buf[20:])) // fm_mapped_extents
		if n == 0 {
			return out, nil
		}
		last := false
		for i := range n {
			x := buf[fiemapHeader+i*fiemapExtentSize:]
			flags := ne.Uint32(x[40:])
			ext := extent{logical: int64(ne.Uint64(x[0:])), physical: int64(ne.Uint64(x[8:])), length: int64(ne.Uint64(x[16:])),
				unplaced: flags&fiemapExtentUnplaced != 0}
			out = append(out, ext)
			start = uint64(ext.logical + ext.length)
			if flags&fiemapExtentLast != 0 {
				last = true
			}
		}
		if last || n < fiemapBatch {
			return out, nil
		}
	}
}

// Package layermount is a node's cache of read-only EROFS layer mounts.
//
// Every layer blob is mounted at most once per node, at <dir>/<key>, and
// shared by all the sandboxes that use it: Acquire counts a reference,
// the returned release drops it, and a mount nobody uses is unmounted
// after a grace period (so that a burst of creates and deletes does not
// mount and unmount the same layer over and over).
//
// The mount is file-backed (`mount -t erofs -o ro FILE DIR`, Linux 6.12
// and later). Where the kernel answers ENOTBLK (no file-backed mounts),
// the blob is attached to a read-only loop device with LOOP_CONFIGURE and
// LO_FLAGS_AUTOCLEAR, so that the device goes away with the mount.
//
// File-backed mounts get the "directio" option where the kernel knows it
// and the blob's filesystem does O_DIRECT: EROFS then reads the blob with
// direct I/O, so the blob's own page cache and readahead (sized by the
// store disk's read_ahead_kb, often megabytes) stay out of it and only
// the blocks EROFS asks for are read. EROFS's readahead of the layer's
// files is that of the mount's own backing_dev_info (/sys/class/bdi/
// erofs-N, 128 KiB by default), which Options.ReadAheadKB sets.
//
// After a daemon restart, New finds the mounts a previous process left
// under dir and adopts them with no references: the sandboxes that are
// adopted again take references to them; the rest are unmounted when the
// grace period ends, or at once by UnmountIdle.
//
// Overlayfs clones its lower layers' mounts, so unmounting a cache mount
// never breaks a sandbox that still runs on it; the cache keeps them only
// so that new sandboxes share the same superblock and page cache.
package layermount

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/mountinfo"
)

// DefaultGrace is how long an unused mount is kept.
const DefaultGrace = 60 * time.Second

// Options configure a Cache.
type Options struct {
	// Grace is how long an unused mount stays; 0 means DefaultGrace and a
	// negative value unmounts as soon as the last reference goes.
	Grace time.Duration
	// ForceLoop mounts through a loop device even where the kernel mounts
	// files directly (for tests of the fallback).
	ForceLoop bool
	// BufferedIO mounts file-backed layers without "directio": EROFS then
	// reads the blob through the blob's page cache (and its readahead).
	// For comparisons; direct I/O reads less.
	BufferedIO bool
	// ReadAheadKB, if > 0, is written to read_ahead_kb of each new mount's
	// backing_dev_info (file-backed) or loop device before it is used;
	// 0 leaves the kernel's default (128 KiB).
	ReadAheadKB int
	// Log receives the fallbacks (no direct I/O, no readahead knob);
	// nil means slog.Default().
	Log *slog.Logger
}

// Cache is a node's set of layer mounts. It is safe for concurrent use.
// One process must own a directory.
type Cache struct {
	dir   string
	grace time.Duration
	loop  bool
	opts  Options
	log   *slog.Logger

	// Set once the kernel refused the directio option (it predates it),
	// so that later mounts do not try again. Guarded by mu.
	noDirectIOOpt bool
	warned        map[string]bool // fallbacks logged at warn level once

	mu     sync.Mutex
	ents   map[string]*entry
	closed bool
}

type entry struct {
	key string

	// Guarded by Cache.mu.
	refs  int
	timer *time.Timer
	gen   uint64 // bumped by every Acquire and by timer changes

	// Guarded by mu: mount state changes.
	mu       sync.Mutex
	mounted  bool
	source   string // the blob file mounted ("" when unknown)
	dev      string // "/dev/loopN" or "" for a file-backed mount
	directIO bool   // mounted with the directio option
	since    time.Time
}

// Info describes a mount of the cache.
type Info struct {
	Key     string    `json:"key"`
	Dir     string    `json:"dir"`
	Source  string    `json:"source"`
	Device  string    `json:"device,omitempty"` // loop device, if any
	Refs    int       `json:"refs"`
	Mounted bool      `json:"mounted"`
	Since   time.Time `json:"since"`
	// DirectIO: EROFS reads the blob with direct I/O (file-backed mount
	// with the directio option).
	DirectIO bool `json:"direct_io"`
	// ReadAheadKB is the mount's readahead window (0: unknown).
	ReadAheadKB int `json:"read_ahead_kb,omitempty"`
}

// New opens the cache at dir (created 0700 if missing) and adopts the
// mounts found under it, unreferenced.
func New(dir string, opts Options) (*Cache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "layer mount cache")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "layer mount cache")
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	c := &Cache{dir: abs, grace: opts.Grace, loop: opts.ForceLoop, opts: opts, log: opts.Log, ents: map[string]*entry{}, warned: map[string]bool{}}
	if c.grace == 0 {
		c.grace = DefaultGrace
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if err := c.recover(); err != nil {
		return nil, err
	}
	return c, nil
}

// Dir returns the cache directory.
func (c *Cache) Dir() string { return c.dir }

// MountPoint returns where key is (or would be) mounted.
func (c *Cache) MountPoint(key string) string { return filepath.Join(c.dir, key) }

func validKey(key string) error {
	if key == "" || len(key) > 128 || strings.ContainsAny(key, "/\x00") || key == "." || key == ".." || strings.HasPrefix(key, ".") {
		return errdefs.Invalidf("invalid layer mount key %q", key)
	}
	return nil
}

// recover adopts the mounts under dir and removes stray directories.
func (c *Cache) recover() error {
	mounts, err := mountinfo.Under(c.dir)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "layer mount cache: reading mountinfo")
	}
	byKey := map[string][]mountinfo.Mount{}
	for _, m := range mounts {
		rel, err := filepath.Rel(c.dir, m.Point)
		if err != nil || rel == "." || strings.Contains(rel, "/") || validKey(rel) != nil || m.FSType != "erofs" {
			// Not ours: something mounted deeper, or of another type.
			_ = unix.Unmount(m.Point, unix.MNT_DETACH)
			continue
		}
		byKey[rel] = append(byKey[rel], m)
	}
	for key, ms := range byKey {
		if len(ms) > 1 {
			// Stacked mounts at one point: start afresh.
			for range ms {
				_ = unix.Unmount(c.MountPoint(key), unix.MNT_DETACH)
			}
			continue
		}
		if !slices.Contains(ms[0].MountOptions, "nosuid") || !slices.Contains(ms[0].MountOptions, "nodev") {
			// Mounted by an older daemon: the flags of this mount alone
			// change (sandboxes have their own clones).
			if err := unix.Mount("", ms[0].Point, "", unix.MS_REMOUNT|unix.MS_BIND|mountFlags, ""); err != nil {
				c.fallback("remount", "an adopted layer mount stays without nosuid", "mount", ms[0].Point, "err", err)
			}
		}
		e := &entry{key: key, mounted: true, since: time.Now(), directIO: slices.Contains(ms[0].Options, "directio")}
		e.source, e.dev = sourceOf(ms[0].Source)
		if c.opts.ReadAheadKB > 0 {
			// The bdi lives as long as the superblock: normally still
			// set, unless the setting changed across the restart.
			c.setReadAhead(e)
		}
		c.ents[key] = e
		if c.grace > 0 {
			c.armLocked(e)
		}
	}
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "layer mount cache")
	}
	for _, d := range ents {
		if _, ok := c.ents[d.Name()]; !ok {
			_ = os.Remove(filepath.Join(c.dir, d.Name())) // an empty mount point
		}
	}
	return nil
}

// sourceOf maps a mountinfo source to the backing file and loop device.
func sourceOf(src string) (file, dev string) {
	if strings.HasPrefix(src, "/dev/loop") {
		b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(src), "loop", "backing_file"))
		if err != nil {
			return "", src
		}
		return strings.TrimSpace(string(b)), src
	}
	return src, ""
}

// Acquire returns the mount point of the EROFS image in file source under
// key, mounting it if needed, and a release func (idempotent). Two
// Acquires of one key must name the same file.
func (c *Cache) Acquire(ctx context.Context, key, source string) (string, func(), error) {
	if err := validKey(key); err != nil {
		return "", nil, err
	}
	if err := ctx.Err(); err != nil {
		return "", nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return "", nil, errdefs.Unavailablef("layer mount cache is closed")
	}
	e := c.ents[key]
	if e == nil {
		e = &entry{key: key}
		c.ents[key] = e
	}
	e.refs++
	e.gen++
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	c.mu.Unlock()

	e.mu.Lock()
	err := c.ensureMounted(e, source)
	e.mu.Unlock()
	if err != nil {
		c.release(e)
		return "", nil, err
	}
	var once sync.Once
	return c.MountPoint(key), func() { once.Do(func() { c.release(e) }) }, nil
}

// ensureMounted mounts e if needed; e.mu is held.
func (c *Cache) ensureMounted(e *entry, source string) error {
	if e.mounted {
		if e.source == source || e.source == "" {
			return nil
		}
		if fi1, err1 := os.Stat(e.source); err1 == nil {
			if fi2, err2 := os.Stat(source); err2 == nil && os.SameFile(fi1, fi2) {
				return nil
			}
		}
		// Mounted from another file (an adopted mount of an older store):
		// replace it. Running sandboxes keep their own clones.
		if err := c.unmount(e); err != nil {
			return err
		}
	}
	mp := c.MountPoint(e.key)
	if err := os.Mkdir(mp, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return errdefs.Wrap(errdefs.Internal, err, "layer mount point")
	}
	dev, direct, err := c.mountErofs(source, mp)
	if err != nil {
		_ = os.Remove(mp)
		return err
	}
	e.mounted, e.source, e.dev, e.directIO, e.since = true, source, dev, direct, time.Now()
	if c.opts.ReadAheadKB > 0 {
		// Before anyone opens a file: a file's readahead window is
		// taken from the bdi when it is opened.
		c.setReadAhead(e)
	}
	return nil
}

// mountFlags are every layer mount's: read-only, and no set-uid programs
// or device nodes of a layer honoured through it. Sandboxes reach layers
// through their overlay, whose own mount flags are what exec checks (a
// base image's sudo keeps working); these guard the layers' mount points
// on the host.
const mountFlags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV

// mountErofs mounts the image in file at dir read-only, directly or
// through a loop device; it returns the loop device used, if any, and
// whether the mount reads the blob with direct I/O.
func (c *Cache) mountErofs(file, dir string) (string, bool, error) {
	const flags = mountFlags
	if !c.loop {
		direct := c.wantDirectIO(file)
		data := ""
		if direct {
			data = "directio"
		}
		err := unix.Mount(file, dir, "erofs", flags, data)
		if err == unix.EINVAL && direct {
			// Kernels before the option (Linux 6.13) reject it; a
			// corrupt image fails the retry too. (6.12 read every
			// file-backed mount with direct I/O where it could.)
			if err = unix.Mount(file, dir, "erofs", flags, ""); err == nil {
				c.mu.Lock()
				c.noDirectIOOpt = true
				c.mu.Unlock()
				c.fallback("kernel", "layer mounts read their blobs through the page cache: this kernel has no EROFS directio option", "file", file)
				direct = false
			}
		}
		if err == nil {
			return "", direct, nil
		}
		if err != unix.ENOTBLK {
			return "", false, mountErr(file, err)
		}
	}
	dev, err := mountLoop(file, dir)
	return dev, false, err
}

// wantDirectIO reports whether a file-backed mount of file should get
// the directio option. EROFS itself falls back to buffered reads,
// silently, when the blob's file cannot do O_DIRECT; the mount then
// would claim directio in mountinfo without it, so test the file first.
func (c *Cache) wantDirectIO(file string) bool {
	c.mu.Lock()
	no := c.opts.BufferedIO || c.noDirectIOOpt
	c.mu.Unlock()
	if no {
		return false
	}
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.EINVAL {
			c.fallback("odirect:"+filepath.Dir(file), "layer mounted without directio: the store's filesystem does not do O_DIRECT, so the blob is read through its page cache and readahead", "file", file)
		}
		// Other errors (a missing file) surface in the mount.
		return false
	}
	unix.Close(fd)
	return true
}

// fallback logs a degraded mount at warn level the first time (per kind)
// and at debug level afterwards.
func (c *Cache) fallback(kind, msg string, args ...any) {
	c.mu.Lock()
	first := !c.warned[kind]
	c.warned[kind] = true
	c.mu.Unlock()
	if first {
		c.log.Warn(msg, args...)
	} else {
		c.log.Debug(msg, args...)
	}
}

// mountLoop mounts the image in file at dir through a read-only loop
// device and returns the device.
func mountLoop(file, dir string) (string, error) {
	const flags = mountFlags
	f, err := os.Open(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", errdefs.NotFoundf("layer blob %s is missing", file)
		}
		return "", errdefs.Wrap(errdefs.Internal, err, "open layer blob")
	}
	defer f.Close()
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		dev, lf, err := attachLoop(f)
		if err != nil {
			lastErr = err
			if err == unix.EBUSY {
				continue // another process took that device first
			}
			return "", errdefs.Wrap(errdefs.Unavailable, err, "attach layer blob to a loop device")
		}
		err = unix.Mount(dev, dir, "erofs", flags, "")
		// With AUTOCLEAR the device detaches when its last user goes:
		// the mount, or this descriptor if the mount failed.
		lf.Close()
		if err != nil {
			return "", mountErr(file, err)
		}
		return dev, nil
	}
	return "", errdefs.Wrap(errdefs.Unavailable, lastErr, "attach layer blob to a loop device")
}

func attachLoop(backing *os.File) (string, *os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", nil, err
	}
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	ctl.Close()
	if err != nil {
		return "", nil, err
	}
	dev := "/dev/loop" + strconv.Itoa(n)
	lf, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return "", nil, err
	}
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_READ_ONLY | unix.LO_FLAGS_AUTOCLEAR
	copy(cfg.Info.File_name[:], backing.Name())
	if err := unix.IoctlLoopConfigure(int(lf.Fd()), &cfg); err != nil {
		lf.Close()
		return "", nil, err
	}
	return dev, lf, nil
}

func mountErr(file string, err error) error {
	switch err {
	case unix.ENOENT:
		return errdefs.NotFoundf("layer blob %s is missing", file)
	case unix.EINVAL, unix.EUCLEAN:
		return errdefs.New(errdefs.Internal, "layer blob %s is not a valid EROFS image (corrupt?): %w", file, err)
	case unix.ENODEV:
		return errdefs.New(errdefs.Unavailable, "the kernel has no EROFS support (modprobe erofs): %w", err)
	case unix.EPERM:
		return errdefs.New(errdefs.Unavailable, "mounting layers needs CAP_SYS_ADMIN: %w", err)
	}
	return errdefs.New(errdefs.Internal, "mount layer blob %s: %w", file, err)
}

// unmount unmounts e; e.mu is held.
func (c *Cache) unmount(e *entry) error {
	if !e.mounted {
		return nil
	}
	mp := c.MountPoint(e.key)
	err := unix.Unmount(mp, 0)
	if err == unix.EBUSY {
		// A process has a file of the layer open (a host-side reader):
		// detach; the superblock goes when it closes.
		err = unix.Unmount(mp, unix.MNT_DETACH)
	}
	if err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return errdefs.New(errdefs.Internal, "unmount layer %s: %w", e.key, err)
	}
	e.mounted, e.source, e.dev, e.directIO = false, "", "", false
	_ = os.Remove(mp)
	return nil
}

func (c *Cache) release(e *entry) {
	c.mu.Lock()
	e.refs--
	if e.refs > 0 {
		c.mu.Unlock()
		return
	}
	if c.grace < 0 || c.closed {
		e.gen++
		gen := e.gen
		c.mu.Unlock()
		c.expire(e, gen)
		return
	}
	c.armLocked(e)
	c.mu.Unlock()
}

// armLocked starts e's grace timer; c.mu is held.
func (c *Cache) armLocked(e *entry) {
	e.gen++
	gen := e.gen
	if e.timer != nil {
		e.timer.Stop()
	}
	if c.grace < 0 {
		e.timer = time.AfterFunc(0, func() { c.expire(e, gen) })
		return
	}
	e.timer = time.AfterFunc(c.grace, func() { c.expire(e, gen) })
}

// expire unmounts e if nobody took it since generation gen.
func (c *Cache) expire(e *entry, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c.mu.Lock()
	if e.refs > 0 || e.gen != gen {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	// Acquire increments refs before taking e.mu, and we hold e.mu: a
	// concurrent Acquire waits for us and mounts again.
	_ = c.unmount(e)
	c.mu.Lock()
	if e.refs == 0 && !e.mounted && c.ents[e.key] == e {
		delete(c.ents, e.key)
	}
	c.mu.Unlock()
}

// UnmountIdle unmounts every mount without references now (after a
// restart, once the adopted sandboxes hold theirs again).
func (c *Cache) UnmountIdle() error {
	return c.unmountIdle(func(string) bool { return true })
}

// Forget unmounts key now if it has no references (its blob is being
// deleted); it reports Conflict if it is in use.
func (c *Cache) Forget(key string) error {
	c.mu.Lock()
	e := c.ents[key]
	busy := e != nil && e.refs > 0
	c.mu.Unlock()
	if busy {
		return errdefs.Conflictf("layer %s is in use", key)
	}
	return c.unmountIdle(func(k string) bool { return k == key })
}

func (c *Cache) unmountIdle(match func(string) bool) error {
	c.mu.Lock()
	var idle []*entry
	var gens []uint64
	for k, e := range c.ents {
		if e.refs == 0 && match(k) {
			if e.timer != nil {
				e.timer.Stop()
				e.timer = nil
			}
			e.gen++
			idle = append(idle, e)
			gens = append(gens, e.gen)
		}
	}
	c.mu.Unlock()
	var errs []error
	for i, e := range idle {
		c.expire(e, gens[i])
		e.mu.Lock()
		if e.mounted {
			c.mu.Lock()
			if e.refs == 0 {
				errs = append(errs, errdefs.Internalf("layer %s is still mounted", e.key))
			}
			c.mu.Unlock()
		}
		e.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Refs returns the reference count of key (0 if unknown).
func (c *Cache) Refs(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.ents[key]; e != nil {
		return e.refs
	}
	return 0
}

// List describes the cache's mounts, sorted by key.
func (c *Cache) List() []Info {
	c.mu.Lock()
	ents := make([]*entry, 0, len(c.ents))
	refs := map[*entry]int{}
	for _, e := range c.ents {
		ents = append(ents, e)
		refs[e] = e.refs
	}
	c.mu.Unlock()
	out := make([]Info, 0, len(ents))
	for _, e := range ents {
		e.mu.Lock()
		out = append(out, Info{Key: e.key, Dir: c.MountPoint(e.key), Source: e.source, Device: e.dev, Refs: refs[e], Mounted: e.mounted, Since: e.since,
			DirectIO: e.directIO, ReadAheadKB: c.readAheadKB(e)})
		e.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Close stops the grace timers and unmounts the unused mounts; mounts
// still referenced stay for the next process to adopt. Acquire fails
// afterwards; releases still work.
func (c *Cache) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.UnmountIdle()
}

// UnmountAll unmounts every mount of the cache, referenced or not (for
// tests and for `warren` teardown: running overlays keep their clones).
func (c *Cache) UnmountAll() error {
	c.mu.Lock()
	ents := make([]*entry, 0, len(c.ents))
	for _, e := range c.ents {
		if e.timer != nil {
			e.timer.Stop()
			e.timer = nil
		}
		e.gen++
		ents = append(ents, e)
	}
	c.mu.Unlock()
	var errs []error
	for _, e := range ents {
		e.mu.Lock()
		if err := c.unmount(e); err != nil {
			errs = append(errs, err)
		}
		e.mu.Unlock()
	}
	return errors.Join(errs...)
}

// String describes the cache for logs.
func (c *Cache) String() string {
	return fmt.Sprintf("layermount.Cache(%s)", c.dir)
}

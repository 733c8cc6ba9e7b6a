package sandboxfs

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// EventOp is what happened to an entry of a watched directory.
type EventOp uint8

const (
	EventCreate EventOp = iota + 1 // created, or moved in
	EventWrite                     // content changed
	EventRemove                    // removed
	EventRename                    // moved away
	EventChmod                     // metadata changed
)

// Event is one change below a watched directory.
type Event struct {
	Path  string // relative to the watched directory
	Op    EventOp
	IsDir bool
}

// DirWatch follows the changes of a directory (WatchDir).
type DirWatch interface {
	// Next blocks until there are events and returns them. io.EOF: the
	// watched directory is gone (removed, or its filesystem unmounted).
	// After Close it returns an error matching os.ErrClosed.
	Next() ([]Event, error)
	// Close releases the watch (the inotify instance); it unblocks Next
	// and may be called from any goroutine, more than once.
	Close() error
}

// watchMask is what a watched directory reports: entries created, moved
// in or out, changed, removed, and the directory's own end.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_MODIFY |
	unix.IN_ATTRIB | unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_ONLYDIR

// inotifyBuf holds many events per read (each is 16 bytes and its name).
const inotifyBuf = 64 << 10

// WatchDir watches the directory at p (a final symlink followed inside
// the root) with inotify from the host: what the sandbox's processes do
// to it through their mounts is seen, as the kernel reports it for the
// inode. With recursive every directory below it is watched too, those
// that appear later included (their entries found on arrival are
// reported as created, so a tree made faster than the watch is added
// is not missed); symlinks are never descended. At most maxDirs
// directories are watched: more is Exhausted, at start or later (Next).
//
// The root is resolved for each directory added and no descriptor of the
// sandbox's files is held, so a watch never keeps the sandbox's mounts
// busy; the kernel drops the inotify marks when the filesystem goes.
func (f *FS) WatchDir(ctx context.Context, p string, recursive bool, maxDirs int) (DirWatch, error) {
	cp := inroot.Clean(p)
	rootfd, err := f.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootfd)
	dfd, err := openDirChecked(rootfd, cp)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	ifd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		if err == unix.EMFILE || err == unix.ENFILE || err == unix.ENOMEM {
			return nil, errdefs.Wrap(errdefs.Exhausted, err, "watch "+cp+": no inotify instance left on the node (fs.inotify.max_user_instances)")
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "inotify")
	}
	// Non-blocking: os.File parks Read in the runtime's poller, and
	// Close from another goroutine wakes it.
	w := &watch{
		f: f, dir: cp, recursive: recursive, maxDirs: maxDirs,
		file:   os.NewFile(uintptr(ifd), "inotify"),
		wds:    map[int32]string{},
		byPath: map[string]int32{},
		buf:    make([]byte, inotifyBuf),
	}
	if maxDirs < 1 {
		w.maxDirs = 1
	}
	if err := w.addTree(dfd, "", false); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

type watch struct {
	f         *FS
	dir       string // the watched directory, cleaned sandbox path
	recursive bool
	maxDirs   int
	file      *os.File // the inotify instance
	closeOnce sync.Once

	// Touched by Next only (one goroutine).
	wds     map[int32]string // watch descriptor -> directory relative to dir ("" for dir)
	byPath  map[string]int32
	buf     []byte
	pending []Event // found by a scan, sent with the batch
}

func (w *watch) Close() error {
	var err error
	w.closeOnce.Do(func() { err = w.file.Close() })
	return err
}

// addWatch adds an inotify watch on the directory behind the O_PATH
// descriptor fd, known as rel. It returns false when that directory was
// watched already (the same inode: a bind mount of it in the tree).
func (w *watch) addWatch(fd int, rel string) (bool, error) {
	if len(w.wds) >= w.maxDirs {
		return false, errdefs.Exhaustedf("watch %s: more than %d directories to watch", w.dir, w.maxDirs)
	}
	rc, err := w.file.SyscallConn()
	if err != nil {
		return false, err
	}
	var wd int
	var aerr error
	// Control holds the file open: its descriptor cannot be closed and
	// reused while the watch is added.
	if err := rc.Control(func(ifd uintptr) {
		wd, aerr = unix.InotifyAddWatch(int(ifd), "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	}); err != nil {
		return false, err
	}
	if aerr != nil {
		if aerr == unix.ENOSPC || aerr == unix.ENOMEM {
			return false, errdefs.Wrap(errdefs.Exhausted, aerr, "watch "+path.Join(w.dir, rel)+": no inotify watch left on the node (fs.inotify.max_user_watches)")
		}
		return false, pathErr(path.Join(w.dir, rel), aerr)
	}
	if _, ok := w.wds[int32(wd)]; ok {
		return false, nil
	}
	w.wds[int32(wd)] = rel
	w.byPath[rel] = int32(wd)
	return true, nil
}

// addTree watches the directory fd (known as rel) and, when recursive,
// every directory below it, breadth first. With report, every entry
// found below it is queued as created: they appeared before the watch.
func (w *watch) addTree(fd int, rel string, report bool) error {
	added, err := w.addWatch(fd, rel)
	if err != nil || !added || !w.recursive {
		return err
	}
	type dir struct {
		fd  int
		rel string
		own bool // opened here (the first is the caller's)
	}
	queue := []dir{{fd, rel, false}}
	defer func() {
		for _, d := range queue {
			if d.own {
				unix.Close(d.fd)
			}
		}
	}()
	for len(queue) > 0 {
		d := queue[0]
		if err := w.scan(d.fd, d.rel, report, func(cfd int, crel string) { queue = append(queue, dir{cfd, crel, true}) }); err != nil {
			return err
		}
		if d.own {
			unix.Close(d.fd)
		}
		queue = queue[1:]
	}
	return nil
}

// scan looks at the entries of directory fd (known as rel): each is
// queued as created with report, and each subdirectory watched and
// handed to next (its descriptor is then next's to close).
func (w *watch) scan(fd int, rel string, report bool, next func(fd int, rel string)) error {
	names, err := inroot.ReadDirNames(fd)
	if err != nil {
		return nil // gone meanwhile
	}
	for _, name := range names {
		var st unix.Stat_t
		if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue // gone meanwhile
		}
		crel := joinRel(rel, name)
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if report {
			w.pending = append(w.pending, Event{Path: crel, Op: EventCreate, IsDir: isDir})
		}
		if !isDir {
			continue
		}
		cfd, err := openSub(fd, name)
		if err != nil {
			continue // gone, replaced, or on a pseudo-filesystem
		}
		added, err := w.addWatch(cfd, crel)
		if err != nil || !added {
			unix.Close(cfd)
			if err != nil {
				return err
			}
			continue
		}
		next(cfd, crel)
	}
	return nil
}

// openSub opens the subdirectory name of dirfd (O_PATH), never through a
// symlink, and not on a kernel pseudo-filesystem.
func openSub(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if n, err := pseudoOf(fd); err != nil || n != "" {
		unix.Close(fd)
		return -1, errors.New("pseudo-filesystem")
	}
	return fd, nil
}

func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// addNew watches directory rel, which just appeared below a watched one,
// resolving its parent inside the root and the directory itself without
// following a symlink.
func (w *watch) addNew(rel string) error {
	rootfd, err := w.f.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	parent, name := path.Split(rel)
	pfd, err := inroot.Open(rootfd, path.Join(w.dir, parent), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil // gone meanwhile
	}
	defer unix.Close(pfd)
	fd, err := openSub(pfd, name)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	return w.addTree(fd, rel, true)
}

// forget drops the watches of directory rel and of those below it (moved
// away: their events would carry stale paths).
func (w *watch) forget(rel string) {
	rc, err := w.file.SyscallConn()
	if err != nil {
		return
	}
	for p, wd := range w.byPath {
		if p != rel && !strings.HasPrefix(p, rel+"/") {
			continue
		}
		delete(w.byPath, p)
		delete(w.wds, wd)
		_ = rc.Control(func(ifd uintptr) { _, _ = unix.InotifyRmWatch(int(ifd), uint32(wd)) })
	}
}

func (w *watch) Next() ([]Event, error) {
	for {
		if len(w.pending) > 0 {
			evs := w.pending
			w.pending = nil
			return evs, nil
		}
		n, err := w.file.Read(w.buf)
		if err != nil {
			return nil, err
		}
		evs, err := w.parse(w.buf[:n])
		if err != nil {
			return evs, err
		}
		if len(evs) > 0 || len(w.pending) > 0 {
			evs = append(evs, w.pending...)
			w.pending = nil
			return evs, nil
		}
	}
}

// parse turns a read of the inotify instance into events, adding and
// dropping watches as directories come and go.
func (w *watch) parse(b []byte) ([]Event, error) {
	var evs []Event
	for len(b) >= unix.SizeofInotifyEvent {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(raw.Len)
		if end > len(b) {
			break
		}
		name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:end]), "\x00")
		mask, wd := raw.Mask, raw.Wd
		b = b[end:]
		if mask&unix.IN_Q_OVERFLOW != 0 {
			return evs, errdefs.Exhaustedf("watch %s: events came faster than they were read, and the kernel dropped some (fs.inotify.max_queued_events)", w.dir)
		}
		dir, ok := w.wds[wd]
		if !ok {
			continue // a watch dropped already
		}
		if mask&unix.IN_IGNORED != 0 {
			delete(w.wds, wd)
			if w.byPath[dir] == wd {
				delete(w.byPath, dir)
			}
			if dir == "" {
				return evs, io.EOF
			}
			continue
		}
		if name == "" {
			continue // the directory's own events: its parent reports them
		}
		rel := joinRel(dir, name)
		isDir := mask&unix.IN_ISDIR != 0
		add := func(op EventOp) { evs = append(evs, Event{Path: rel, Op: op, IsDir: isDir}) }
		switch {
		case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
			add(EventCreate)
			if isDir && w.recursive {
				if err := w.addNew(rel); err != nil {
					return evs, err
				}
			}
		case mask&unix.IN_MOVED_FROM != 0:
			add(EventRename)
			if isDir {
				w.forget(rel)
			}
		case mask&unix.IN_DELETE != 0:
			add(EventRemove)
		case mask&unix.IN_MODIFY != 0:
			add(EventWrite)
		case mask&unix.IN_ATTRIB != 0:
			add(EventChmod)
		}
	}
	return evs, nil
}

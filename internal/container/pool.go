package container

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/etcfiles"
)

// dirPool keeps state directories made ahead of creates:
// <state>/pool/<n>, each holding an empty upper/ (with upper/etc and
// the empty files writeEtc fills) and work/, made by one goroutine in the
// background and taken by a create with one rename. On this CI's ext4
// (no journal, discard) making them in the create cost a p50 of 180 µs
// (78 for the three directories, ~100 for etc and its three files, p90
// 600), 4% of a create; the rename and three writes into empty files cost
// ~50. A sandbox with a disk limit gets its directories on its own new
// filesystem, where the pool cannot reach, and makes them in place.
//
// An entry is built under a temporary name and renamed to a number only
// when complete, so what a crash leaves is either a whole entry (kept by
// the next daemon) or a temporary one (removed). Entries are the node's
// cache, like mounted layers: they outlive a daemon stop.
//
// One pool owns a directory at a time (a flock on it, held until close):
// a second backend on the same state directory, as the tests' adoption
// makes, gets no pool. Two used to share one: the second's start removed
// the first's half-built entry while the first still filled it, through
// the rename, so the first handed out an entry without its upper/.
type dirPool struct {
	dir  string
	size int
	lock *os.File

	mu    sync.Mutex
	ready []string // complete entries, full paths
	seq   uint64
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

// poolSize covers a burst of creates while the filler catches up (it
// makes an entry in ~0.2-0.6 ms here).
const poolSize = 64

// newDirPool returns nil, and no error, when another pool owns dir.
func newDirPool(dir string, size int) (*dirPool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	lock, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, err
	}
	p := &dirPool{dir: dir, size: size, lock: lock, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	ents, err := os.ReadDir(dir)
	if err != nil {
		lock.Close()
		return nil, err
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		n, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil || !poolEntryOK(path) {
			_ = removeTree(path)
			continue
		}
		p.ready = append(p.ready, path)
		p.seq = max(p.seq, n+1)
	}
	livePools.Store(p, struct{}{})
	go p.fill()
	p.wake()
	return p, nil
}

// livePools are the pools whose filler runs: tests stop those of
// backends they never closed before their directories go.
var livePools sync.Map

// poolEntryOK: what an entry holds and nothing else, all empty.
func poolEntryOK(path string) bool {
	for _, name := range etcfiles.Names {
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(path, "upper", "etc", name), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 0 {
			return false
		}
	}
	for _, d := range []string{"upper", "upper/etc", "work"} {
		ents, err := os.ReadDir(filepath.Join(path, d))
		want := map[string]int{"upper": 1, "upper/etc": len(etcfiles.Names), "work": 0}[d]
		if err != nil || len(ents) != want {
			return false
		}
	}
	return true
}

// take returns a complete entry for the caller to rename, or "" when the
// pool is empty.
func (p *dirPool) take() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready) == 0 {
		p.wake()
		return ""
	}
	e := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	p.wake()
	return e
}

func (p *dirPool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *dirPool) fill() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		for {
			p.mu.Lock()
			full := len(p.ready) >= p.size
			n := p.seq
			if !full {
				p.seq++
			}
			p.mu.Unlock()
			if full {
				break
			}
			path, err := p.make(n)
			if err != nil {
				break // the disk is full or gone: creates make their own
			}
			p.mu.Lock()
			p.ready = append(p.ready, path)
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			default:
			}
		}
	}
}

// make builds entry n under a temporary name and renames it into place.
func (p *dirPool) make(n uint64) (string, error) {
	name := strconv.FormatUint(n, 10)
	tmp := filepath.Join(p.dir, "tmp-"+name)
	err := func() error {
		for _, d := range []string{tmp, tmp + "/upper", tmp + "/upper/etc", tmp + "/work"} {
			if err := unix.Mkdir(d, 0o755); err != nil {
				return err
			}
		}
		for _, f := range etcfiles.Names {
			fd, err := unix.Open(tmp+"/upper/etc/"+f, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			unix.Close(fd)
		}
		return unix.Rename(tmp, filepath.Join(p.dir, name))
	}()
	if err != nil {
		_ = removeTree(tmp)
		return "", err
	}
	return filepath.Join(p.dir, name), nil
}

// close stops the filler; what it made stays for the next daemon.
func (p *dirPool) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.lock.Close()
	livePools.Delete(p)
}

// claim moves a pool entry to dst (a sandbox's state directory, missing
// or empty). false: the pool was empty or the rename failed (the entry
// is then dropped), and the caller makes the directories itself.
func (p *dirPool) claim(dst string) bool {
	if p == nil {
		return false
	}
	e := p.take()
	if e == "" {
		return false
	}
	if err := unix.Rename(e, dst); err != nil {
		if !errors.Is(err, unix.ENOENT) {
			_ = removeTree(e)
		}
		if errors.Is(err, unix.EXDEV) {
			// The sandboxes' directory is another filesystem (a mount
			// of its own): no entry can ever move there.
			p.mu.Lock()
			p.size = 0
			for _, r := range p.ready {
				_ = removeTree(r)
			}
			p.ready = nil
			p.mu.Unlock()
		}
		return false
	}
	return true
}

package container

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// A deleted sandbox's state directory (its writable layer) is renamed into
// <state>/trash, which is quick, and removed there by one background
// goroutine. Removing it is the slow part of a delete: every directory
// and file frees disk blocks, which a filesystem mounted with `discard`
// and no journal (these CI machines' root) trims synchronously, and a
// sandbox that installed packages leaves tens of thousands of files. The
// reaper also closes the sandbox's pinned root first, so the sync that
// the overlay's unmount does happens here too (pinRoot). The id is free
// again as soon as the rename is done. A daemon that stops or crashes
// leaves the rest in the trash, and the next one empties it.
type reaper struct {
	dir  string
	work chan job
	seq  atomic.Uint64
	// failures counts directories the reaper could not remove.
	failures atomic.Uint64

	mu      sync.Mutex
	pending int
	idle    *sync.Cond
	stop    chan struct{}
	done    chan struct{}
}

// job is a directory to remove, after closing root (if >= 0): the pinned
// root overlay of the sandbox whose writable layer it was (pinRoot).
type job struct {
	path string
	root int
}

// reaperQueue bounds the backlog; a delete that finds it full removes its
// own directory, so a burst of deletes cannot outrun the disk unchecked.
const reaperQueue = 1024

func newReaper(dir string) (*reaper, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	r := &reaper{dir: dir, work: make(chan job, reaperQueue), stop: make(chan struct{}), done: make(chan struct{})}
	r.idle = sync.NewCond(&r.mu)
	// What an earlier daemon left, however much: fed as the queue drains.
	ents, _ := os.ReadDir(dir)
	r.pending = len(ents)
	go func() {
		for i, e := range ents {
			select {
			case r.work <- job{path: filepath.Join(dir, e.Name()), root: -1}:
			case <-r.stop:
				r.mu.Lock()
				r.pending -= len(ents) - i
				r.mu.Unlock()
				return
			}
		}
	}()
	go r.loop()
	return r, nil
}

// discard moves dir out of the way and queues it for removal, after
// closing root if that is >= 0. It returns an error only if dir could be
// neither moved nor removed.
func (r *reaper) discard(dir string, root int) error {
	to := filepath.Join(r.dir, filepath.Base(dir)+"."+strconv.FormatUint(r.seq.Add(1), 36))
	switch err := unix.Rename(dir, to); err {
	case nil:
	case unix.ENOENT:
		to = ""
	default:
		// Another filesystem (EXDEV), say: remove it here.
		r.do(job{root: root})
		return removeTree(dir)
	}
	if to == "" && root < 0 {
		return nil
	}
	j := job{path: to, root: root}
	if !r.enqueue(j) {
		return r.do(j)
	}
	return nil
}

// do closes the job's root, then removes its directory.
func (r *reaper) do(j job) error {
	if j.root >= 0 {
		unix.Close(j.root)
	}
	if j.path == "" {
		return nil
	}
	// A daemon that stops does not wait for the rest of a huge tree:
	// the next one empties the trash.
	return removeKnownUntil(r.stop, j.path, stateEntries...)
}

func (r *reaper) enqueue(j job) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case r.work <- j:
		r.pending++
		return true
	default:
		return false
	}
}

func (r *reaper) loop() {
	defer close(r.done)
	// This goroutine's thread runs at the lowest priority: removal is
	// work for idle CPU, not for the creates and execs waiting on it.
	// Its own thread (throwawayThread), not the main one the runtime
	// would keep at that priority after the loop ends.
	_ = throwawayThread(func() error {
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
		r.run()
		return nil
	})
}

func (r *reaper) run() {
	for {
		select {
		case <-r.stop:
			return
		case j := <-r.work:
			if err := r.do(j); errors.Is(err, inroot.ErrStopped) {
				// Stopping: the rest stays in the trash.
			} else if err != nil {
				// Left in the trash; the next daemon tries again.
				r.failures.Add(1)
				slog.Warn("reaper: cannot remove a deleted sandbox's files; left in the trash for the next start",
					"path", j.path, "err", err)
			}
			r.mu.Lock()
			r.pending--
			if r.pending == 0 {
				r.idle.Broadcast()
			}
			r.mu.Unlock()
		}
	}
}

// DeleteFailures counts the deleted sandboxes' directories the reaper
// could not remove (backend.Backlogged).
func (b *Backend) DeleteFailures() uint64 { return b.trash.failures.Load() }

// backlog is how many directories wait for removal.
func (r *reaper) backlog() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending
}

// wait returns once nothing is queued.
func (r *reaper) wait() {
	r.mu.Lock()
	for r.pending > 0 {
		r.idle.Wait()
	}
	r.mu.Unlock()
}

// close stops the removal after the directory in hand; the rest stays in
// the trash for the next daemon. Queued roots are closed.
func (r *reaper) close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	for {
		select {
		case j := <-r.work:
			if j.root >= 0 {
				unix.Close(j.root)
			}
		default:
			return
		}
	}
}

package container

import (
	"os"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// spawner starts sandbox inits from a thread with a file table of its
// own, nearly empty.
//
// A fork copies the forking thread's file table, and the exec that
// follows closes every close-on-exec descriptor of the copy: both cost a
// step per descriptor the daemon holds, and the daemon holds one per
// sandbox (its init's pidfd). At 10,000 sandboxes that was ~10 ms of
// kernel time per create on 2 cores, the largest cost that grew with
// the node's sandbox count (docs/BENCHMARKS.md, density). The spawner's
// thread unshares its table once (unshare(CLONE_FILES)) and closes its
// copy of everything but stdio; each spawn copies just the init's files
// into it (pidfd_getfd from the process's main table, which the
// process's leader thread keeps), forks from there, and closes them.
//
// Only raw syscalls run on that thread: os.File would register
// descriptors with the runtime's poller, whose epoll descriptor is not
// in this table. The init's pidfd is opened afterwards in the main table
// (pidfd_open: the init is this process's child and nobody reaps it
// before the monitor, so its pid cannot have been reused).
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	path  string
	argv  []string
	attr  *syscall.ProcAttr // Files name descriptors of the main table
	reply chan spawnResult
}

type spawnResult struct {
	pid int
	err error
}

var (
	spawnerOnce sync.Once
	theSpawner  *spawner // nil where the kernel lacks what it needs
)

// sharedSpawner returns the process's spawner, started on first use, or
// nil when this kernel cannot give a thread its own table and fetch
// descriptors into it (pidfd_getfd: Linux 5.6): callers fork from
// wherever they run then, as before.
func sharedSpawner() *spawner {
	spawnerOnce.Do(func() {
		s := &spawner{reqs: make(chan spawnReq)}
		ready := make(chan error, 1)
		go s.run(ready)
		if err := <-ready; err == nil {
			theSpawner = s
		}
	})
	return theSpawner
}

func (s *spawner) run(ready chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The leader's table must stay the process's: pidfd_getfd
		// reads the leader's. Run on another thread.
		go s.run(ready)
		runtime.UnlockOSThread()
		return
	}
	// Locked for good: the thread ends with the daemon, its private
	// table with it.
	self, err := s.setup()
	ready <- err
	if err != nil {
		return
	}
	for r := range s.reqs {
		r.reply <- s.spawn(self, r)
	}
}

// setup gives the thread its own table, closes its copy of the main
// one's descriptors, and opens the pidfd it fetches them through.
func (s *spawner) setup() (int, error) {
	if err := unix.Unshare(unix.CLONE_FILES); err != nil {
		return -1, err
	}
	if err := unix.CloseRange(3, ^uint(0), 0); err != nil {
		return -1, err
	}
	self, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return -1, err
	}
	// Check that fetching works (seccomp or an old kernel may refuse it).
	fd, err := unix.PidfdGetfd(self, 2, 0)
	if err != nil {
		_ = unix.Close(self)
		return -1, err
	}
	_ = unix.Close(fd)
	return self, nil
}

func (s *spawner) spawn(self int, r spawnReq) spawnResult {
	attr := *r.attr
	attr.Files = make([]uintptr, len(r.attr.Files))
	var mine []int
	defer func() {
		for _, fd := range mine {
			_ = unix.Close(fd)
		}
	}()
	got := map[uintptr]uintptr{} // main table's fd -> this table's
	for i, fd := range r.attr.Files {
		if fd == ^uintptr(0) { // no file at this position
			attr.Files[i] = fd
			continue
		}
		if c, ok := got[fd]; ok {
			attr.Files[i] = c
			continue
		}
		c, err := unix.PidfdGetfd(self, int(fd), 0)
		if err != nil {
			return spawnResult{err: err}
		}
		mine = append(mine, c)
		got[fd] = uintptr(c)
		attr.Files[i] = uintptr(c)
	}
	pid, err := syscall.ForkExec(r.path, r.argv, &attr)
	return spawnResult{pid: pid, err: err}
}

// start forks and execs path with attr's files (descriptors of the main
// table, ^uintptr(0) for none) and returns the child's pid. The files
// must stay open until it returns.
func (s *spawner) start(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	reply := make(chan spawnResult, 1)
	s.reqs <- spawnReq{path: path, argv: argv, attr: attr, reply: reply}
	res := <-reply
	return res.pid, res.err
}

// spawnInit starts a sandbox's init (path, with files at its fds 0..n,
// nil for none, in a session of its own: signals to the daemon's terminal
// or process group never reach sandboxes) and returns its pid and a pidfd
// of it. Through the spawner where it runs; else os.StartProcess (no
// stdio goroutines or /dev/null opens per create), whose clone hands back
// the pidfd.
func spawnInit(path string, files []*os.File, cloneflags uintptr) (pid, pidfd int, err error) {
	env := []string{initEnv + "=1"}
	sys := &syscall.SysProcAttr{Cloneflags: cloneflags, Setsid: true}
	if sp := sharedSpawner(); sp != nil {
		fds := make([]uintptr, len(files))
		for i, f := range files {
			fds[i] = ^uintptr(0)
			if f != nil {
				fds[i] = f.Fd()
			}
		}
		pid, err = sp.start(path, []string{"warren-init"}, &syscall.ProcAttr{Env: env, Files: fds, Sys: sys})
		runtime.KeepAlive(files)
		if err != nil {
			return 0, -1, err
		}
		if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			_, _ = unix.Wait4(pid, nil, 0, nil)
			return 0, -1, err
		}
		return pid, pidfd, nil
	}
	pidfd = -1
	sys.PidFD = &pidfd
	proc, err := os.StartProcess(path, []string{"warren-init"}, &os.ProcAttr{Env: env, Files: files, Sys: sys})
	if err != nil {
		return 0, -1, err
	}
	// We reap it through the monitor, not os.
	_ = proc.Release()
	return proc.Pid, pidfd, nil
}

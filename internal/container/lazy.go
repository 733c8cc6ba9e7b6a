package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Lazy restore of memory (Spec.LazyPages).
//
// CRIU restores the tree without its anonymous pages: their ranges are
// registered with a userfaultfd, which the restore hands to a `criu
// lazy-pages` server started for this sandbox. The server answers the
// tree's page faults from the checkpoint's images and, once the faults
// stop, copies the pages nothing asked for in the background, then
// exits: every page comes back, later. A restore of 256 MiB took ~70 ms
// lazily against ~140 ms eagerly (bare CRIU here), and the rest is filled
// in ~100-180 ms after it returns.
//
// The server reads hard links of the images made in the sandbox's state
// directory (lazyImages), so the checkpoint can go (a resumed sandbox's
// is discarded at once; a fork's source may be deleted) while it still
// reads them. It runs in its own session and, once the tree is restored,
// in the sandbox's cgroup: a daemon that stops or restarts leaves it
// filling (as it leaves the sandbox running), the next one adopts it
// (adoptLazy), and deleting the sandbox kills it with the rest of the
// group.
//
// A server that dies before it is done leaves pages that can never come
// back: a process touching one gets SIGBUS (the kernel does not hand it
// zeros). The sandbox is then killed whole, not left with some of its
// processes dead: watch.

// lazyImagesDir is the hard links of the checkpoint's images the server
// reads, in the sandbox's state directory.
const lazyImagesDir = "lazy-images"

// lazyServer is one sandbox's running lazy-pages server.
type lazyServer struct {
	pid    int           // its supervising shell (lazyWrapper), leader of its process group
	linked string        // the hard links of the images it reads
	log    string        // its log
	ready  chan error    // its first status, or why there is none
	done   chan struct{} // closed once it exited (and was reaped, if ours)
	err    error         // its exit; set before done closes
}

// lazyWrapper runs the server under a shell that writes its exit status
// to a file ($0) beside its log: a daemon that restarted while the server
// filled (and cannot wait for a process it did not start) reads it there
// (adoptLazy). The shell leads the server's process group.
const lazyWrapper = `"$@"; s=$?; echo $s > "$0"; exit $s`

// lazyStatusFile is the server's exit status, in the work directory.
const lazyStatusFile = "lazy-pages.status"

// startLazyPages links the images into the sandbox's state directory and
// starts a lazy-pages server on them, listening in workDir (where the
// restore, run with the same work directory, finds its socket). It
// starts probing the kernel while the caller makes the rest of the
// sandbox; listening waits until it listens.
func startLazyPages(images, stateDir, workDir string) (_ *lazyServer, retErr error) {
	if err := uffdAvailable(); err != nil {
		return nil, err
	}
	linked := filepath.Join(stateDir, lazyImagesDir)
	_ = removeLinks(linked) // what a crashed attempt left
	err := linkImages(images, linked)
	if errors.Is(err, unix.EXDEV) {
		_ = os.RemoveAll(linked) // the directory made for them
		err = linkBeside(images, linked)
	}
	defer func() {
		if retErr != nil {
			_ = removeLinks(linked)
		}
	}()
	if err != nil {
		return nil, fsErr(err, "link the checkpoint's images for lazy restore")
	}
	// The server says it listens by writing to its status descriptor.
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "lazy-pages status pipe")
	}
	status := filepath.Join(workDir, lazyStatusFile)
	_ = os.Remove(status) // a crashed attempt's
	cmd := exec.Command("/bin/sh", "-c", lazyWrapper, status,
		CRIUPath, "lazy-pages", "--images-dir", linked, "--work-dir", workDir,
		"--status-fd", "3", "-o", "lazy-pages.log", "-v2")
	cmd.ExtraFiles = []*os.File{wr}
	// Its own session: no signal meant for the daemon's process group
	// reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = startCRIU(cmd.Start)
	wr.Close()
	if err != nil {
		rd.Close()
		return nil, errdefs.Wrap(errdefs.Internal, err, "start criu lazy-pages")
	}
	l := &lazyServer{pid: cmd.Process.Pid, linked: linked, log: filepath.Join(workDir, "lazy-pages.log"),
		ready: make(chan error, 1), done: make(chan struct{})}
	go func() {
		l.err = cmd.Wait()
		close(l.done)
	}()
	go func() {
		defer rd.Close()
		var b [1]byte
		_, err := rd.Read(b[:])
		l.ready <- err
	}()
	return l, nil
}

// listening waits until the server listens for the restore.
func (l *lazyServer) listening() error {
	var err error
	select {
	case err = <-l.ready:
	case <-time.After(10 * time.Second):
		err = errors.New("timed out")
	}
	if err != nil {
		return errdefs.Internalf("criu lazy-pages did not start listening (%v): %s", err, criuLogErrors(l.log))
	}
	return nil
}

// discard stops the server of a failed restore and removes its links.
func (l *lazyServer) discard() error {
	l.stop()
	return removeLinks(l.linked)
}

// linkImages hard-links the files of dir src into a new dir dst, on the
// same filesystem (EXDEV otherwise).
func linkImages(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || filepath.Ext(e.Name()) != ".img" {
			continue
		}
		if err := os.Link(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// lazyLinksDir holds, beside the checkpoints, the links of images that
// are on another filesystem than the sandboxes' state (a checkpoint
// directory nodes share, --checkpoint-dir): hard links cannot cross
// filesystems, so they are made there, and the state directory's
// lazy-images is a symlink to them. The server's command line names the
// symlink, by which a restarted daemon finds it (adoptLazy).
const lazyLinksDir = ".lazy"

// lazyLinksMaxAge: links beside the checkpoints older than this are a
// node's that went before its server was done (no server fills memory
// for that long), and go at the next lazy restore of any node.
const lazyLinksMaxAge = 24 * time.Hour

// linkBeside links images (<checkpoints>/<id>/images) into a new
// directory of <checkpoints>/.lazy and makes linked a symlink to it.
func linkBeside(images, linked string) error {
	dir := filepath.Join(filepath.Dir(filepath.Dir(images)), lazyLinksDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	now := time.Now()
	sweepLinksBeside(dir, now.Add(-lazyLinksMaxAge))
	// <id>-<n>, as bases are named: ids are unique on a shared directory.
	t := filepath.Join(dir, filepath.Base(filepath.Dir(linked))+"-"+strconv.FormatInt(now.UnixNano(), 36))
	if err := os.Symlink(t, linked); err != nil {
		return err
	}
	return linkImages(images, t)
}

// sweepLinksBeside removes the link directories in dir made before cut.
func sweepLinksBeside(dir string, cut time.Time) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.ModTime().Before(cut) {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// removeLinks removes the links a lazy-pages server read: the directory,
// or the symlink and the directory beside the checkpoints it names.
func removeLinks(linked string) error {
	if t, err := os.Readlink(linked); err == nil {
		return errors.Join(os.RemoveAll(t), os.Remove(linked))
	}
	return os.RemoveAll(linked)
}

// removeLinksBeside removes linked's links beside the checkpoints, if it
// is a symlink to them (a sandbox deleted while its server filled).
func removeLinksBeside(linked string) error {
	if _, err := os.Readlink(linked); err != nil {
		return nil
	}
	return removeLinks(linked)
}

var uffdOnce = sync.OnceValue(func() error {
	// The non-cooperative features CRIU needs (fork, remap and unmap
	// events) are in every kernel since 4.11; what a node may lack is
	// the syscall, or its use by root being off
	// (vm.unprivileged_userfaultfd does not apply to root).
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, uintptr(unix.O_CLOEXEC|unix.O_NONBLOCK), 0, 0)
	if errno != 0 {
		return errdefs.New(errdefs.Unsupported, "this node cannot restore lazily: userfaultfd: %v", errno)
	}
	unix.Close(int(fd))
	return nil
})

func uffdAvailable() error { return uffdOnce() }

// unprivUffdKnob is the kernel's setting for userfaultfds of unprivileged
// tasks (handling kernel-mode faults too, which CRIU's need).
const unprivUffdKnob = "/proc/sys/vm/unprivileged_userfaultfd"

// uffdForUserNS: the tasks of a sandbox in a user namespace may open a
// userfaultfd for their lazy restore. CRIU opens it from the restored
// tasks themselves, whose credentials are the sandbox's, and the kernel
// lets an unprivileged task have one that takes kernel faults only with
// vm.unprivileged_userfaultfd=1 (CRIU 4.2 does not use /dev/userfaultfd).
// warren serve sets it unless told not to (AllowUnprivilegedUserfaultfd);
// sandboxes themselves still cannot call userfaultfd (seccomp). Read at
// each restore: the setting may change while the daemon runs.
func uffdForUserNS() error {
	b, err := os.ReadFile(unprivUffdKnob)
	if err != nil {
		return errdefs.Wrap(errdefs.Unsupported, err, "read vm.unprivileged_userfaultfd")
	}
	if strings.TrimSpace(string(b)) != "1" {
		return errdefs.Unsupportedf("vm.unprivileged_userfaultfd is %s: a sandbox in a user namespace restores eagerly", strings.TrimSpace(string(b)))
	}
	return nil
}

// adopt moves the server (its shell and the server itself) into the
// sandbox's cgroup, so that it outlives the daemon with the sandbox and
// dies with it.
func (l *lazyServer) adopt(grp cgroups.Group) error {
	if l.pid <= 0 {
		return nil // an adopted one that had ended
	}
	for _, pid := range append([]int{l.pid}, childrenOf(l.pid)...) {
		// The group's OOM killer takes the sandbox's processes, not
		// the server (whose death would kill the whole sandbox).
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte("-1000"), 0)
		if err := grp.AddProc(pid); err != nil {
			select {
			case <-l.done:
				return nil // finished already
			default:
			}
			return err
		}
	}
	return nil
}

// childrenOf lists pid's children (none if it is gone).
func childrenOf(pid int) []int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if c, err := strconv.Atoi(f); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// stop kills the server (a failed restore, an adopted one's sandbox
// deleted) and waits for it: its whole process group, shell and server.
func (l *lazyServer) stop() {
	if l.pid > 0 {
		_ = unix.Kill(-l.pid, unix.SIGKILL)
	}
	<-l.done
}

// adoptLazy finds, for a sandbox a restarted daemon adopts, the lazy-pages
// server that was filling its memory when the last daemon stopped, and
// watches it as its own (watchLazy): its images go once it is done, and
// the sandbox is killed should it die before. One that ended meanwhile is
// judged by the status its shell wrote. Nothing to do for a sandbox that
// was not restored lazily, or whose server was done before.
func (s *sandbox) adoptLazy() {
	linked := filepath.Join(s.b.stateDir(s.id), lazyImagesDir)
	if _, err := os.Stat(linked); err != nil {
		return
	}
	work := s.b.runDir(s.id)
	status := filepath.Join(work, lazyStatusFile)
	l := &lazyServer{linked: linked, log: filepath.Join(work, "lazy-pages.log"), done: make(chan struct{})}
	// Looked for in all of /proc, not only the sandbox's group: its move
	// there may have failed. Rare (a restart while a restore filled).
	pid, pidfd := findLazyServer(linked)
	l.pid = pid
	go func() {
		if pidfd >= 0 {
			defer unix.Close(pidfd)
			fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			for {
				if _, err := unix.Poll(fds, -1); err != unix.EINTR {
					break
				}
			}
		}
		l.err = lazyOutcome(status, l.log)
		close(l.done)
	}()
	s.lazyMu.Lock()
	s.lazy = l
	s.lazyMu.Unlock()
	go s.watchLazy(l)
}

// findLazyServer finds the running lazy-pages server reading linked: its
// shell (lazyWrapper), or the server itself as daemons before the shell
// started it. It returns its pid and a pidfd (-1 when none runs).
func findLazyServer(linked string) (int, int) {
	ents, _ := os.ReadDir("/proc")
	var bare int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		switch lazyKind(pid, linked) {
		case 1:
			if fd, ok := pidfdOf(pid, linked, 1); ok {
				return pid, fd
			}
		case 2:
			bare = pid
		}
	}
	if bare != 0 {
		if fd, ok := pidfdOf(bare, linked, 2); ok {
			return bare, fd
		}
	}
	return 0, -1
}

// pidfdOf opens a pidfd of pid and checks, now that its pid cannot be
// reused, that it still is what it was.
func pidfdOf(pid int, linked string, kind int) (int, bool) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, false
	}
	if lazyKind(pid, linked) != kind {
		unix.Close(fd)
		return -1, false
	}
	return fd, true
}

// lazyKind: 1 if pid is the shell of a lazy-pages server reading linked,
// 2 if it is such a server itself, 0 otherwise.
func lazyKind(pid int, linked string) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !strings.Contains(string(b), "\x00lazy-pages\x00--images-dir\x00"+linked+"\x00") {
		return 0
	}
	if strings.HasPrefix(string(b), "/bin/sh\x00-c\x00"+lazyWrapper+"\x00") {
		return 1
	}
	return 2
}

// lazyOutcome is how a server that no daemon waited for ended: the status
// its shell wrote, else (its shell was killed, or a daemon from before
// the shell started it) the errors of its log, if any.
func lazyOutcome(status, log string) error {
	if b, err := os.ReadFile(status); err == nil {
		if st := strings.TrimSpace(string(b)); st != "0" {
			return fmt.Errorf("lazy-pages server exited with status %s: %s", st, criuLogErrors(log))
		}
		return nil
	}
	if errs := criuLogErrors(log); strings.Contains(errs, "Error (") {
		return fmt.Errorf("lazy-pages server failed: %s", errs)
	}
	return nil
}

// finished says whether the server exited, and with what.
func (l *lazyServer) finished() (bool, error) {
	select {
	case <-l.done:
		return true, l.err
	default:
		return false, nil
	}
}

// wait waits until the server has filled every page and exited.
func (l *lazyServer) wait(ctx context.Context) error {
	select {
	case <-l.done:
		return l.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchLazy waits for the sandbox's lazy-pages server: once it is done
// its images go; should it die before it is done, the sandbox is killed
// whole (its missing pages can never come back).
func (s *sandbox) watchLazy(l *lazyServer) {
	// Moving a process between cgroups waits for RCU (10-17 ms here):
	// done here, off the restore's path. Should it fail, the server
	// still fills the memory; only a daemon restart or a delete finds
	// it outside the group.
	if err := l.adopt(s.grp); err != nil && s.b.opts.Warn != nil {
		s.b.opts.Warn("move the lazy-pages server into the sandbox's cgroup", "sandbox", s.id, "err", err)
	}
	select {
	case <-l.done:
	case <-s.exited.Done():
		// The sandbox died (or was deleted): so must the server, whose
		// cgroup is being killed; wait for it either way.
		<-l.done
	}
	if l.err != nil {
		select {
		case <-s.exited.Done():
		default:
			if s.b.opts.Warn != nil {
				s.b.opts.Warn("lazy-pages server died before the sandbox's memory was restored: killing the sandbox", "sandbox", s.id, "err", l.err)
			}
			_ = s.grp.Kill(10 * time.Second)
		}
	}
	_ = removeLinks(l.linked)
}

// lazyFilled waits, up to wait, until the sandbox's memory is all back
// (its lazy-pages server exited): a checkpoint reads every page.
func (s *sandbox) lazyFilled(ctx context.Context, wait time.Duration) error {
	s.lazyMu.Lock()
	l := s.lazy
	s.lazyMu.Unlock()
	if l == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := l.wait(ctx); err != nil {
		if ctx.Err() != nil {
			return errdefs.Conflictf("sandbox %s is still restoring its memory lazily: checkpoint it once that is done", s.id)
		}
		return errdefs.Wrap(errdefs.Internal, err, "lazy restore of sandbox "+s.id)
	}
	return nil
}

// LazyPending says whether the sandbox's memory is still being restored
// lazily (tests, the benchmark's fill time).
func (s *sandbox) LazyPending() bool {
	s.lazyMu.Lock()
	l := s.lazy
	s.lazyMu.Unlock()
	if l == nil {
		return false
	}
	done, _ := l.finished()
	return !done
}

// lazyPid is the server's pid, for tests; 0 when none runs.
func (s *sandbox) lazyPid() int {
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	if s.lazy == nil {
		return 0
	}
	if done, _ := s.lazy.finished(); done {
		return 0
	}
	// The server, not its shell (lazyWrapper).
	if c := childrenOf(s.lazy.pid); len(c) > 0 {
		return c[0]
	}
	return s.lazy.pid
}

// MemoryRestore says how a restore brought the sandbox's memory back
// (backend.MemoryRestorer): lazily, or eagerly and why where lazily was
// asked. A sandbox that was created, not restored, says (false, "").
func (s *sandbox) MemoryRestore() (bool, string) { return s.restoredLazy, s.eagerWhy }

// lazyRestore is nil where a sandbox (in a user namespace or not)
// restores its memory lazily on this node, else why not.
func lazyRestore(userNS bool) error {
	if err := uffdAvailable(); err != nil {
		return err
	}
	if userNS {
		return uffdForUserNS()
	}
	return nil
}

// UserNSLazyRestore is nil where sandboxes in a user namespace restore
// their memory lazily on this node, else why not (the daemon says so
// when it starts).
func UserNSLazyRestore() error { return lazyRestore(true) }

// AllowUnprivilegedUserfaultfd sets vm.unprivileged_userfaultfd=1 unless
// it is already, and says what it was ("" when it was 1): warren serve
// does at start (--unprivileged-userfaultfd, on by default), so that
// sandboxes in a user namespace restore lazily. Sandboxes gain nothing
// from it: their seccomp filter refuses userfaultfd (internal/seccomp),
// and CRIU's restored tasks open theirs before that filter is restored.
// What it widens is every other unprivileged process on the node
// (docs/SECURITY.md, "userfaultfd").
func AllowUnprivilegedUserfaultfd() (was string, err error) {
	b, err := os.ReadFile(unprivUffdKnob)
	if err != nil {
		return "", errdefs.Wrap(errdefs.Unsupported, err, "read vm.unprivileged_userfaultfd")
	}
	if v := strings.TrimSpace(string(b)); v != "1" {
		if err := os.WriteFile(unprivUffdKnob, []byte("1"), 0); err != nil {
			return "", errdefs.Wrap(errdefs.Unsupported, err, "set vm.unprivileged_userfaultfd=1")
		}
		return v, nil
	}
	return "", nil
}

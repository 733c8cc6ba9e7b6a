package guest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// pathDirs is the PATH a command is looked up in and gets by default.
var pathDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// defaultEnv is a process's environment when the host sends none.
var defaultEnv = []string{"PATH=" + strings.Join(pathDirs, ":"), "HOME=/root"}

// lingerGrace is how long a process's exit waits for the end of its
// output: children that outlive it may hold the pipes open.
const lingerGrace = 100 * time.Millisecond

// lookPath finds name as the command would in root (where it runs
// chrooted): a name with a slash as it is, else in pathDirs.
func lookPath(root, name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, d := range pathDirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(filepath.Join(root, p)); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in PATH", name)
}

// proc is a started process and the agent's ends of its streams (nil
// where not connected).
type proc struct {
	pid   int // in the guest: what signals take
	nsPid int // in the sandbox: what the host is told
	done  <-chan syscall.WaitStatus
	inW   *os.File
	outR  *os.File
	errR  *os.File
	pty   *os.File // the terminal's master (both ways), with a pty
}

// startProc starts req's command in the sandbox with the streams asked
// for, or on a new terminal of size pty (then the only stream). On error
// nothing is left open; the category is the error's.
func (s *server) startProc(req Request, stdin, stdout, stderr bool, pty *Winsize) (*proc, errdefs.Category, error) {
	if len(req.Argv) == 0 {
		return nil, errdefs.Invalid, errors.New("empty argv")
	}
	root := "/"
	if s.ns != nil {
		root = RootDir
	}
	path, err := lookPath(root, req.Argv[0])
	if err != nil {
		return nil, errdefs.NotFound, err
	}
	if req.Dir != "" {
		if fi, err := os.Stat(filepath.Join(root, req.Dir)); err != nil || !fi.IsDir() {
			return nil, errdefs.Invalid, fmt.Errorf("working directory %s: not a directory in the sandbox", req.Dir)
		}
	}
	cmd := &exec.Cmd{Path: path, Args: req.Argv, Env: req.Env, Dir: req.Dir}
	if cmd.Env == nil {
		cmd.Env = defaultEnv
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if req.UID != 0 || req.GID != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: req.UID, Gid: req.GID}
	}
	if s.ns != nil && cmd.Dir == "" {
		cmd.Dir = "/"
	}
	p := &proc{}
	// The child's ends, closed once it started.
	var theirs []*os.File
	closeAll := func(fs ...*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	pipe := func() (r, w *os.File) {
		if err != nil {
			return nil, nil
		}
		r, w, err = os.Pipe()
		return r, w
	}
	if pty != nil {
		ptmx := "/dev/ptmx"
		if s.ns != nil {
			ptmx = RootDir + "/dev/pts/ptmx" // the sandbox's own devpts
		}
		master, slave, err := openPTY(ptmx, *pty)
		if err != nil {
			return nil, errdefs.Unavailable, err
		}
		p.pty = master
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		theirs = append(theirs, slave)
		// The terminal is the new session's (its fd 0).
		cmd.SysProcAttr.Setctty = true
		stdin, stdout, stderr = false, false, false
	}
	if stdin {
		var r *os.File
		r, p.inW = pipe()
		cmd.Stdin, theirs = r, append(theirs, r)
	}
	if stdout {
		var w *os.File
		p.outR, w = pipe()
		cmd.Stdout, theirs = w, append(theirs, w)
	}
	if stderr {
		var w *os.File
		p.errR, w = pipe()
		cmd.Stderr, theirs = w, append(theirs, w)
	}
	if err != nil {
		closeAll(theirs...)
		closeAll(p.inW, p.outR, p.errR, p.pty)
		return nil, errdefs.Exhausted, err
	}
	// A process with limits of its own starts through the trampoline,
	// which reports a failed exec on execErr.
	var execErr *os.File
	if needsTrampoline(req.Rlimits, s.held) && err == nil {
		var w *os.File
		if execErr, w, err = os.Pipe(); err == nil {
			b, _ := json.Marshal(trampolineArgs{Path: path, Rlimits: req.Rlimits})
			cmd.Path = "/proc/self/exe"
			cmd.Env = append([]string{trampolineRole, trampolineEnv + string(b)}, cmd.Env...)
			cmd.ExtraFiles = []*os.File{w}
			theirs = append(theirs, w)
		}
	}
	if err != nil {
		closeAll(theirs...)
		closeAll(p.inW, p.outR, p.errR, p.pty, execErr)
		return nil, errdefs.Exhausted, err
	}
	if s.cg != nil {
		// Straight into the sandbox's cgroup (clone3 CLONE_INTO_CGROUP):
		// its limits hold from the first instruction.
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(s.cg.Fd())
	}
	if s.ns != nil {
		err = s.ns.startIn(func() (err error) { p.done, err = s.r.start(cmd); return err })
	} else {
		p.done, err = s.r.start(cmd)
	}
	closeAll(theirs...)
	if execErr != nil {
		if err == nil {
			err = trampolineErr(execErr)
		}
		execErr.Close()
	}
	if err != nil {
		closeAll(p.inW, p.outR, p.errR, p.pty)
		cat := errdefs.Internal
		switch {
		case errors.Is(err, os.ErrNotExist):
			cat = errdefs.NotFound
		case errors.Is(err, os.ErrPermission):
			cat = errdefs.PermissionDenied
		}
		return nil, cat, err
	}
	p.pid = cmd.Process.Pid
	if execErr != nil {
		// The trampoline set it.
		p.nsPid = nsPid(p.pid)
		return p, 0, nil
	}
	// The agent is exempt from the OOM killer (-1000), which its children
	// inherit: the sandbox's processes become its victims again (a raise
	// needs no privilege). Until then an allocation past the limit waits
	// in the kernel's retry loop, and the retry after this finds a victim.
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", p.pid), []byte("0"), 0)
	p.nsPid = nsPid(p.pid)
	return p, 0, nil
}

// exitOf is how a wait status ended.
func exitOf(ws syscall.WaitStatus) Exit {
	if ws.Signaled() {
		return Exit{Code: -1, Signal: int(ws.Signal())}
	}
	return Exit{Code: ws.ExitStatus()}
}

// execOne starts req.Argv, streams its output, takes its stdin and
// signals from the host, then sends its exit.
func (s *server) execOne(st net.Conn, br *bufio.Reader, req Request) {
	var wmu sync.Mutex
	send := func(kind byte, b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return WriteFrame(st, kind, b)
	}
	var pty *Winsize
	if req.PTY {
		pty = &Winsize{Rows: req.Rows, Cols: req.Cols}
	}
	p, cat, err := s.startProc(req, req.Stdin, req.Stdout, req.Stderr, pty)
	if err != nil {
		wmu.Lock()
		fail(st, cat, err)
		wmu.Unlock()
		return
	}
	// Set (under the reaper's lock order: after the status came) before
	// its pid may be another's: signals stop then.
	var exited sync.Mutex
	ended := false
	kill := func(sig syscall.Signal, group bool) {
		exited.Lock()
		defer exited.Unlock()
		if ended {
			return
		}
		if group {
			_ = syscall.Kill(-p.pid, sig)
		} else {
			_ = syscall.Kill(p.pid, sig)
		}
	}
	b, _ := json.Marshal(Started{Pid: p.nsPid})
	_ = send(KindStarted, b)
	// The host's frames: stdin, its end, signals. A stream the host
	// closes kills the process group.
	go func() {
		inW := p.inW
		defer func() {
			if inW != nil {
				inW.Close()
			}
		}()
		for {
			kind, data, err := ReadFrame(br)
			if err != nil {
				kill(syscall.SIGKILL, true)
				return
			}
			switch kind {
			case KindStdin:
				if inW != nil {
					_, _ = inW.Write(data)
				} else if p.pty != nil {
					_, _ = p.pty.Write(data)
				}
			case KindCloseIn:
				if inW != nil {
					inW.Close()
					inW = nil
				} else if p.pty != nil {
					_, _ = p.pty.Write([]byte{eofChar})
				}
			case KindResize:
				var ws Winsize
				if p.pty != nil && json.Unmarshal(data, &ws) == nil {
					_ = setWinsize(p.pty, ws)
				}
			case KindSignal:
				var sg Signal
				if json.Unmarshal(data, &sg) == nil {
					kill(syscall.Signal(sg.Signal), sg.Group)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	pump := func(f *os.File, kind byte) {
		defer wg.Done()
		defer f.Close()
		pumpOut(f, func(b []byte) { _ = send(kind, b) })
	}
	var outs []*os.File
	for _, o := range []struct {
		f    *os.File
		kind byte
	}{{p.outR, KindStdout}, {p.errR, KindStderr}, {p.pty, KindStdout}} {
		if o.f != nil {
			outs = append(outs, o.f)
			wg.Add(1)
			go pump(o.f, o.kind)
		}
	}
	ws := <-p.done
	exited.Lock()
	ended = true
	exited.Unlock()
	waitDrained(&wg, outs)
	b, _ = json.Marshal(exitOf(ws))
	_ = send(KindExit, b)
}

// waitDrained waits until the readers of outs are done: at once when the
// process's output ended with it, else after lingerGrace (a child that
// outlives it holds the pipes) by ending their reads.
func waitDrained(wg *sync.WaitGroup, outs []*os.File) {
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(lingerGrace):
		for _, f := range outs {
			_ = f.SetReadDeadline(time.Now())
		}
		<-drained
	}
}

// pumpOut passes what f gives to out until its end, or until
// waitDrained's deadline; then what is in the pipe already, written
// before the process's exit, goes too. A deadline fails the next read
// without looking at the pipe: a shell's "sh: 1: " and "Cannot fork"
// (two writes) lost the second while the first one's frame was on its
// way to a TCG guest's host (conformance PidsLimit, fullvm).
func pumpOut(f *os.File, out func([]byte)) {
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			out(buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drainReady(f, buf, out)
			return
		}
		if err != nil {
			return
		}
	}
}

// drainReady passes on what f (a non-blocking pipe or terminal) holds
// now, no more: a child that outlives the process and writes on would
// keep a loop that read until empty going.
func drainReady(f *os.File, buf []byte, out func([]byte)) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	left := -1
	for left != 0 {
		n := 0
		// Control, not Read: a read through the runtime checks the
		// deadline first.
		_ = rc.Control(func(fd uintptr) {
			if left < 0 { // FIONREAD
				if left, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ); err != nil || left <= 0 {
					return
				}
			}
			n, err = unix.Read(int(fd), buf[:min(len(buf), left)])
		})
		if n <= 0 || err != nil {
			return
		}
		out(buf[:n])
		left -= n
	}
}

// eofChar ends a terminal's input (^D), which stays open for output.
const eofChar = 4

// openPTY opens a new terminal of the devpts whose ptmx is given, of size
// ws: its master (non-blocking, so that the runtime poller serves it and
// deadlines work) and its slave.
func openPTY(ptmx string, ws Winsize) (master, slave *os.File, err error) {
	m, err := unix.Open(ptmx, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", ptmx, err)
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(m)
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	if err := unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols}); err != nil {
		unix.Close(m)
		return nil, nil, fmt.Errorf("pty size: %w", err)
	}
	// The slave by the master, not by a path in /dev/pts.
	sfd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if e != 0 {
		unix.Close(m)
		return nil, nil, fmt.Errorf("open pty slave: %w", e)
	}
	return os.NewFile(uintptr(m), "ptmx"), os.NewFile(sfd, "pts"), nil
}

// setWinsize sets a terminal's size through its master; the kernel sends
// SIGWINCH to its foreground process group.
func setWinsize(master *os.File, ws Winsize) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	}); err != nil {
		return err
	}
	return ierr
}

// trampolineErr reads the trampoline's report: nothing when the command
// started ("errno:message" otherwise).
func trampolineErr(r *os.File) error {
	b, _ := io.ReadAll(r)
	if len(b) == 0 {
		return nil
	}
	var errno int
	msg := string(b)
	if n, rest, ok := strings.Cut(msg, ":"); ok {
		if _, err := fmt.Sscan(n, &errno); err == nil {
			msg = rest
		}
	}
	if errno != 0 {
		return fmt.Errorf("%s: %w", msg, syscall.Errno(errno))
	}
	return errors.New(msg)
}

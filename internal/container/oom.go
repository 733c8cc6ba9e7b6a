package container

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/kfile"
)

// The OOM-kill counter of a sandbox's cgroup is sandbox-wide: when it
// rises while an exec ran, some process of the sandbox was OOM-killed,
// not necessarily the exec's. The kernel names each victim by host pid in
// its log ("Killed process N (comm)"), so TrackOOM learns the host pid of
// the exec's process while it runs and looks for it in the log after its
// exit.

// kernelLog is the node's one reader of /dev/kmsg, opened on first use.
var kernelLog = sync.OnceValues(openOOMLog)

// maxVictims bounds the victims remembered between an exec's start and
// its exit check; a node OOM-killing more than that in one exec's life
// loses the oldest (they then read as not OOM-killed).
const maxVictims = 4096

// oomLogWait is how long a check waits for the victim's record: the
// kernel logs it right after sending SIGKILL, so it is there before the
// agent has reaped the process and reported its exit, save on a stalled
// CPU.
const oomLogWait = 50 * time.Millisecond

type oomLog struct {
	mu      sync.Mutex
	fd      int
	buf     []byte
	victims map[int]bool // host pids named by the log since their tracking began
	order   []int        // victims in the order logged, for the bound
}

func openOOMLog() (*oomLog, error) {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// Only records from now on: earlier victims are no exec's of ours.
	if _, err := unix.Seek(fd, 0, io.SeekEnd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &oomLog{fd: fd, buf: make([]byte, 8192), victims: map[int]bool{}}, nil
}

// drainLocked reads every record logged since the last call.
func (l *oomLog) drainLocked() {
	for {
		n, err := unix.Read(l.fd, l.buf)
		switch {
		case err == unix.EINTR, err == unix.EPIPE:
			// EPIPE: records were overwritten before we read them; the
			// next read goes on from the oldest one kept.
			continue
		case err != nil || n <= 0:
			return // EAGAIN: nothing more
		}
		if pid, ok := victimPid(l.buf[:n]); ok && !l.victims[pid] {
			l.victims[pid] = true
			l.order = append(l.order, pid)
			if len(l.order) > maxVictims {
				delete(l.victims, l.order[0])
				l.order = slices.Delete(l.order, 0, 1)
			}
		}
	}
}

// victimPid parses a /dev/kmsg record ("pri,seq,usec,flags;message")
// naming an OOM victim: "...: Killed process 1234 (comm) total-vm...".
func victimPid(rec []byte) (int, bool) {
	_, msg, ok := bytes.Cut(rec, []byte{';'})
	if !ok {
		return 0, false
	}
	_, rest, ok := bytes.Cut(msg, []byte("Killed process "))
	if !ok {
		return 0, false
	}
	end := bytes.IndexByte(rest, ' ')
	if end < 0 {
		return 0, false
	}
	pid, err := strconv.Atoi(string(rest[:end]))
	return pid, err == nil && pid > 0
}

// track forgets any earlier victim of hostPid: from here on, a record
// naming it is of the process that holds the pid now (a pid is not
// reused before its process is reaped).
func (l *oomLog) track(hostPid int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drainLocked()
	if l.victims[hostPid] {
		delete(l.victims, hostPid)
		l.order = slices.DeleteFunc(l.order, func(p int) bool { return p == hostPid })
	}
}

// killed reports whether hostPid was named as a victim since track.
func (l *oomLog) killed(hostPid int) bool {
	deadline := time.Now().Add(oomLogWait)
	for {
		l.mu.Lock()
		l.drainLocked()
		v := l.victims[hostPid]
		if v {
			delete(l.victims, hostPid)
			l.order = slices.DeleteFunc(l.order, func(p int) bool { return p == hostPid })
		}
		l.mu.Unlock()
		if v || time.Now().After(deadline) {
			return v
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TrackOOM (backend.OOMTracker) finds the host pid of p, a child of the
// sandbox's agent, by the NSpid lines of the agent's children, and starts
// watching the kernel log for it. It returns nil where it cannot tell: no
// readable /dev/kmsg, or p exited before it was found.
func (s *sandbox) TrackOOM(p backend.Process) func() bool {
	log, err := kernelLog()
	if err != nil {
		return nil
	}
	host, err := s.hostPid(p.Pid())
	if err != nil {
		return nil
	}
	log.track(host)
	return func() bool { return log.killed(host) }
}

var errNoPid = errors.New("not a child of the sandbox's agent")

// hostPid translates the pid of a child of the sandbox's agent from the
// sandbox's pid namespace to the host's. Newer children have higher pids
// (save after a wrap), so the scan starts there: usually one status read.
func (s *sandbox) hostPid(nsPid int) (int, error) {
	init := strconv.Itoa(s.st.Pid)
	b, err := kfile.Read("/proc/" + init + "/task/" + init + "/children")
	if err != nil {
		return 0, err
	}
	var kids []int
	for _, f := range bytes.Fields(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			kids = append(kids, pid)
		}
	}
	slices.Sort(kids)
	want := []byte(strconv.Itoa(nsPid))
	for i := len(kids) - 1; i >= 0; i-- {
		st, err := kfile.Read("/proc/" + strconv.Itoa(kids[i]) + "/status")
		if err != nil {
			continue
		}
		if _, rest, ok := bytes.Cut(st, []byte("\nNSpid:")); ok {
			line, _, _ := bytes.Cut(rest, []byte{'\n'})
			f := bytes.Fields(line)
			if len(f) > 1 && bytes.Equal(f[len(f)-1], want) {
				return kids[i], nil
			}
		}
	}
	return 0, errNoPid
}

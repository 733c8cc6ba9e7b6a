package guest

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

// bgTable is the agent's background processes: their records, in start
// order, and the latest output of each (Request.BG's cap per stream).
// One lock guards every record; news wakes whoever follows them.
type bgTable struct {
	mu    sync.Mutex
	procs []*bgProc
	news  chan struct{} // closed, and replaced, on every change
}

func newBGTable() *bgTable { return &bgTable{news: make(chan struct{})} }

// changed wakes the followers; the lock is held.
func (t *bgTable) changedLocked() {
	close(t.news)
	t.news = make(chan struct{})
}

// bgProc is one background process's record.
type bgProc struct {
	pid     int // in the sandbox
	gpid    int // in the guest: what signals take
	pty     bool
	tag     []byte
	cap     int64
	started time.Time
	// Under the table's lock:
	out, err ring
	in       *os.File // its stdin (the master with a pty); nil once closed
	exited   bool
	exit     Exit
	runtime  time.Duration
}

// ring keeps the latest bytes of a stream: buf grows (doubling) while
// the stream is short and wraps once it holds the cap, so a quiet
// process costs little. Offsets are the stream's: [start, total).
type ring struct {
	buf          []byte
	start, total int64
}

func (r *ring) write(p []byte, limit int64) {
	size := int64(len(r.buf))
	if r.total+int64(len(p)) > size && size < limit && r.total <= size { // not wrapped yet: grow
		n := min(limit, max(2*size, r.total+int64(len(p)), 4096))
		nb := make([]byte, n)
		copy(nb, r.buf[:r.total])
		r.buf, size = nb, n
	}
	for len(p) > 0 {
		n := copy(r.buf[r.total%size:], p)
		r.total += int64(n)
		p = p[n:]
	}
	r.start = max(r.start, r.total-size)
}

// read copies at most max bytes from off (or from the oldest kept, if
// off was overwritten) and returns the offset they start at.
func (r *ring) read(off int64, max int) (int64, []byte) {
	off = maxInt64(off, r.start)
	if off >= r.total {
		return off, nil
	}
	size := int64(len(r.buf))
	pos := off % size
	n := min(r.total-off, size-pos, int64(max))
	return off, append([]byte(nil), r.buf[pos:pos+n]...)
}

func maxInt64(a, b int64) int64 { return max(a, b) }

// find is pid's latest record (a reused pid names the newest); the lock
// is held.
func (t *bgTable) findLocked(pid int) *bgProc {
	for i := len(t.procs) - 1; i >= 0; i-- {
		if t.procs[i].pid == pid {
			return t.procs[i]
		}
	}
	return nil
}

// bgStart starts a background process and answers its pid.
func (s *server) bgStart(st net.Conn, req Request) {
	o := req.BG
	if o == nil || o.Cap <= 0 || o.Cap > MaxOutputCap {
		fail(st, errdefs.Invalid, fmt.Errorf("output cap outside 1..%d bytes", MaxOutputCap))
		return
	}
	t := s.bg
	t.mu.Lock()
	full := len(t.procs) >= MaxRecords
	t.mu.Unlock()
	if full {
		fail(st, errdefs.Exhausted, fmt.Errorf("the guest agent holds %d background process records, the maximum", MaxRecords))
		return
	}
	var pty *Winsize
	if req.PTY {
		pty = &Winsize{Rows: req.Rows, Cols: req.Cols}
	}
	p, cat, err := s.startProc(req, !req.PTY, !req.PTY, !req.PTY, pty)
	if err != nil {
		fail(st, cat, err)
		return
	}
	bp := &bgProc{pid: p.nsPid, gpid: p.pid, pty: req.PTY, tag: o.Tag, cap: o.Cap, started: time.Now(), in: p.inW}
	outs := []*os.File{p.outR, p.errR}
	if p.pty != nil {
		bp.in, outs = p.pty, []*os.File{p.pty, nil}
	}
	t.mu.Lock()
	t.procs = append(t.procs, bp)
	t.changedLocked()
	t.mu.Unlock()
	var wg sync.WaitGroup
	var readers []*os.File
	for i, f := range outs {
		if f != nil {
			readers = append(readers, f)
			wg.Add(1)
			go t.drain(&wg, bp, f, i == 1)
		}
	}
	go func() {
		ws := <-p.done
		// What it wrote before its exit comes before the exit.
		waitDrained(&wg, readers)
		t.mu.Lock()
		bp.exited, bp.exit, bp.runtime = true, exitOf(ws), time.Since(bp.started)
		if bp.in != nil && !bp.pty {
			bp.in.Close()
		}
		bp.in = nil
		t.changedLocked()
		t.mu.Unlock()
	}()
	b, _ := json.Marshal(Started{Pid: bp.pid})
	_ = WriteFrame(st, KindStarted, b)
}

// drain keeps what f gives in bp's ring until its end. A deadline set on
// f at the process's exit (waitDrained) ends only the wait: the drain
// goes on while children that outlive the process write.
func (t *bgTable) drain(wg *sync.WaitGroup, bp *bgProc, f *os.File, stderr bool) {
	once := sync.OnceFunc(wg.Done)
	defer once()
	defer f.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			t.mu.Lock()
			r := &bp.out
			if stderr {
				r = &bp.err
			}
			r.write(buf[:n], bp.cap)
			t.changedLocked()
			t.mu.Unlock()
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			once()
			_ = f.SetReadDeadline(time.Time{})
			continue
		}
		if err != nil {
			return
		}
	}
}

// bgList answers every record.
func (s *server) bgList(st net.Conn) {
	t := s.bg
	t.mu.Lock()
	out := make([]BGInfo, 0, len(t.procs))
	for _, bp := range t.procs {
		rt := bp.runtime
		if !bp.exited {
			rt = time.Since(bp.started)
		}
		out = append(out, BGInfo{Pid: bp.pid, Exited: bp.exited, Exit: bp.exit, PTY: bp.pty, StdinOpen: bp.in != nil,
			Stdout: [2]int64{bp.out.start, bp.out.total}, Stderr: [2]int64{bp.err.start, bp.err.total},
			Cap: bp.cap, RuntimeMs: rt.Milliseconds(), Tag: bp.tag})
	}
	t.mu.Unlock()
	b, _ := json.Marshal(out)
	_ = WriteFrame(st, KindExit, b)
}

// bgAttach sends a process's output from req.Off, then its exit. A host
// that closes the stream stops it.
func (s *server) bgAttach(st net.Conn, br *bufio.Reader, req Request) {
	t := s.bg
	gone := make(chan struct{})
	go func() {
		for {
			if _, _, err := ReadFrame(br); err != nil {
				close(gone)
				return
			}
		}
	}()
	t.mu.Lock()
	bp := t.findLocked(req.Pid)
	t.mu.Unlock()
	if bp == nil {
		fail(st, errdefs.NotFound, fmt.Errorf("no background process %d in the sandbox", req.Pid))
		return
	}
	cur := req.Off
	for {
		t.mu.Lock()
		var kind byte
		var off int64
		var data []byte
		for i, r := range []*ring{&bp.out, &bp.err} {
			if cur[i] < 0 {
				continue
			}
			if off, data = r.read(cur[i], 32<<10); len(data) > 0 {
				cur[i] = off + int64(len(data))
				kind = [2]byte{KindStdout, KindStderr}[i]
				break
			}
		}
		exited, exit, news := bp.exited, bp.exit, t.news
		t.mu.Unlock()
		switch {
		case len(data) > 0:
			if err := WriteFrame(st, kind, append(binary.LittleEndian.AppendUint64(nil, uint64(off)), data...)); err != nil {
				return
			}
			continue
		case exited:
			b, _ := json.Marshal(exit)
			_ = WriteFrame(st, KindExit, b)
			return
		}
		select {
		case <-news:
		case <-gone:
			return
		}
	}
}

// bgCall serves the requests about one process that answer at once.
func (s *server) bgCall(st net.Conn, req Request) {
	t := s.bg
	t.mu.Lock()
	err := s.bgCallLocked(req)
	t.mu.Unlock()
	var ex exitedError
	switch {
	case errors.As(err, &ex):
		b, _ := json.Marshal(Failure{Category: errdefs.Conflict.String(), Error: err.Error(), Exited: true})
		_ = WriteFrame(st, KindFail, b)
	case err != nil:
		fail(st, errdefs.CategoryOf(err), err)
	default:
		_ = WriteFrame(st, KindExit, []byte("{}"))
	}
}

// exitedError: the request needs a running process.
type exitedError struct{ pid int }

func (e exitedError) Error() string { return fmt.Sprintf("process %d has exited", e.pid) }

func (s *server) bgCallLocked(req Request) error {
	t := s.bg
	if req.Op == "bg_forget" {
		// The oldest exited record of pid.
		running := false
		for i, bp := range t.procs {
			if bp.pid != req.Pid {
				continue
			}
			if !bp.exited {
				running = true
				continue
			}
			t.procs = append(t.procs[:i:i], t.procs[i+1:]...)
			t.changedLocked()
			return nil
		}
		if running {
			return errdefs.Conflictf("process %d is still running", req.Pid)
		}
		return errdefs.NotFoundf("no exited background process %d in the sandbox", req.Pid)
	}
	bp := t.findLocked(req.Pid)
	if bp == nil {
		return errdefs.NotFoundf("no background process %d in the sandbox", req.Pid)
	}
	switch req.Op {
	case "bg_closein":
		switch {
		case bp.in == nil:
		case bp.pty:
			_, _ = bp.in.Write([]byte{eofChar})
		default:
			bp.in.Close()
			bp.in = nil
			t.changedLocked()
		}
		return nil
	case "bg_signal":
		if req.Signal == nil {
			return errdefs.Invalidf("signal: none named")
		}
		if bp.exited { // its pid may be another's now
			return exitedError{bp.pid}
		}
		pid := bp.gpid
		if req.Signal.Group {
			pid = -pid
		}
		if err := syscall.Kill(pid, syscall.Signal(req.Signal.Signal)); err != nil {
			return errdefs.Wrap(errdefs.Invalid, err, "signal")
		}
		return nil
	case "bg_resize":
		switch {
		case !bp.pty:
			return errdefs.Invalidf("resize terminal: process %d has no terminal (start it with a pty)", bp.pid)
		case bp.exited || bp.in == nil:
			return exitedError{bp.pid}
		case req.Size == nil:
			return errdefs.Invalidf("resize terminal: no size")
		}
		if err := setWinsize(bp.in, *req.Size); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "resize terminal")
		}
		return nil
	}
	return errdefs.Invalidf("unknown op %q", req.Op)
}

// bgStdin writes the host's 'i' frames to a process's stdin until the
// stream ends; its stdin stays open.
func (s *server) bgStdin(st net.Conn, br *bufio.Reader, req Request) {
	t := s.bg
	t.mu.Lock()
	bp := t.findLocked(req.Pid)
	var in *os.File
	if bp != nil {
		in = bp.in
	}
	t.mu.Unlock()
	switch {
	case bp == nil:
		fail(st, errdefs.NotFound, fmt.Errorf("no background process %d in the sandbox", req.Pid))
		return
	case in == nil:
		fail(st, errdefs.Conflict, fmt.Errorf("stdin of process %d is closed", req.Pid))
		return
	}
	b, _ := json.Marshal(Started{Pid: bp.pid})
	if WriteFrame(st, KindStarted, b) != nil {
		return
	}
	for {
		kind, data, err := ReadFrame(br)
		if err != nil {
			return
		}
		if kind != KindStdin {
			continue
		}
		if _, err := in.Write(data); err != nil {
			// Closed (CloseStdin, the exit) or the reader gone: ending
			// the stream tells the host.
			return
		}
	}
}

package daemon

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
)

// Output limits per stream.
const (
	DefaultOutputLimit = 1 << 20  // 1 MiB
	MaxOutputLimit     = 64 << 20 // 64 MiB
	// pipeGrace is how long the output pipes may keep delivering after the
	// process exited: a background child that inherited stdout must not
	// hold the call open.
	pipeGrace = 200 * time.Millisecond
	readChunk = 32 << 10
)

// chunks are the read buffers of the output pipes: two per exec, and most
// execs print little, so a buffer each was 64 KiB of garbage per exec.
// add copies what it keeps, so a buffer is free again once a read is done.
var chunks = sync.Pool{New: func() any { return new([readChunk]byte) }}

// capture keeps the first limit bytes of a stream and counts the rest. It
// never stops reading, so a process that writes without end (`yes`) does
// not block on a full pipe. It is safe for concurrent use.
type capture struct {
	limit int64
	keep  bool               // keep the bytes within the limit in memory
	send  func([]byte) error // optional: called with each chunk within the limit

	mu      sync.Mutex
	buf     []byte
	total   int64
	frozen  bool // result taken: later bytes are ignored
	sendErr error
}

func newCapture(limit int64, keep bool, send func([]byte) error) *capture {
	return &capture{limit: limit, keep: keep, send: send}
}

// add records one chunk read from the stream. It returns the error of the
// send callback, once, when sending failed.
func (c *capture) add(p []byte) error {
	c.mu.Lock()
	if c.frozen {
		c.mu.Unlock()
		return nil
	}
	var fit []byte
	if room := c.limit - c.total; room > 0 {
		fit = p[:min(room, int64(len(p)))]
	}
	if c.keep && len(fit) > 0 {
		if c.buf == nil {
			c.buf = make([]byte, 0, min(c.limit, 64<<10))
		}
		c.buf = append(c.buf, fit...)
	}
	c.total += int64(len(p))
	send := c.send != nil && len(fit) > 0 && c.sendErr == nil
	c.mu.Unlock()
	if !send {
		return nil
	}
	if err := c.send(append([]byte(nil), fit...)); err != nil {
		c.mu.Lock()
		c.sendErr = err
		c.mu.Unlock()
		return err
	}
	return nil
}

// readFrom reads r until EOF, a read error or a read deadline. Failed sends
// do not stop it: the stream is drained regardless. onSendErr is called
// once on the first failed send.
func (c *capture) readFrom(r io.Reader, onSendErr func(error)) {
	bp := chunks.Get().(*[readChunk]byte)
	defer chunks.Put(bp)
	buf := bp[:]
	reported := false
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := c.add(buf[:n]); serr != nil && !reported {
				reported = true
				if onSendErr != nil {
					onSendErr(serr)
				}
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// The deadline fires without a read once it has
				// passed, so output still buffered in the pipe (a
				// reader starved of CPU past the grace) would be
				// lost: take what is there, without blocking.
				readBuffered(r, func(b []byte) {
					if serr := c.add(b); serr != nil && !reported && onSendErr != nil {
						reported = true
						onSendErr(serr)
					}
				})
			}
			return
		}
	}
}

// readBuffered reads what r's descriptor holds right now, up to EAGAIN or
// EOF, and never waits for more.
func readBuffered(r io.Reader, add func([]byte)) {
	sc, ok := r.(interface {
		syscall.Conn
		SetReadDeadline(time.Time) error
	})
	if !ok || sc.SetReadDeadline(time.Time{}) != nil {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	bp := chunks.Get().(*[readChunk]byte)
	defer chunks.Put(bp)
	buf := bp[:]
	// A writer still running (a background `yes`) refills the pipe as
	// fast as we read: take at most a few pipe buffers.
	budget := 1 << 20
	_ = rc.Read(func(fd uintptr) bool {
		for budget > 0 {
			n, err := syscall.Read(int(fd), buf)
			if n > 0 {
				add(buf[:n])
				budget -= n
			}
			if err == syscall.EINTR {
				continue
			}
			if n <= 0 || err != nil {
				return true
			}
		}
		return true
	})
}

// result freezes the capture and returns the kept bytes, whether output
// was cut, and how many bytes were dropped past the limit.
func (c *capture) result() (data []byte, truncated bool, dropped int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = true
	if c.total > c.limit {
		dropped = c.total - c.limit
		truncated = true
	}
	return c.buf, truncated, dropped
}

type deadliner interface{ SetReadDeadline(time.Time) error }

// collector reads a process's output streams into captures.
type collector struct {
	readers []io.Reader
	wg      sync.WaitGroup
	done    chan struct{}
}

type streamSource struct {
	r io.Reader // nil: not connected
	c *capture
}

// collect starts one reader goroutine per connected stream.
func collect(onSendErr func(error), srcs ...streamSource) *collector {
	col := &collector{done: make(chan struct{})}
	for _, s := range srcs {
		if s.r == nil || isNilReader(s.r) {
			continue
		}
		col.readers = append(col.readers, s.r)
		col.wg.Add(1)
		go func() {
			defer col.wg.Done()
			s.c.readFrom(s.r, onSendErr)
		}()
	}
	go func() {
		col.wg.Wait()
		close(col.done)
	}()
	return col
}

// isNilReader catches a typed nil (*os.File)(nil) behind the interface.
func isNilReader(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && f == nil
}

// drain is called once the process exited: the streams get grace to reach
// EOF, then reading stops. Streams that support read deadlines (pipes as
// *os.File, sockets) get one; others are closed when the grace passed.
// drain returns when every reader stopped, or after a further second (a
// reader stuck in a non-interruptible read is abandoned; its capture is
// frozen by result, so late bytes are ignored).
func (col *collector) drain(grace time.Duration) {
	select {
	case <-col.done:
		return
	default:
	}
	deadline := time.Now().Add(grace)
	allDeadlines := true
	for _, r := range col.readers {
		d, ok := r.(deadliner)
		// os.ErrNoDeadline (a non-pollable file): the close below is
		// the fallback.
		if !ok || d.SetReadDeadline(deadline) != nil {
			allDeadlines = false
		}
	}
	wait := grace + 50*time.Millisecond
	if allDeadlines {
		// Every reader stops by itself once the deadline passed, after
		// taking what the pipe still buffers; closing it from here
		// instead could drop output that a reader starved of CPU (a
		// loaded node) has not read yet. So wait for them, with a
		// generous cap for a reader that never gets to run at all.
		wait = grace + 10*time.Second
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-col.done:
		return
	case <-t.C:
	}
	for _, r := range col.readers {
		if c, ok := r.(io.Closer); ok {
			_ = c.Close()
		}
	}
	t.Reset(time.Second)
	select {
	case <-col.done:
	case <-t.C:
	}
}

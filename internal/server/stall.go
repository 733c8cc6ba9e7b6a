package server

import (
	"errors"
	"io"
	"net/http"
	"time"
)

// DefaultStallTimeout is how long a streaming response may wait for the
// client to take data, and a streaming upload for the client to send
// some, before the transfer is cut. A client that stops reading an
// archive otherwise holds the walk that produces it, and whatever that
// walk holds, for as long as it likes. A minute is far longer than any
// healthy client pauses and short enough that a stuck one lets go soon.
const DefaultStallTimeout = 60 * time.Second

// stallWriter arms a write deadline of d around every write to w: a
// client that takes nothing for d fails the write (over HTTP/1.1 the
// connection is closed, over HTTP/2 the stream is reset), so that the
// producer's context ends and it lets go of what it holds. The deadline
// is cleared after each write: over HTTP/2 an armed deadline resets the
// stream when it fires even while no write is waiting, and the producer
// may be busy between writes (listing a 300,000-entry directory) through
// no fault of the client.
type stallWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
	// off is set when the ResponseWriter has no deadlines (tests'
	// recorders): writes then go straight through.
	off bool
}

func newStallWriter(w http.ResponseWriter, d time.Duration) *stallWriter {
	return &stallWriter{w: w, rc: http.NewResponseController(w), d: d, off: d <= 0}
}

func (s *stallWriter) arm() {
	if s.off {
		return
	}
	if err := s.rc.SetWriteDeadline(time.Now().Add(s.d)); errors.Is(err, http.ErrNotSupported) {
		s.off = true
	}
}

func (s *stallWriter) disarm() {
	if !s.off {
		_ = s.rc.SetWriteDeadline(time.Time{})
	}
}

func (s *stallWriter) Write(p []byte) (int, error) {
	s.arm()
	defer s.disarm()
	return s.w.Write(p)
}

// Flush sends what is buffered under the same deadline: the last bytes of
// a response are as likely to stall as the first.
func (s *stallWriter) Flush() error {
	s.arm()
	defer s.disarm()
	err := s.rc.Flush()
	if errors.Is(err, http.ErrNotSupported) {
		return nil
	}
	return err
}

// stallReader arms a read deadline of d around every read of a request
// body, so that an upload whose client stops sending fails instead of
// holding the extraction that consumes it. As with stallWriter the
// deadline is cleared after each read: the consumer may work long between
// reads (and after the last one) without being cut.
type stallReader struct {
	r   io.Reader
	rc  *http.ResponseController
	d   time.Duration
	off bool
}

func newStallReader(w http.ResponseWriter, r io.Reader, d time.Duration) *stallReader {
	return &stallReader{r: r, rc: http.NewResponseController(w), d: d, off: d <= 0}
}

func (s *stallReader) Read(p []byte) (int, error) {
	if !s.off {
		if err := s.rc.SetReadDeadline(time.Now().Add(s.d)); errors.Is(err, http.ErrNotSupported) {
			s.off = true
		} else {
			defer s.rc.SetReadDeadline(time.Time{})
		}
	}
	return s.r.Read(p)
}

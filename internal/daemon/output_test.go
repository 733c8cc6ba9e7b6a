package daemon

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"
)

// writeAll writes n bytes of pattern to w and closes it.
func writeAll(t *testing.T, w io.WriteCloser, n int) {
	t.Helper()
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	for n > 0 {
		k := min(n, len(chunk))
		if _, err := w.Write(chunk[:k]); err != nil {
			t.Error(err)
			return
		}
		n -= k
	}
	w.Close()
}

func TestCaptureCapsAndKeepsReading(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	const total = 3<<20 + 123
	c := newCapture(1<<20, true, nil)
	col := collect(nil, streamSource{r, c})
	// The writer would block forever on a full pipe if reading stopped at
	// the limit.
	done := make(chan struct{})
	go func() {
		writeAll(t, w, total)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("writer blocked: capture stopped reading")
	}
	col.drain(pipeGrace)
	data, trunc, dropped := c.result()
	if len(data) != 1<<20 || !trunc || dropped != total-(1<<20) {
		t.Fatalf("kept %d truncated %v dropped %d", len(data), trunc, dropped)
	}
	if !bytes.HasPrefix(data, []byte("0123456789abcdef0123")) {
		t.Fatalf("kept the wrong bytes: %q", data[:20])
	}
}

func TestCaptureUnderLimit(t *testing.T) {
	c := newCapture(10, true, nil)
	_ = c.add([]byte("hello"))
	_ = c.add([]byte("world"))
	data, trunc, dropped := c.result()
	if string(data) != "helloworld" || trunc || dropped != 0 {
		t.Fatalf("%q %v %d", data, trunc, dropped)
	}
	c = newCapture(10, true, nil)
	_ = c.add([]byte("helloworld!"))
	data, trunc, dropped = c.result()
	if string(data) != "helloworld" || !trunc || dropped != 1 {
		t.Fatalf("%q %v %d", data, trunc, dropped)
	}
	// Frozen: later bytes are ignored.
	_ = c.add([]byte("more"))
	if data, _, dropped := c.result(); string(data) != "helloworld" || dropped != 1 {
		t.Fatalf("after freeze %q %d", data, dropped)
	}
}

func TestCaptureStreamingStopsSendingAtLimit(t *testing.T) {
	var mu sync.Mutex
	var sent []byte
	c := newCapture(8, false, func(b []byte) error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, b...)
		return nil
	})
	for _, s := range []string{"abc", "defgh", "ijk", "lmn"} {
		if err := c.add([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	data, trunc, dropped := c.result()
	if string(sent) != "abcdefgh" || len(data) != 0 || !trunc || dropped != 6 {
		t.Fatalf("sent %q kept %q trunc %v dropped %d", sent, data, trunc, dropped)
	}
}

func TestCaptureSendFailureKeepsDraining(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("client gone")
	sends := 0
	c := newCapture(1<<20, false, func([]byte) error { sends++; return boom })
	var reported []error
	col := collect(func(err error) { reported = append(reported, err) }, streamSource{r, c})
	writeAll(t, w, 512<<10)
	col.drain(pipeGrace)
	if sends != 1 || len(reported) != 1 || reported[0] != boom {
		t.Fatalf("sends %d reported %v", sends, reported)
	}
	if _, _, dropped := c.result(); dropped != 0 {
		t.Fatalf("dropped %d", dropped)
	}
}

// A background child that inherited stdout keeps the pipe open after the
// process exited: drain must stop reading after the grace.
func TestDrainStopsOnHeldPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := newCapture(1<<20, true, nil)
	col := collect(nil, streamSource{r, c})
	if _, err := w.Write([]byte("partial")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	col.drain(pipeGrace)
	took := time.Since(start)
	if took < pipeGrace-20*time.Millisecond || took > pipeGrace+500*time.Millisecond {
		t.Fatalf("drain took %v", took)
	}
	select {
	case <-col.done:
	default:
		t.Fatal("reader still running")
	}
	if data, _, _ := c.result(); string(data) != "partial" {
		t.Fatalf("kept %q", data)
	}
}

// Data written during the grace is still collected.
func TestDrainCollectsDuringGrace(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c := newCapture(1<<20, true, nil)
	col := collect(nil, streamSource{r, c})
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = w.Write([]byte("late"))
		w.Close()
	}()
	start := time.Now()
	col.drain(pipeGrace)
	if took := time.Since(start); took > pipeGrace {
		t.Fatalf("drain waited the whole grace after EOF: %v", took)
	}
	if data, _, _ := c.result(); string(data) != "late" {
		t.Fatalf("kept %q", data)
	}
}

// A reader without deadlines is closed after the grace.
type blockingReader struct {
	closed chan struct{}
	once   sync.Once
}

func (b *blockingReader) Read([]byte) (int, error) {
	<-b.closed
	return 0, io.EOF
}

func (b *blockingReader) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

func TestDrainClosesReadersWithoutDeadline(t *testing.T) {
	br := &blockingReader{closed: make(chan struct{})}
	c := newCapture(10, true, nil)
	col := collect(nil, streamSource{br, c})
	start := time.Now()
	col.drain(50 * time.Millisecond)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("drain took %v", took)
	}
	select {
	case <-br.closed:
	default:
		t.Fatal("reader not closed")
	}
}

func TestCollectSkipsNilStreams(t *testing.T) {
	var f *os.File
	col := collect(nil, streamSource{nil, newCapture(1, true, nil)}, streamSource{f, newCapture(1, true, nil)})
	select {
	case <-col.done:
	case <-time.After(time.Second):
		t.Fatal("collector of no streams did not finish")
	}
}

// A reader that only gets to run after the grace passed (a starved
// goroutine under load) still takes the output already in the pipe.
func TestDeadlinePassedStillTakesBufferedOutput(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close() // held open: a background child keeps stdout
	if _, err := w.Write([]byte("late output")); err != nil {
		t.Fatal(err)
	}
	if err := r.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	c := newCapture(1<<20, true, nil)
	done := make(chan struct{})
	go func() {
		c.readFrom(r, nil)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("readFrom blocked on a pipe whose writer is still open")
	}
	if got, _, _ := c.result(); string(got) != "late output" {
		t.Fatalf("captured %q, want the buffered output", got)
	}
}

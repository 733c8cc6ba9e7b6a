// Package qmp is a small client of QEMU's machine protocol: JSON objects,
// one per line, on a unix socket (QEMU's -qmp unix:PATH,server=on). QEMU
// greets a client with {"QMP": {...}}, and answers nothing but
// qmp_capabilities until the client sent it; then each {"execute": ...}
// gets one {"return": ...} or {"error": {...}}, in order, with
// asynchronous {"event": ...} objects in between, which this client skips.
//
// digitalocean/go-qemu's qmp package was weighed first: it fits the
// protocol, but its calls take no context and set no deadline (a QEMU that
// stops answering holds the caller, and every later call, forever), and
// the package pulls go-libvirt in for a transport Warren does not use.
// This one is a connection per use with the caller's context as its
// deadline.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// Client is one QMP connection, past the capabilities handshake. QEMU
// serves one client per socket at a time: a second waits until the first
// closes. Not safe for concurrent use.
type Client struct {
	conn net.Conn
	r    *bufio.Reader
}

// Error is an error QEMU answered.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return fmt.Sprintf("qmp: %s: %s", e.Class, e.Desc) }

// maxLine bounds an answer (query-* results are small; a runaway peer
// must not grow the reader without bound).
const maxLine = 4 << 20

// maxEarlyEvents bounds the events Dial skips before the greeting.
const maxEarlyEvents = 64

// Dial connects to the QMP socket at path and negotiates capabilities.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	c := &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	stop := c.arm(ctx)
	defer stop()
	var greeting struct {
		QMP   *json.RawMessage `json:"QMP"`
		Event string           `json:"event"`
	}
	// Events can come before the greeting: a connection that replaces
	// one to the same monitor is accepted before QEMU resets the
	// monitor's negotiated state, and an event in that window goes to it
	// (VSERPORT_CHANGE, seen in CI). They are skipped, a few at most.
	var line []byte
	for skipped := 0; ; skipped++ {
		greeting.QMP, greeting.Event = nil, ""
		if line, err = c.readLine(); err == nil {
			err = json.Unmarshal(line, &greeting)
		}
		if err != nil || greeting.QMP != nil || greeting.Event == "" || skipped == maxEarlyEvents {
			break
		}
	}
	if err == nil && greeting.QMP == nil {
		err = fmt.Errorf("qmp: no greeting: %.200s", line)
	}
	if err == nil {
		err = c.run("qmp_capabilities", nil, nil)
	}
	if err != nil {
		conn.Close()
		return nil, c.ctxErr(ctx, err)
	}
	return c, nil
}

// Run executes cmd with args (nil for none) and decodes its return value
// into out (nil to ignore it).
func (c *Client) Run(ctx context.Context, cmd string, args, out any) error {
	stop := c.arm(ctx)
	defer stop()
	return c.ctxErr(ctx, c.run(cmd, args, out))
}

// Close ends the connection.
func (c *Client) Close() error { return c.conn.Close() }

// arm makes ctx's end the connection's (when ctx is done, so that the
// error is ctx's); the func it returns disarms it.
func (c *Client) arm(ctx context.Context) func() {
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Now()) })
	return func() {
		stop()
		_ = c.conn.SetDeadline(time.Time{})
	}
}

func (c *Client) ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

func (c *Client) run(cmd string, args, out any) error {
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{cmd, args}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		return err
	}
	return c.answer(cmd, out)
}

// answer reads the answer to cmd, skipping events.
func (c *Client) answer(cmd string, out any) error {
	for {
		line, err := c.readLine()
		if err != nil {
			return err
		}
		var resp struct {
			Event  string          `json:"event"`
			Return json.RawMessage `json:"return"`
			Error  *Error          `json:"error"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return fmt.Errorf("qmp: bad answer to %s: %w", cmd, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return resp.Error
		case resp.Return == nil:
			return fmt.Errorf("qmp: answer to %s without a return: %.200s", cmd, line)
		case out != nil:
			return json.Unmarshal(resp.Return, out)
		}
		return nil
	}
}

func (c *Client) readLine() ([]byte, error) {
	var line []byte
	for {
		part, err := c.r.ReadSlice('\n')
		line = append(line, part...)
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
		if len(line) > maxLine {
			return nil, fmt.Errorf("qmp: answer of more than %d bytes", maxLine)
		}
	}
}

// Status is query-status's answer.
type Status struct {
	Running bool   `json:"running"`
	Status  string `json:"status"` // "running", "paused", ...
}

// QueryStatus asks whether the VM runs.
func (c *Client) QueryStatus(ctx context.Context) (Status, error) {
	var st Status
	err := c.Run(ctx, "query-status", nil, &st)
	return st, err
}

// Event is an asynchronous message of QEMU's.
type Event struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

// NextEvent waits for QEMU's next event (a connection that runs no
// command meanwhile: a monitor of its own for events, since QEMU serves
// one client per monitor). The error is ctx's or the connection's end.
func (c *Client) NextEvent(ctx context.Context) (Event, error) {
	stop := c.arm(ctx)
	defer stop()
	for {
		line, err := c.readLine()
		if err != nil {
			return Event{}, c.ctxErr(ctx, err)
		}
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return Event{}, fmt.Errorf("qmp: bad event: %w", err)
		}
		if ev.Event != "" {
			return ev, nil
		}
	}
}

package fullvm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/microvm"
	"github.com/warrenrl/warren/internal/qmp"
)

// VNC is the VM's VNC server: a unix socket on the node.
func (s *sandbox) VNC() string { return filepath.Join(s.dir, VNCSocket) }

func (s *sandbox) qmp(ctx context.Context, cmd string, args any) error {
	c, err := qmp.Dial(ctx, filepath.Join(s.dir, microvm.QMPSocket))
	if err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "fullvm: QMP")
	}
	defer c.Close()
	return c.Run(ctx, cmd, args, nil)
}

// Screenshot is QMP's screendump: QEMU writes the screen as a PPM into
// the VM's directory, read back and removed here.
func (s *sandbox) Screenshot(ctx context.Context) (image.Image, error) {
	f, err := os.CreateTemp(s.dir, "screen-*.ppm")
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "fullvm: screenshot file")
	}
	path := f.Name()
	f.Close()
	defer os.Remove(path)
	if err := s.qmp(ctx, "screendump", map[string]any{"filename": path}); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "fullvm: screendump")
	}
	f, err = os.Open(path)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "fullvm: screenshot file")
	}
	defer f.Close()
	img, err := readPPM(bufio.NewReader(f))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "fullvm: screenshot")
	}
	return img, nil
}

// readPPM decodes a binary PPM (P6, maxval 255), what QEMU's screendump
// writes.
func readPPM(r *bufio.Reader) (image.Image, error) {
	var hdr [4]int // magic (checked apart), width, height, maxval
	magic := make([]byte, 2)
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != "P6" {
		return nil, errors.New("not a binary PPM")
	}
	for i := 1; i < 4; i++ {
		n, err := ppmInt(r)
		if err != nil {
			return nil, err
		}
		hdr[i] = n
	}
	w, h := hdr[1], hdr[2]
	if hdr[3] != 255 || w <= 0 || h <= 0 || w > 1<<14 || h > 1<<14 {
		return nil, fmt.Errorf("PPM %dx%d maxval %d: not one QEMU writes", w, h, hdr[3])
	}
	// One whitespace byte after maxval, read by ppmInt.
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	row := make([]byte, 3*w)
	for y := 0; y < h; y++ {
		if _, err := io.ReadFull(r, row); err != nil {
			return nil, fmt.Errorf("PPM row %d: %w", y, err)
		}
		for x := 0; x < w; x++ {
			img.SetNRGBA(x, y, color.NRGBA{row[3*x], row[3*x+1], row[3*x+2], 0xff})
		}
	}
	return img, nil
}

// ppmInt reads a header number and the one whitespace byte after it,
// skipping whitespace and comments before.
func ppmInt(r *bufio.Reader) (int, error) {
	var digits []byte
	for {
		c, err := r.ReadByte()
		if err != nil {
			return 0, fmt.Errorf("PPM header: %w", err)
		}
		switch {
		case c == '#' && len(digits) == 0:
			if _, err := r.ReadString('\n'); err != nil {
				return 0, fmt.Errorf("PPM header: %w", err)
			}
		case c >= '0' && c <= '9':
			digits = append(digits, c)
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if len(digits) > 0 {
				return strconv.Atoi(string(digits))
			}
		default:
			return 0, fmt.Errorf("PPM header: byte %q", c)
		}
		if len(digits) > 6 {
			return 0, errors.New("PPM header: number too long")
		}
	}
}

// absMax is QEMU's range of an absolute pointer axis (INPUT_EVENT_ABS_MAX).
const absMax = 0x7fff

// SendInput is QMP's input-send-event, the events in order: keys to the PS/2 keyboard, moves (absolute, scaled from the
// screen's pixels) and buttons to the virtio tablet. QEMU refuses an
// unknown key or button: Invalid.
func (s *sandbox) SendInput(ctx context.Context, events []backend.InputEvent) error {
	if len(events) == 0 {
		return nil
	}
	var w, h int
	var qe []map[string]any
	for i, e := range events {
		switch e.Kind {
		case "key":
			if e.Key == "" {
				return errdefs.Invalidf("fullvm: input event %d: a key event names its key", i)
			}
			qe = append(qe, map[string]any{"type": "key", "data": map[string]any{
				"down": e.Down, "key": map[string]any{"type": "qcode", "data": e.Key}}})
		case "button":
			if e.Button == "" {
				return errdefs.Invalidf("fullvm: input event %d: a button event names its button", i)
			}
			qe = append(qe, map[string]any{"type": "btn", "data": map[string]any{"down": e.Down, "button": e.Button}})
		case "move":
			if w == 0 {
				// The screen's size now: a guest may change its mode.
				img, err := s.Screenshot(ctx)
				if err != nil {
					return err
				}
				w, h = img.Bounds().Dx(), img.Bounds().Dy()
			}
			if e.X < 0 || e.Y < 0 || e.X >= w || e.Y >= h {
				return errdefs.Invalidf("fullvm: input event %d: (%d, %d) is off the %dx%d screen", i, e.X, e.Y, w, h)
			}
			qe = append(qe,
				map[string]any{"type": "abs", "data": map[string]any{"axis": "x", "value": scale(e.X, w)}},
				map[string]any{"type": "abs", "data": map[string]any{"axis": "y", "value": scale(e.Y, h)}})
		default:
			return errdefs.Invalidf("fullvm: input event %d: kind %q (key, button or move)", i, e.Kind)
		}
	}
	// The PS/2 keyboard holds 16 bytes of scancodes (a key event is one
	// or two) and drops what comes while it is full, and QEMU queues a
	// whole call's events at once: a call carries at most keyChunk of
	// them, and the next waits for the guest to have read them (a guest
	// under TCG on a loaded node reads them in milliseconds, not at
	// once).
	for len(qe) > 0 {
		n := 0
		for keys := 0; n < len(qe); n++ {
			if qe[n]["type"] == "key" {
				if keys == keyChunk {
					break
				}
				keys++
			}
		}
		err := s.qmp(ctx, "input-send-event", map[string]any{"events": qe[:n]})
		var qerr *qmp.Error
		if errors.As(err, &qerr) && qerr.Class == "GenericError" {
			return errdefs.Wrap(errdefs.Invalid, err, "fullvm: input")
		}
		if err != nil {
			return errdefs.Wrap(errdefs.Unavailable, err, "fullvm: input")
		}
		if qe = qe[n:]; len(qe) > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(keyPause):
			}
		}
	}
	return nil
}

// keyChunk key events fill at most the PS/2 keyboard's 16-byte queue;
// keyPause lets the guest read them before the next.
const (
	keyChunk = 8
	keyPause = 60 * time.Millisecond
)

// scale maps pixel p of n onto the axis's 0..absMax.
func scale(p, n int) int {
	if n <= 1 {
		return 0
	}
	return p * absMax / (n - 1)
}

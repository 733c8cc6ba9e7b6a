package daemon

import (
	"bytes"
	"context"
	"image/png"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Screenshot is a RUNNING sandbox's screen as a PNG (backend.Display).
func (m *Manager) Screenshot(ctx context.Context, req *warrenv1.ScreenshotRequest) (_ *warrenv1.ScreenshotResponse, err error) {
	defer m.observe("Screenshot", &err)
	s, v, err := m.live(ctx, opFiles, req.GetId())
	if err != nil {
		return nil, err
	}
	d, ok := v.sb.(backend.Display)
	if !ok {
		return nil, errdefs.Unsupportedf("backend %s has no display (backend fullvm has one)", v.backend)
	}
	img, err := d.Screenshot(ctx)
	if err != nil {
		return nil, m.explain(opFiles, s, err, "screenshot")
	}
	var buf bytes.Buffer
	// Speed over size: a screen of text compresses well anyway.
	if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, img); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "encode the screenshot")
	}
	r := img.Bounds()
	return &warrenv1.ScreenshotResponse{Png: buf.Bytes(), Width: int32(r.Dx()), Height: int32(r.Dy())}, nil
}

// SendInput sends keyboard and pointer events, then the text's keys, to
// a RUNNING sandbox's display.
func (m *Manager) SendInput(ctx context.Context, req *warrenv1.SendInputRequest) (_ *warrenv1.SendInputResponse, err error) {
	defer m.observe("SendInput", &err)
	var evs []backend.InputEvent
	for i, e := range req.GetEvents() {
		ev := backend.InputEvent{Kind: e.GetKind(), Key: e.GetKey(), Button: e.GetButton(), X: int(e.GetX()), Y: int(e.GetY())}
		if ev.Kind == "move" {
			evs = append(evs, ev)
			continue
		}
		switch e.GetAction() {
		case "", "press":
			ev.Down = true
			up := ev
			up.Down = false
			evs = append(evs, ev, up)
		case "down":
			ev.Down = true
			evs = append(evs, ev)
		case "up":
			evs = append(evs, ev)
		default:
			return nil, errdefs.Invalidf("input event %d: action %q (press, down or up)", i, e.GetAction())
		}
	}
	text, err := backend.TextKeys(req.GetText())
	if err != nil {
		return nil, err
	}
	evs = append(evs, text...)
	if len(evs) == 0 {
		return nil, errdefs.Invalidf("no input events and no text")
	}
	s, v, err := m.live(ctx, opExec, req.GetId())
	if err != nil {
		return nil, err
	}
	d, ok := v.sb.(backend.Display)
	if !ok {
		return nil, errdefs.Unsupportedf("backend %s has no display (backend fullvm has one)", v.backend)
	}
	if err := d.SendInput(ctx, evs); err != nil {
		if errdefs.CategoryOf(err) == errdefs.Invalid {
			return nil, err
		}
		return nil, m.explain(opExec, s, err, "send input")
	}
	return &warrenv1.SendInputResponse{}, nil
}

package client

import (
	"context"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// Screenshot is a RUNNING sandbox's screen as a PNG, with its size
// (sandboxes with a display: backend "fullvm").
func (c *Client) Screenshot(ctx context.Context, sandboxID string) (*warrenv1.ScreenshotResponse, error) {
	return call(ctx, c.sandboxes.Screenshot, &warrenv1.ScreenshotRequest{Id: sandboxID})
}

// SendInput sends keyboard and pointer events, then text's keys, to a
// RUNNING sandbox's display (warrenv1.SendInputEvent says what each
// field means).
func (c *Client) SendInput(ctx context.Context, sandboxID string, events []*warrenv1.SendInputEvent, text string) error {
	_, err := call(ctx, c.sandboxes.SendInput, &warrenv1.SendInputRequest{Id: sandboxID, Events: events, Text: text})
	return err
}

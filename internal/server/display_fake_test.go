package server

import (
	"context"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// The fake's sandboxes have no display.
func (f *fakeManager) Screenshot(context.Context, *warrenv1.ScreenshotRequest) (*warrenv1.ScreenshotResponse, error) {
	return nil, errdefs.Unsupportedf("no display")
}

func (f *fakeManager) SendInput(context.Context, *warrenv1.SendInputRequest) (*warrenv1.SendInputResponse, error) {
	return nil, errdefs.Unsupportedf("no display")
}

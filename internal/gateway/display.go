package gateway

import (
	"context"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
)

// Screenshot and SendInput go to the sandbox's node. (A sandbox's VNC
// socket is its node's: the gateway does not carry it.)
func (g *Gateway) Screenshot(ctx context.Context, req *warrenv1.ScreenshotRequest) (*warrenv1.ScreenshotResponse, error) {
	return bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.ScreenshotRequest, warrenv1.ScreenshotResponse] {
		return c.Screenshot
	})
}

func (g *Gateway) SendInput(ctx context.Context, req *warrenv1.SendInputRequest) (*warrenv1.SendInputResponse, error) {
	return bySandbox(g, ctx, req.GetId(), req, func(c warrenv1connect.SandboxServiceClient) unaryFn[warrenv1.SendInputRequest, warrenv1.SendInputResponse] {
		return c.SendInput
	})
}

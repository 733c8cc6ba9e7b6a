package client

import (
	"context"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// Run runs one job (steps in order in one fresh, isolated environment of
// the image; the backend is "fncall" unless req names another) and
// returns every step's result. A program's failure is a step's Status:
// an error means the request was invalid or Warren failed.
func (c *Client) Run(ctx context.Context, req *warrenv1.RunRequest) (*warrenv1.RunResult, error) {
	return call(ctx, c.sandboxes.Run, req)
}

// RunCommand runs argv as a one-step job of image with default limits.
func (c *Client) RunCommand(ctx context.Context, image string, argv ...string) (*warrenv1.RunStepResult, error) {
	res, err := c.Run(ctx, &warrenv1.RunRequest{Image: image, Steps: []*warrenv1.RunStep{{Argv: argv}}})
	if err != nil {
		return nil, err
	}
	return res.GetSteps()[0], nil
}

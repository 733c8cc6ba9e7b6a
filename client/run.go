package client

import (
	"context"

	"connectrpc.com/connect"

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

// RunBatch runs many jobs of one image at once and calls fn with each
// job's item as it finishes (completion order; Index says which job). An
// item with Error set is a job Warren failed to run; RunBatch returns an
// error only for a failed request or stream, or fn's error (which cancels
// the jobs not yet run).
func (c *Client) RunBatch(ctx context.Context, req *warrenv1.RunBatchRequest, fn func(*warrenv1.RunBatchItem) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.sandboxes.RunBatch(ctx, connect.NewRequest(req))
	if err != nil {
		return wrapErr(err)
	}
	defer st.Close()
	for st.Receive() {
		if err := fn(st.Msg()); err != nil {
			return err
		}
	}
	if err := st.Err(); err != nil {
		return wrapErr(err)
	}
	return nil
}

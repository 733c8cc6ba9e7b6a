package client

import (
	"context"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// BatchCreate makes count sandboxes from template (whose id must be
// empty) in one call: through a gateway they are placed all at once over
// the cluster's nodes. Sandboxes that could not be made are reported in
// the response's errors, not as the call's error.
func (c *Client) BatchCreate(ctx context.Context, template *warrenv1.CreateRequest, count int) (*warrenv1.BatchCreateResponse, error) {
	return call(ctx, c.sandboxes.BatchCreate, &warrenv1.BatchCreateRequest{Template: template, Count: int32(count)})
}

// NodeStatus returns the node's report, or through a gateway every node
// of the cluster as the gateway sees it.
func (c *Client) NodeStatus(ctx context.Context) ([]*warrenv1.NodeStatus, error) {
	res, err := call(ctx, c.system.NodeStatus, &warrenv1.NodeStatusRequest{})
	if err != nil {
		return nil, err
	}
	return res.GetNodes(), nil
}

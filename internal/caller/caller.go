// Package caller carries who made an API call from the server, which
// knows the listener it arrived on, to the daemon, which scopes what the
// call sees and makes. A call through the node's own sockets carries
// nothing: it is the node's operator. A call through a harness sandbox's
// route carries that harness's id (docs/SECURITY.md, "Harness sandboxes").
package caller

import "context"

type harnessKey struct{}

// WithHarness returns ctx of a call made by harness sandbox id.
func WithHarness(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, harnessKey{}, id)
}

// Harness is the harness sandbox that made the call, if one did.
func Harness(ctx context.Context) (id string, ok bool) {
	id, ok = ctx.Value(harnessKey{}).(string)
	return id, ok && id != ""
}

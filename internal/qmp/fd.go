package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// RunWithFile is Run with f passed to QEMU in the same write as the
// command (SCM_RIGHTS), as getfd takes it: QEMU keeps its own copy under
// the name the command gives.
func (c *Client) RunWithFile(ctx context.Context, cmd string, args, out any, f *os.File) error {
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		return errors.New("qmp: passing a file needs a unix socket")
	}
	stop := c.arm(ctx)
	defer stop()
	b, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{cmd, args})
	if err != nil {
		return err
	}
	if _, _, err := uc.WriteMsgUnix(append(b, '\n'), unix.UnixRights(int(f.Fd())), nil); err != nil {
		return c.ctxErr(ctx, err)
	}
	return c.ctxErr(ctx, c.answer(cmd, out))
}

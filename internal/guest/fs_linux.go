package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

// serveFS runs a file call on the sandbox's root with internal/sandboxfs,
// which resolves every path inside it as on the node.
func serveFS(st net.Conn, br *bufio.Reader, c *FSCall, root string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fs := sandboxfs.New(root)
	var res FSResult
	var err error
	// in is the host's data, from 'i' frames to the 'c' frame.
	in := func() io.Reader {
		pr, pw := io.Pipe()
		go func() {
			for {
				kind, data, err := ReadFrame(br)
				if err != nil {
					pw.CloseWithError(err)
					cancel()
					return
				}
				switch kind {
				case KindStdin:
					if _, err := pw.Write(data); err != nil {
						return
					}
				case KindCloseIn:
					pw.Close()
					return
				}
			}
		}()
		return pr
	}
	out := frameWriter{st}
	switch c.Method {
	case "WriteFile":
		err = fs.WriteFile(ctx, c.Path, in(), os.FileMode(c.Mode), c.Append, c.Parents)
	case "TarIn":
		err = fs.TarIn(ctx, c.Path, in())
	case "ReadFile":
		var data []byte
		data, res.Size, res.EOF, err = fs.ReadFile(ctx, c.Path, c.Off, c.Length)
		if err == nil {
			_, err = out.Write(data)
		}
	case "TarOut":
		err = fs.TarOut(ctx, c.Path, out, c.Tar)
	case "List":
		res.Infos, res.Token, err = fs.List(ctx, c.Path, c.PageSize, c.Token)
	case "Stat":
		var fi sandboxfs.FileInfo
		if fi, err = fs.Stat(ctx, c.Path); err == nil {
			res.Info = &fi
		}
	case "Mkdir":
		err = fs.Mkdir(ctx, c.Path, os.FileMode(c.Mode), c.Parents)
	case "Remove":
		err = fs.Remove(ctx, c.Path, c.Recursive)
	default:
		err = errdefs.Invalidf("unknown file method %q", c.Method)
	}
	if err != nil {
		res.Category, res.Error = errdefs.CategoryOf(err).String(), err.Error()
	}
	b, _ := json.Marshal(res)
	_ = WriteFrame(st, KindExit, b)
}

// frameWriter sends what is written as 'o' frames of at most 32 KiB.
type frameWriter struct{ w io.Writer }

func (f frameWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		c := min(len(b), 32<<10)
		if err := WriteFrame(f.w, KindStdout, b[:c]); err != nil {
			return n, err
		}
		n += c
		b = b[c:]
	}
	return n, nil
}

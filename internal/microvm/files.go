package microvm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

// vmFiles serves a VM's file calls through its agent, which runs
// internal/sandboxfs on the sandbox's root inside the guest: the same
// path rules as a container's files on the node.
type vmFiles struct{ v *VM }

var (
	_ backend.Files      = (*sandbox)(nil)
	_ backend.FileSystem = vmFiles{}
)

// Files serves the sandbox's file calls.
func (s *sandbox) Files() backend.FileSystem { return vmFiles{s.vm} }

// fs runs one file call: in (if any) is sent as its data, out (if any)
// receives the data it sends back.
func (f vmFiles) fs(ctx context.Context, c guest.FSCall, in io.Reader, out io.Writer) (guest.FSResult, error) {
	var res guest.FSResult
	st, stop, err := f.v.open(ctx, guest.Request{Op: "fs", FS: &c})
	if err != nil {
		return res, err
	}
	defer st.Close()
	defer stop()
	sendErr := make(chan error, 1)
	if in != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					if werr := guest.WriteFrame(st, guest.KindStdin, buf[:n]); werr != nil {
						sendErr <- werr
						return
					}
				}
				if errors.Is(err, io.EOF) {
					sendErr <- guest.WriteFrame(st, guest.KindCloseIn, nil)
					return
				}
				if err != nil {
					// The reader failed: the call must not see a short
					// file as whole. Ending the stream aborts it.
					_ = st.SetDeadline(time.Now())
					sendErr <- err
					return
				}
			}
		}()
	}
	br := bufio.NewReader(st)
	for {
		kind, data, err := guest.ReadFrame(br)
		if err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			if in != nil {
				select {
				case serr := <-sendErr:
					if serr != nil {
						return res, errdefs.Wrap(errdefs.Invalid, serr, "read the data to send")
					}
				default:
				}
			}
			return res, errdefs.Wrap(errdefs.Unavailable, err, "file call in the VM")
		}
		switch kind {
		case guest.KindStdout:
			if out != nil {
				if _, err := out.Write(data); err != nil {
					return res, err
				}
			}
		case guest.KindExit:
			if err := json.Unmarshal(data, &res); err != nil {
				return res, errdefs.Internalf("guest agent: bad file answer: %v", err)
			}
			if res.Error != "" {
				return res, errdefs.New(categoryNamed(res.Category), "%s", res.Error)
			}
			return res, nil
		case guest.KindFail:
			return res, failure(data, "file call in the VM")
		}
	}
}

// categoryNamed maps an errdefs category's name back; Internal if none.
func categoryNamed(name string) errdefs.Category {
	for _, c := range errdefs.Categories() {
		if c.String() == name {
			return c
		}
	}
	return errdefs.Internal
}

func (f vmFiles) WriteFile(ctx context.Context, p string, r io.Reader, mode os.FileMode, append, mkParents bool) error {
	if r == nil {
		r = bytes.NewReader(nil)
	}
	_, err := f.fs(ctx, guest.FSCall{Method: "WriteFile", Path: p, Mode: uint32(mode), Append: append, Parents: mkParents}, r, nil)
	return err
}

func (f vmFiles) ReadFile(ctx context.Context, p string, off, length int64) ([]byte, int64, bool, error) {
	var buf bytes.Buffer
	res, err := f.fs(ctx, guest.FSCall{Method: "ReadFile", Path: p, Off: off, Length: length}, nil, &buf)
	if err != nil {
		return nil, 0, false, err
	}
	return buf.Bytes(), res.Size, res.EOF, nil
}

func (f vmFiles) List(ctx context.Context, p string, pageSize int, token string) ([]sandboxfs.FileInfo, string, error) {
	res, err := f.fs(ctx, guest.FSCall{Method: "List", Path: p, PageSize: pageSize, Token: token}, nil, nil)
	return res.Infos, res.Token, err
}

func (f vmFiles) Stat(ctx context.Context, p string) (sandboxfs.FileInfo, error) {
	res, err := f.fs(ctx, guest.FSCall{Method: "Stat", Path: p}, nil, nil)
	if err != nil {
		return sandboxfs.FileInfo{}, err
	}
	if res.Info == nil {
		return sandboxfs.FileInfo{}, errdefs.Internalf("guest agent: stat answered no file")
	}
	return *res.Info, nil
}

func (f vmFiles) Mkdir(ctx context.Context, p string, mode os.FileMode, parents bool) error {
	_, err := f.fs(ctx, guest.FSCall{Method: "Mkdir", Path: p, Mode: uint32(mode), Parents: parents}, nil, nil)
	return err
}

func (f vmFiles) Remove(ctx context.Context, p string, recursive bool) error {
	_, err := f.fs(ctx, guest.FSCall{Method: "Remove", Path: p, Recursive: recursive}, nil, nil)
	return err
}

func (f vmFiles) TarOut(ctx context.Context, p string, w io.Writer, o sandboxfs.TarOptions) error {
	_, err := f.fs(ctx, guest.FSCall{Method: "TarOut", Path: p, Tar: o}, nil, w)
	return err
}

func (f vmFiles) TarIn(ctx context.Context, p string, r io.Reader) error {
	_, err := f.fs(ctx, guest.FSCall{Method: "TarIn", Path: p}, r, nil)
	return err
}

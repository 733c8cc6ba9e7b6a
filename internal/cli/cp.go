package cli

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/client"
	"github.com/warrenrl/warren/internal/tarx"
)

var sandboxIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// copyArg is one side of `cp`: a local path, "-", or ID:/path.
type copyArg struct {
	id   string // "" for local
	path string
}

func parseCopyArg(s string) copyArg {
	if id, p, ok := strings.Cut(s, ":"); ok && sandboxIDRe.MatchString(id) {
		if p == "" {
			p = "/"
		}
		return copyArg{id: id, path: p}
	}
	return copyArg{path: s}
}

func newCopyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between the host and a sandbox",
		Long: `Copy a file or directory tree between the host and a sandbox. One of
SRC and DST is ID:/path in a sandbox, the other a local path.

Like cp -r: if DST is an existing directory, SRC is copied into it under its
own name; otherwise SRC is copied to DST (a trailing slash on DST makes it a
directory). A local "-" is a tar stream on stdin or stdout.`,
		Example: `  warren sandbox cp ./src sb1:/work        # -> /work/src (when /work exists)
  warren sandbox cp sb1:/etc/hosts hosts.txt
  warren sandbox cp sb1:/work - | tar t`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseCopyArg(args[0]), parseCopyArg(args[1])
			if (src.id == "") == (dst.id == "") {
				return usagef("exactly one of SRC and DST must be ID:/path in a sandbox")
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			if dst.id != "" {
				return upload(cmd, cl, src.path, dst)
			}
			return download(cmd, cl, src, dst.path)
		},
	}
}

// remoteIsDir reports whether p is a directory in the sandbox, following
// symlinks (StatFile describes a final symlink rather than its target).
func remoteIsDir(ctx context.Context, cl *client.Client, id, p string) (bool, error) {
	for range 16 {
		fi, err := cl.StatFile(ctx, id, p)
		if client.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !fi.IsSymlink {
			return fi.IsDir, nil
		}
		target := fi.LinkTarget
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(path.Clean("/"+p)), target)
		}
		p = target
	}
	return false, nil
}

func upload(cmd *cobra.Command, cl *client.Client, src string, dst copyArg) error {
	ctx := cmd.Context()
	if src == "-" {
		return cl.Upload(ctx, dst.id, dst.path, cmd.InOrStdin())
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return err
	}
	dstIsDir, err := remoteIsDir(ctx, cl, dst.id, dst.path)
	if err != nil {
		return err
	}
	if strings.HasSuffix(dst.path, "/") {
		dstIsDir = true
	}
	pr, pw := io.Pipe()
	var target string
	if fi.IsDir() {
		target = dst.path
		if dstIsDir {
			target = path.Join(dst.path, filepath.Base(abs))
		}
		go func() { pw.CloseWithError(tarx.Create(ctx, "/", pw, abs)) }()
	} else {
		name := filepath.Base(abs)
		target = dst.path
		if !dstIsDir {
			target, name = path.Dir(dst.path), path.Base(dst.path)
		}
		go func() { pw.CloseWithError(tarFile(pw, abs, fi, name)) }()
	}
	err = cl.Upload(ctx, dst.id, target, pr)
	pr.CloseWithError(errors.New("upload ended"))
	return err
}

// tarFile writes a tar stream holding the one file at p under name.
func tarFile(w io.Writer, p string, fi fs.FileInfo, name string) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file or directory", p)
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	hdr, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return err
	}
	hdr.Name, hdr.Uname, hdr.Gname = name, "", ""
	hdr.Format = tar.FormatPAX
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	return tw.Close()
}

func download(cmd *cobra.Command, cl *client.Client, src copyArg, dst string) error {
	ctx := cmd.Context()
	rc, err := cl.Download(ctx, src.id, src.path)
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		_, err := io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	br := bufio.NewReaderSize(rc, 128<<10)
	head, _ := br.Peek(64 << 10)
	first, err := tar.NewReader(bytes.NewReader(head)).Next()
	if err != nil {
		return fmt.Errorf("reading archive of %s:%s: %w", src.id, src.path, err)
	}
	dstFi, statErr := os.Stat(dst)
	dstIsDir := statErr == nil && dstFi.IsDir()
	opts := tarx.Options{SkipDevices: true, MaxFiles: -1}

	if first.Typeflag == tar.TypeDir && (first.Name == "./" || first.Name == ".") {
		target := dst
		if dstIsDir {
			target = filepath.Join(dst, path.Base(path.Clean("/"+src.path)))
		}
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		_, err := tarx.Extract(ctx, target, br, opts)
		return err
	}
	if dstIsDir || strings.HasSuffix(dst, "/") {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		_, err := tarx.Extract(ctx, dst, br, opts)
		return err
	}
	return extractOneFile(br, dst)
}

// extractOneFile writes the single regular file of a tar stream to dst.
func extractOneFile(r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeReg {
		return fmt.Errorf("%s is not a regular file or directory", hdr.Name)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fs.FileMode(hdr.Mode).Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, tr); err != nil {
		f.Close()
		return fmt.Errorf("download: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if _, err := tr.Next(); err != io.EOF {
		if err == nil {
			err = errors.New("unexpected extra entry")
		}
		return fmt.Errorf("download: %w", err)
	}
	_ = os.Chtimes(dst, hdr.ModTime, hdr.ModTime)
	return nil
}

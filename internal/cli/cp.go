package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/client"
	"github.com/warrenrl/warren/internal/tarx"
	"github.com/warrenrl/warren/internal/untrusted"
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
	var (
		maxBytes   string
		maxEntries int64
		preserve   bool
		linksAsIs  bool
		xattrs     []string
	)
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between the host and a sandbox",
		Long: `Copy a file or directory tree between the host and a sandbox. One of
SRC and DST is ID:/path in a sandbox, the other a local path.

Like cp -r: if DST is an existing directory, SRC is copied into it under its
own name; otherwise SRC is copied to DST (a trailing slash on DST makes it a
directory). A local "-" is a tar stream on stdin or stdout.

A copy out of a sandbox treats the tree as hostile (its agent wrote it):
symlinks are recreated as links and never followed, neither while copying
nor in DST (a DST with a symlink in it is refused: pass $(realpath DST)),
and a symlink whose target could lead outside DST (absolute, or climbing
above it) fails the copy unless --symlinks-as-is; hard links only to files
of the same copy; no owners, ACLs or xattrs (--xattr to allow a prefix);
permission bits masked with 0755 (--preserve keeps them, setuid included);
devices and FIFOs skipped; holes kept as holes. At most 1Gi of file contents (--max-bytes) and 1,000,000 entries
(--max-entries); over either, the copy fails and what it wrote is removed.
What was skipped or stripped is reported on stderr.`,
		Example: `  warren sandbox cp ./src sb1:/work        # -> /work/src (when /work exists)
  warren sandbox cp sb1:/etc/hosts hosts.txt
  warren sandbox cp --max-bytes 8Gi sb1:/out ./results
  warren sandbox cp sb1:/work - | tar t`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseCopyArg(args[0]), parseCopyArg(args[1])
			if (src.id == "") == (dst.id == "") {
				return usagef("exactly one of SRC and DST must be ID:/path in a sandbox")
			}
			opts, err := downloadOptions(maxBytes, maxEntries, xattrs)
			if err != nil {
				return err
			}
			opts.Preserve, opts.SymlinksAsIs = preserve, linksAsIs
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			if dst.id != "" {
				return upload(cmd, cl, src.path, dst)
			}
			return download(cmd, cl, src, dst.path, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&maxBytes, "max-bytes", "1Gi", "copying out: limit on the total size of the files written (e.g. 8Gi; 0 = no limit)")
	f.Int64Var(&maxEntries, "max-entries", untrusted.DefaultMaxEntries, "copying out: limit on the number of files, directories and links (0 = no limit)")
	f.BoolVar(&preserve, "preserve", false, "copying out: keep the sandbox's permission bits (setuid, setgid, sticky, group/other write) instead of masking with 0755")
	f.BoolVar(&linksAsIs, "symlinks-as-is", false, "copying out: keep symlinks whose target leads outside DST (absolute, or climbing above it) instead of failing; they are still never followed by cp, but opening files of the copy follows them")
	f.StringArrayVar(&xattrs, "xattr", nil, "copying out: restore extended attributes whose name starts with `PREFIX` (repeatable, e.g. user.)")
	return cmd
}

// downloadOptions turns the flags into client options; on the command
// line 0 means no limit.
func downloadOptions(maxBytes string, maxEntries int64, xattrs []string) (*client.DownloadOptions, error) {
	n, err := parseBytes(maxBytes)
	if err != nil {
		return nil, usageError{fmt.Errorf("--max-bytes: %w", err)}
	}
	if maxEntries < 0 {
		return nil, usagef("--max-entries must not be negative")
	}
	o := &client.DownloadOptions{MaxBytes: n, MaxEntries: maxEntries, XattrAllow: xattrs}
	if o.MaxBytes == 0 {
		o.MaxBytes = -1
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = -1
	}
	return o, nil
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
		// Sparse: a file's holes stay holes on the wire; the daemon's
		// extraction keeps them holes in the sandbox.
		go func() { pw.CloseWithError(tarx.CreateWith(ctx, "/", pw, abs, tarx.CreateOptions{Sparse: true})) }()
	} else {
		name := filepath.Base(abs)
		target = dst.path
		if !dstIsDir {
			target, name = path.Dir(dst.path), path.Base(dst.path)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file or directory", abs)
		}
		go func() {
			pw.CloseWithError(tarx.CreateWith(ctx, "/", pw, abs, tarx.CreateOptions{Sparse: true, Name: name}))
		}()
	}
	err = cl.Upload(ctx, dst.id, target, pr)
	pr.CloseWithError(errors.New("upload ended"))
	return err
}

func download(cmd *cobra.Command, cl *client.Client, src copyArg, dst string, opts *client.DownloadOptions) error {
	ctx := cmd.Context()
	if dst == "-" {
		rc, err := cl.Download(ctx, src.id, src.path)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	st, err := cl.DownloadTo(ctx, src.id, src.path, dst, opts)
	if err != nil {
		return err
	}
	if w := skippedWarning(st); w != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), "warren: "+w)
	}
	return nil
}

// skippedWarning says in one line what the copy did not carry over.
func skippedWarning(st *client.DownloadStats) string {
	var parts []string
	if st.Skipped > 0 {
		parts = append(parts, fmt.Sprintf("skipped %d device nodes/FIFOs", st.Skipped))
	}
	if st.SpecialBits > 0 {
		parts = append(parts, fmt.Sprintf("stripped setuid/setgid/sticky bits from %d entries", st.SpecialBits))
	}
	if n := st.ModesMasked - st.SpecialBits; n > 0 {
		parts = append(parts, fmt.Sprintf("masked group/other write on %d entries", n))
	}
	if st.XattrsDropped > 0 {
		parts = append(parts, fmt.Sprintf("dropped %d xattrs/ACLs", st.XattrsDropped))
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, ", ") + " (see --preserve, --xattr)"
}

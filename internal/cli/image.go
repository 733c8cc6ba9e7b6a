package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/oci"
	"github.com/warrenrl/warren/internal/tarx"
)

func newImageCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "image",
		Aliases: []string{"images", "img"},
		Short:   "Manage images",
		Args:    groupArgs,
		RunE:    groupRun,
	}
	c.AddCommand(newImageListCommand(), newImageImportCommand(), newImageRemoveCommand(), newImageBuildCommand(),
		newImageStatsCommand(), newImageVerifyCommand())
	return c
}

func newImageListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			imgs, err := cl.ListImages(cmd.Context())
			if err != nil {
				return err
			}
			slices.SortFunc(imgs, func(a, b *warrenv1.Image) int { return strings.Compare(a.Name, b.Name) })
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), &warrenv1.ListImagesResponse{Images: imgs})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tID\tSIZE\tLAYERS\tCREATED")
			now := time.Now()
			for _, im := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s ago\n", im.Name, image.ShortDigest(im.Id), formatBytes(im.SizeBytes), len(im.Layers), formatAge(im.CreatedAtUnixMs, now))
			}
			return tw.Flush()
		},
	}
}

func newImageImportCommand() *cobra.Command {
	var forceUpload bool
	var name, platform string
	c := &cobra.Command{
		Use:   "import REF | NAME PATH|REF",
		Short: "Import an OCI image, or a root filesystem directory or tarball",
		Long: `Import an image.

  warren image import REF [--name NAME]     an OCI/Docker image
  warren image import NAME REF
  warren image import NAME PATH             a root filesystem directory or tarball

REF is one of
  registry/repo:tag, registry/repo@sha256:..., docker://...   from a registry
                                    (credentials from the Docker config)
  oci:DIR[:TAG]                     an OCI image layout directory
  docker-archive:FILE.tar[:REPO:TAG]   a 'docker save' tarball
and is imported by the daemon with progress bars for download and
conversion. Each layer is converted once (by diffID) to an EROFS blob;
layers already stored are not downloaded again. The default NAME is the
reference's repository and tag ("python:3.12"). Registry credentials are
the daemon's (its Docker config); oci: and docker-archive: paths are read
by the daemon, on its host.

PATH is a root filesystem directory or tarball (optionally
gzip-compressed). On a local daemon (unix socket) the daemon reads PATH
itself; on a remote one, or with --upload, the client uploads it. PATH "-"
uploads a tarball read from stdin.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("%s takes REF or NAME PATH|REF, got %d argument(s)", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if !oci.IsRef(args[0]) {
					return usagef("%q is not an image reference (to import a root filesystem: import NAME PATH)", args[0])
				}
				return importOCI(cmd, args[0], name, platform)
			}
			if oci.IsRef(args[1]) {
				if name != "" && name != args[0] {
					return usagef("NAME given twice: %q and --name %q", args[0], name)
				}
				return importOCI(cmd, args[1], args[0], platform)
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			img, err := importPath(cmd.Context(), cl, args[0], args[1], cmd.InOrStdin(), forceUpload)
			if err != nil {
				return err
			}
			return printImage(cmd, img)
		},
	}
	c.Flags().BoolVar(&forceUpload, "upload", false, "upload PATH even to a local daemon")
	c.Flags().StringVar(&name, "name", "", "image name for an OCI import (default: from the reference)")
	c.Flags().StringVar(&platform, "platform", "", "platform of a multi-platform image (default linux/<the daemon's arch>)")
	return c
}

func printImage(cmd *cobra.Command, img *warrenv1.Image) error {
	if JSONOutput(cmd) {
		return printJSON(cmd.OutOrStdout(), img)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s\n", img.Name, img.Id, formatBytes(img.SizeBytes))
	return nil
}

// importPath imports the directory or tarball p as image name, by path on
// a local daemon and by upload otherwise.
func importPath(ctx context.Context, cl *client.Client, name, p string, stdin io.Reader, forceUpload bool) (*warrenv1.Image, error) {
	return sendTree(ctx, cl, p, stdin, forceUpload,
		func(abs string) (*warrenv1.Image, error) { return cl.ImportImage(ctx, name, abs) },
		func(r io.Reader) (*warrenv1.Image, error) { return cl.ImportImageTar(ctx, name, r) })
}

// sendTree hands the directory or tarball p ("-": a tarball read from
// stdin) to the daemon: byPath gives it the absolute path on a local daemon
// (unless forceUpload); byTar uploads the tarball, or the tar stream of the
// directory, otherwise.
func sendTree[T any](ctx context.Context, cl *client.Client, p string, stdin io.Reader, forceUpload bool,
	byPath func(abs string) (T, error), byTar func(r io.Reader) (T, error)) (T, error) {
	var zero T
	if p == "-" {
		return byTar(stdin)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return zero, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return zero, err
	}
	if cl.IsUnix() && !forceUpload {
		return byPath(abs)
	}
	if !fi.IsDir() {
		f, err := os.Open(abs)
		if err != nil {
			return zero, err
		}
		defer f.Close()
		return byTar(f)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarx.Create(ctx, "/", pw, abs)) }()
	defer pr.Close()
	return byTar(pr)
}

func newImageRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove images",
		Args:    minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			return removeEach(cmd, args, cl.RemoveImage)
		},
	}
}

// removeEach removes each of names in turn, printing each removed name;
// it reports every failure and fails if any did.
func removeEach(cmd *cobra.Command, names []string, remove func(ctx context.Context, name string) error) error {
	failed := false
	for _, name := range names {
		if err := remove(cmd.Context(), name); err != nil {
			printError(cmd.ErrOrStderr(), err)
			failed = true
			continue
		}
		fmt.Fprintln(cmd.OutOrStdout(), name)
	}
	if failed {
		return exitError{1}
	}
	return nil
}

func newImageBuildCommand() *cobra.Command {
	var tmpDir string
	var forceUpload bool
	c := &cobra.Command{
		Use:   "build busybox|debian NAME",
		Short: "Build a stock image on this host and import it",
		Long: `Build a root filesystem on this host (as root) and import it as image NAME.

  busybox  a minimal image from the host's static busybox (apt-get install busybox-static)
  debian   Debian bookworm (minbase) with python3 and git, via debootstrap; takes minutes`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name := args[0], args[1]
			var build func(ctx context.Context, dst string) error
			switch kind {
			case "busybox":
				build = image.BuildBusybox
			case "debian":
				build = func(ctx context.Context, dst string) error {
					return image.BuildDebian(ctx, dst, cmd.ErrOrStderr())
				}
			default:
				return usagef("unknown image kind %q: want busybox or debian", kind)
			}
			if err := image.ValidName(name); err != nil {
				return err
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			parent, err := os.MkdirTemp(tmpDir, "warren-build-")
			if err != nil {
				return err
			}
			// The daemon reads the tree by path: it must be able to enter
			// the directory.
			if err := os.Chmod(parent, 0o755); err != nil {
				return err
			}
			defer os.RemoveAll(parent)
			dst := filepath.Join(parent, "rootfs")
			fmt.Fprintf(cmd.ErrOrStderr(), "building %s image in %s\n", kind, dst)
			if err := build(cmd.Context(), dst); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "importing as %s\n", name)
			img, err := importPath(cmd.Context(), cl, name, dst, nil, forceUpload)
			if err != nil {
				return err
			}
			return printImage(cmd, img)
		},
	}
	c.Flags().StringVar(&tmpDir, "tmp-dir", "", "where to build the root filesystem (default $TMPDIR or /tmp)")
	c.Flags().BoolVar(&forceUpload, "upload", false, "upload the tree even to a local daemon")
	return c
}

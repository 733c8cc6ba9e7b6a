package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/oci"
)

func init() { AddCommand(newLayerCommand()) }

func newLayerCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "layer",
		Aliases: []string{"layers"},
		Short:   "Manage named layers (workspaces, toolkits) stacked on images",
		Long: `Named layers are single read-only layers that sandboxes stack on top of
their image, later --layer flags higher:

  warren sandbox create --image python:3.12 --layer ws-django-1234 --layer toolkit-swe

They live in their own namespace (not listed by 'warren image ls'). A file
named .wh.NAME in a layer hides NAME of the layers below, and .wh..wh..opq
hides a whole directory of the layers below (OCI whiteouts). 'warren
sandbox commit' makes a layer of what a sandbox changed.`,
		Args: groupArgs,
		RunE: groupRun,
	}
	c.AddCommand(newLayerBuildCommand(), newLayerListCommand(), newLayerRemoveCommand())
	return c
}

func newLayerBuildCommand() *cobra.Command {
	var forceUpload bool
	c := &cobra.Command{
		Use:   "build NAME DIR|TAR|-",
		Short: "Make a directory tree or tarball (plain or gzip; - for stdin) a named layer",
		Long: `Make a directory tree or tarball (plain or gzip-compressed) the named layer
NAME, replacing a layer of that name. On a local daemon (unix socket) the
daemon reads DIR or TAR itself; on a remote one, or with --upload, the
client uploads it. "-" uploads a tarball read from stdin.`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, src := args[0], args[1]
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			start := time.Now()
			l, err := buildLayer(cmd.Context(), cl, name, src, cmd.InOrStdin(), forceUpload)
			if err != nil {
				return err
			}
			return printLayer(cmd, l, start)
		},
	}
	c.Flags().BoolVar(&forceUpload, "upload", false, "upload DIR or TAR even to a local daemon")
	return c
}

// printLayer prints a layer built or committed since start.
func printLayer(cmd *cobra.Command, l *warrenv1.Layer, start time.Time) error {
	if JSONOutput(cmd) {
		return printJSON(cmd.OutOrStdout(), l)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s %d files (%s)\n", l.Name, image.ShortDigest(l.Digest), formatBytes(l.BlobSizeBytes), l.Files, time.Since(start).Round(time.Millisecond))
	return nil
}

// buildLayer builds the directory or tarball p as layer name, by path on a
// local daemon and by upload otherwise.
func buildLayer(ctx context.Context, cl *client.Client, name, p string, stdin io.Reader, forceUpload bool) (*warrenv1.Layer, error) {
	return sendTree(ctx, cl, p, stdin, forceUpload,
		func(abs string) (*warrenv1.Layer, error) { return cl.BuildLayer(ctx, name, abs) },
		func(r io.Reader) (*warrenv1.Layer, error) { return cl.BuildLayerTar(ctx, name, r) })
}

func newLayerListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List named layers",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			ls, err := cl.ListLayers(cmd.Context())
			if err != nil {
				return err
			}
			slices.SortFunc(ls, func(a, b *warrenv1.Layer) int { return strings.Compare(a.Name, b.Name) })
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), &warrenv1.ListLayersResponse{Layers: ls})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tFILES\tCREATED")
			now := time.Now()
			for _, l := range ls {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s ago\n", l.Name, image.ShortDigest(l.Digest), formatBytes(l.BlobSizeBytes), l.Files, formatAge(l.CreatedAtUnixMs, now))
			}
			return tw.Flush()
		},
	}
}

func newLayerRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove named layers (refused while a sandbox uses one)",
		Args:    minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			return removeEach(cmd, args, cl.RemoveLayer)
		},
	}
}

// --- warren image import REF ---

// importOCI has the daemon import ref, with progress on stderr.
func importOCI(cmd *cobra.Command, ref, name, platform string) error {
	ref = absRef(ref)
	cl, err := NewClient(cmd)
	if err != nil {
		return err
	}
	defer cl.Close()
	pr := newProgress(cmd.ErrOrStderr())
	start := time.Now()
	img, err := cl.PullImage(cmd.Context(), &warrenv1.PullImageRequest{Ref: ref, Name: name, Platform: platform}, func(e *warrenv1.PullImageEvent) error {
		pr.event(oci.Event{
			Phase: e.Phase, Layer: int(e.Layer), Layers: int(e.Layers), Digest: e.Digest,
			Status: e.Status, Current: e.Current, Total: e.Total, Message: e.Message,
		})
		return nil
	})
	pr.finish()
	if err != nil {
		return err
	}
	if JSONOutput(cmd) {
		return printJSON(cmd.OutOrStdout(), img)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s %d layers (%s)\n", img.Name, img.Id, formatBytes(img.SizeBytes), len(img.Layers), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// absRef makes the path of an oci: or docker-archive: reference absolute:
// the daemon reads it, from its own working directory.
func absRef(ref string) string {
	r, err := oci.ParseRef(ref)
	if err != nil || r.Kind == oci.KindRegistry || filepath.IsAbs(r.Location) {
		return ref
	}
	abs, err := filepath.Abs(r.Location)
	if err != nil {
		return ref
	}
	r.Location = abs
	return r.String()
}

// progress draws one bar per layer: redrawn in place on a terminal, one
// line per state change otherwise.
type progress struct {
	w      io.Writer
	tty    bool
	mu     sync.Mutex
	layers []oci.Event
	drawn  int
	last   time.Time
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			p.tty = true
		}
	}
	return p
}

func (p *progress) event(e oci.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch e.Phase {
	case "resolve", "record":
		if p.tty {
			p.clear()
		}
		fmt.Fprintln(p.w, e.Message)
		p.drawn = 0
		return
	case "layer":
	default:
		return // "done": the caller prints the image
	}
	for len(p.layers) < e.Layers {
		p.layers = append(p.layers, oci.Event{Layer: len(p.layers), Status: "waiting"})
	}
	if e.Layer < 0 || e.Layer >= len(p.layers) {
		return
	}
	prev := p.layers[e.Layer].Status
	p.layers[e.Layer] = e
	if !p.tty {
		if prev != e.Status && e.Status != "waiting" {
			fmt.Fprintln(p.w, p.line(e))
		}
		return
	}
	if prev == e.Status && time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.redraw()
}

func (p *progress) clear() {
	if p.drawn > 0 {
		fmt.Fprintf(p.w, "\x1b[%dA\x1b[J", p.drawn)
	}
}

func (p *progress) redraw() {
	p.clear()
	for _, e := range p.layers {
		fmt.Fprintln(p.w, p.line(e))
	}
	p.drawn = len(p.layers)
	p.last = time.Now()
}

func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && len(p.layers) > 0 {
		p.redraw()
	}
}

func (p *progress) line(e oci.Event) string {
	id := image.ShortDigest(e.Digest)
	if id == "" {
		id = fmt.Sprintf("layer %d", e.Layer+1)
	}
	status := e.Status
	switch e.Status {
	case "downloading", "converting":
		return fmt.Sprintf("%-12s %-11s %s", id, status, bar(e.Current, e.Total))
	case "done":
		return fmt.Sprintf("%-12s %-11s %s", id, "done", formatBytes(e.Total))
	case "exists":
		return fmt.Sprintf("%-12s %-11s", id, "already stored")
	}
	return fmt.Sprintf("%-12s %s", id, status)
}

func bar(cur, total int64) string {
	const width = 30
	if total <= 0 {
		return formatBytes(cur)
	}
	frac := float64(cur) / float64(total)
	if frac > 1 {
		frac = 1
	}
	n := int(frac * width)
	return fmt.Sprintf("[%s%s] %s/%s %3.0f%%", strings.Repeat("=", n), strings.Repeat(" ", width-n), formatBytes(cur), formatBytes(total), frac*100)
}

// --- warren image stats / verify ---

func newImageStatsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "stats [NAME...]",
		Short: "Show how much of each layer was read into the daemon node's page cache",
		Long: `For every layer of the named images (named layers as layer:NAME; default:
all images and named layers), show the bytes of its EROFS blob whose
content is in the daemon node's page cache against its size: with
on-demand loading, what sandboxes read. A block counts once, whether it is
cached in the blob file itself (BLOB: metadata, and everything when the
mount reads through the page cache) or in the files of the mounted layer
(FILES: file contents; the only copy when the mount uses direct I/O).
REFS is how many sandboxes of the node use the layer's mount; IO is how
the mount reads the blob (direct or buffered) and its readahead window.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			st, err := cl.ImageStats(cmd.Context(), args...)
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), &warrenv1.ImageStatsResponse{Layers: st})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "IMAGE\tLAYER\tFORMAT\tRESIDENT\tSIZE\tREAD\tBLOB\tFILES\tMOUNTED\tREFS\tIO")
			slices.SortStableFunc(st, func(a, b *warrenv1.LayerStat) int { return strings.Compare(a.Owner, b.Owner) })
			for _, r := range st {
				pct := "-"
				if r.Format == "erofs" && r.Size > 0 {
					pct = fmt.Sprintf("%.1f%%", 100*float64(r.Resident)/float64(r.Size))
				}
				mounted, io := "no", "-"
				if r.Mounted {
					mounted, io = "yes", "buffered"
					if r.DirectIo {
						io = "direct"
					}
					if r.ReadAheadKb > 0 {
						io += fmt.Sprintf(" ra=%dk", r.ReadAheadKb)
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Owner, image.ShortDigest(r.Digest), r.Format, formatBytes(r.Resident), formatBytes(r.Size), pct,
					formatBytes(r.BlobResident), formatBytes(r.FilesResident), mounted, r.Refs, io)
			}
			return tw.Flush()
		},
	}
}

func newImageVerifyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "verify [NAME...]",
		Short: "Check the digests of stored layer blobs (default: all)",
		Long: `Hash the stored layer blobs of the named images (named layers as
layer:NAME; default: every stored blob) and compare them with their
digests. Exits 1 if any is corrupt (remove the images that use it and
import them again).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			vs, err := cl.VerifyImage(cmd.Context(), args...)
			if err != nil {
				return err
			}
			bad := 0
			for _, v := range vs {
				if !v.Ok {
					bad++
				}
			}
			if JSONOutput(cmd) {
				if err := printJSON(cmd.OutOrStdout(), &warrenv1.VerifyImageResponse{Layers: vs}); err != nil {
					return err
				}
			} else {
				for _, v := range vs {
					owner := ""
					if v.Owner != "" {
						owner = " (" + v.Owner + ")"
					}
					if v.Ok {
						fmt.Fprintf(cmd.OutOrStdout(), "%s%s ok\n", v.Digest, owner)
					} else {
						fmt.Fprintf(cmd.ErrOrStderr(), "error: %s%s: %s\n", v.Digest, owner, v.Error)
					}
				}
			}
			if bad > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%d of %d layers are corrupt\n", bad, len(vs))
				return exitError{1}
			}
			return nil
		},
	}
}

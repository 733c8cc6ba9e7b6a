package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/daemon"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/oci"
)

// Until the daemon serves OCI imports, named layers and layer statistics
// (proposed: ImportImage streaming RPC, BuildLayer/ListLayers/RemoveLayer,
// ImageStats), these commands work on the image
// store directly: on the daemon's host, as root, with --image-store naming
// the daemon's store (the store is safe for several processes: blobs and
// records are published atomically, and this process never collects
// anything nor mounts anything).

func init() { AddCommand(newLayerCommand()) }

const imageStoreFlag = "image-store"

func addImageStoreFlag(c *cobra.Command) {
	c.Flags().String(imageStoreFlag, filepath.Join(daemon.DefaultStateDir, "images"), "the daemon's image store directory (this command works on it directly)")
}

// openLocalStore opens the daemon's store for imports and records.
func openLocalStore(cmd *cobra.Command) (*image.Store, error) {
	root, _ := cmd.Flags().GetString(imageStoreFlag)
	if root == "" {
		return nil, usagef("--%s is empty", imageStoreFlag)
	}
	if _, err := os.Stat(root); err != nil {
		return nil, errdefs.New(errdefs.NotFound, "image store %s: %w (give the daemon's store with --%s)", root, err, imageStoreFlag)
	}
	host, _ := os.Hostname()
	return image.OpenStore(image.Options{Root: root, NoMounts: true, NodeID: fmt.Sprintf("%s-cli-%d", host, os.Getpid())})
}

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
hides a whole directory of the layers below (OCI whiteouts).`,
		Args: groupArgs,
		RunE: groupRun,
	}
	c.AddCommand(newLayerBuildCommand(), newLayerListCommand(), newLayerRemoveCommand())
	return c
}

func newLayerBuildCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "build NAME DIR|TAR|-",
		Short: "Make a directory tree or tarball (plain or gzip; - for stdin) a named layer",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, src := args[0], args[1]
			s, err := openLocalStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			var nl image.NamedLayer
			start := time.Now()
			switch fi, serr := os.Stat(src); {
			case src == "-":
				nl, err = s.BuildLayerTar(cmd.Context(), name, cmd.InOrStdin())
			case serr != nil:
				return errdefs.New(errdefs.NotFound, "%s: %w", src, serr)
			case fi.IsDir():
				nl, err = s.BuildLayerDir(cmd.Context(), name, src)
			default:
				f, oerr := os.Open(src)
				if oerr != nil {
					return oerr
				}
				defer f.Close()
				nl, err = s.BuildLayerTar(cmd.Context(), name, f)
			}
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printPlainJSON(cmd.OutOrStdout(), nl)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s %d files (%s)\n", nl.Name, shortID(nl.Digest), formatBytes(nl.BlobSize), nl.Files, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	addImageStoreFlag(c)
	return c
}

func newLayerListCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List named layers",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := openLocalStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			ls, err := s.ListLayers()
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printPlainJSON(cmd.OutOrStdout(), map[string]any{"layers": ls})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tFILES\tCREATED")
			now := time.Now()
			for _, l := range ls {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s ago\n", l.Name, shortID(l.Digest), formatBytes(l.BlobSize), l.Files, formatAge(l.CreatedAt.UnixMilli(), now))
			}
			return tw.Flush()
		},
	}
	addImageStoreFlag(c)
	return c
}

func newLayerRemoveCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove named layers (refused while a sandbox of any node uses one)",
		Args:    minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := openLocalStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			inUse, err := leasedDigests(s.Root())
			if err != nil {
				return err
			}
			failed := false
			for _, n := range args {
				nl, err := s.GetLayer(n)
				if err == nil && inUse[nl.Digest] != "" {
					err = errdefs.Conflictf("layer %s is used by a sandbox on node %s", n, inUse[nl.Digest])
				}
				if err == nil {
					err = s.RemoveLayer(n)
				}
				if err != nil {
					printError(cmd.ErrOrStderr(), err)
					failed = true
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), n)
			}
			if failed {
				return exitError{1}
			}
			return nil
		},
	}
	addImageStoreFlag(c)
	return c
}

// leasedDigests reads the nodes' leases: digest -> a node using it.
func leasedDigests(root string) (map[string]string, error) {
	out := map[string]string{}
	ents, err := os.ReadDir(filepath.Join(root, "leases"))
	if err != nil {
		if os.IsNotExist(err) {
			return out, nil
		}
		return nil, err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		var l struct {
			Node    string    `json:"node"`
			Updated time.Time `json:"updated"`
			Digests []string  `json:"digests"`
		}
		data, err := os.ReadFile(filepath.Join(root, "leases", e.Name()))
		if err != nil || json.Unmarshal(data, &l) != nil || time.Since(l.Updated) > image.DefaultLeaseTTL {
			continue
		}
		for _, d := range l.Digests {
			out[d] = l.Node
		}
	}
	return out, nil
}

func printPlainJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// --- warren image import REF ---

// importOCI imports ref into the local store with progress on stderr.
func importOCI(cmd *cobra.Command, ref, name, platform string) error {
	s, err := openLocalStore(cmd)
	if err != nil {
		return err
	}
	defer s.Close()
	pr := newProgress(cmd.ErrOrStderr())
	start := time.Now()
	img, err := oci.Import(cmd.Context(), s, ref, oci.Options{Name: name, Platform: platform, Progress: pr.event})
	pr.finish()
	if err != nil {
		return err
	}
	if JSONOutput(cmd) {
		return printPlainJSON(cmd.OutOrStdout(), img)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s %d layers (%s)\n", img.Name, img.ID, formatBytes(img.SizeBytes), len(img.Layers), time.Since(start).Round(100*time.Millisecond))
	return nil
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
	id := shortID(e.Digest)
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
	c := &cobra.Command{
		Use:   "stats [NAME...]",
		Short: "Show how much of each layer was read into this node's page cache",
		Long: `For every layer of the named images (default: all images and named
layers), show the bytes of its EROFS blob that are in this node's page cache
(mincore) against its size: with on-demand loading, what sandboxes read.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := openLocalStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			type row struct {
				Owner string `json:"owner"`
				image.LayerStat
			}
			var rows []row
			add := func(owner string, digests []string) error {
				st, err := s.Stats(digests)
				if err != nil {
					return fmt.Errorf("%s: %w", owner, err)
				}
				for _, x := range st {
					rows = append(rows, row{Owner: owner, LayerStat: x})
				}
				return nil
			}
			if len(args) == 0 {
				imgs, err := s.List()
				if err != nil {
					return err
				}
				for _, im := range imgs {
					if err := add(im.Name, im.Layers); err != nil {
						return err
					}
				}
				ls, err := s.ListLayers()
				if err != nil {
					return err
				}
				for _, l := range ls {
					if err := add("layer:"+l.Name, []string{l.Digest}); err != nil {
						return err
					}
				}
			}
			for _, n := range args {
				if strings.HasPrefix(n, "layer:") {
					l, err := s.GetLayer(strings.TrimPrefix(n, "layer:"))
					if err != nil {
						return err
					}
					if err := add(n, []string{l.Digest}); err != nil {
						return err
					}
					continue
				}
				im, err := s.Get(n)
				if err != nil {
					return err
				}
				if err := add(n, im.Layers); err != nil {
					return err
				}
			}
			inUse, _ := leasedDigests(s.Root())
			if JSONOutput(cmd) {
				return printPlainJSON(cmd.OutOrStdout(), map[string]any{"layers": rows})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "IMAGE\tLAYER\tFORMAT\tRESIDENT\tSIZE\tREAD\tFILES\tIN USE")
			sort.SliceStable(rows, func(i, j int) bool { return rows[i].Owner < rows[j].Owner })
			for _, r := range rows {
				pct := "-"
				if r.Format == image.FormatEROFS && r.Size > 0 {
					pct = fmt.Sprintf("%.1f%%", 100*float64(r.Resident)/float64(r.Size))
				}
				use := "-"
				if n := inUse[r.Digest]; n != "" {
					use = n
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Owner, shortID(r.Digest), r.Format, formatBytes(r.Resident), formatBytes(r.Size), pct, r.Files, use)
			}
			return tw.Flush()
		},
	}
	addImageStoreFlag(c)
	return c
}

func newImageVerifyCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "verify [NAME...]",
		Short: "Check the digests of stored layer blobs (default: all)",
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := openLocalStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			var digests []string
			if len(args) == 0 {
				if digests, err = s.Blobs(); err != nil {
					return err
				}
			}
			for _, n := range args {
				im, err := s.Get(n)
				if err != nil {
					return err
				}
				digests = append(digests, im.Layers...)
			}
			bad := 0
			for _, d := range digests {
				if err := s.Verify(cmd.Context(), d); err != nil {
					if cmd.Context().Err() != nil {
						return err
					}
					printError(cmd.ErrOrStderr(), err)
					bad++
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s ok\n", d)
			}
			if bad > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%d of %d layers are corrupt\n", bad, len(digests))
				return exitError{1}
			}
			return nil
		},
	}
	addImageStoreFlag(c)
	return c
}

var _ = context.Background

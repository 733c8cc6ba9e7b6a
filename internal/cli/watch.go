package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func newWatchCommand() *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "watch ID PATH [--recursive]",
		Short: "Print the changes of a directory of a sandbox as they happen",
		Long: `Print one line per change of directory PATH of a running sandbox (and of
every directory below it with --recursive, those made later included):
the event (create, write, remove, rename, chmod) and the path relative to
PATH, a trailing / for a directory; with --json one event object per line.
It runs until interrupted, until PATH is removed, or until the sandbox
stops running (pause, hibernate, stop, delete), which is an error.`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			return cl.WatchDir(cmd.Context(), &warrenv1.WatchDirRequest{SandboxId: args[0], Path: args[1], Recursive: recursive}, func(ev *warrenv1.WatchDirEvent) error {
				if JSONOutput(cmd) {
					b, err := marshalJSON(ev, false)
					if err != nil {
						return err
					}
					_, err = out.Write(append(b, '\n'))
					return err
				}
				if s := ev.GetStarted(); s != nil {
					_, err := fmt.Fprintf(errOut, "watching %s\n", s.GetPath())
					return err
				}
				f := ev.GetFile()
				p := f.GetPath()
				if f.GetIsDir() {
					p += "/"
				}
				typ := strings.ToLower(strings.TrimPrefix(f.GetType().String(), "FILE_EVENT_TYPE_"))
				_, err := fmt.Fprintf(out, "%-6s %s\n", typ, p)
				return err
			})
		},
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "also watch every directory below PATH")
	return c
}

func newStatsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "stats ID",
		Short: "Show a running sandbox's CPU, memory and disk use",
		Long: `Show a running sandbox's resource use now: CPU use over the last second
(as a share of the CPUs it may use), memory charged to it (page cache
included) against its limit, and the filesystem of its writable layer
(its own disk with a disk limit, else the node's). --json prints the
daemon's counters as they are.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			a, err := cl.SandboxStats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), a)
			}
			select {
			case <-time.After(time.Second):
			case <-cmd.Context().Done():
				return cmd.Context().Err()
			}
			b, err := cl.SandboxStats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			pct := 0.0
			if wall := b.GetSampledAtUnixMs() - a.GetSampledAtUnixMs(); wall > 0 && b.GetCpuCount() > 0 {
				pct = 100 * float64(b.GetCpuUsageNs()-a.GetCpuUsageNs()) / float64(wall*1e6) / float64(b.GetCpuCount())
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "cpu     %.1f%% of %d\nmemory  %s of %s (anon %s, cache %s, kernel %s; swap %s)\ndisk    %s of %s\npids    %d\n",
				pct, b.GetCpuCount(),
				formatBytes(int64(b.GetMemoryBytes())), formatBytes(int64(b.GetMemoryLimitBytes())),
				formatBytes(int64(b.GetMemoryAnonBytes())), formatBytes(int64(b.GetMemoryCacheBytes())),
				formatBytes(int64(b.GetMemoryKernelBytes())), formatBytes(int64(b.GetMemorySwapBytes())),
				formatBytes(int64(b.GetDiskUsedBytes())), formatBytes(int64(b.GetDiskBytes())), b.GetPids())
			return err
		},
	}
	return c
}

package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func newEventsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "events ID",
		Short: "List a sandbox's security events (OOM kills, pids limit, output caps, full disk, timeouts)",
		Long: `List every action the node contained or denied in a sandbox, oldest
first: OOM kills, forks refused at the pids limit, output dropped past a
cap, a full disk or inode table, execs and processes killed at their
timeout. The node keeps the latest 256 per sandbox while it exists.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			evs, err := cl.SandboxEvents(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), &warrenv1.ListSandboxEventsResponse{Events: evs})
			}
			printEvents(cmd.OutOrStdout(), evs)
			return nil
		},
	}
}

func printEvents(w io.Writer, evs []*warrenv1.SecurityEvent) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tKIND\tCOUNT\tPROCESS\tDETAIL")
	for _, e := range evs {
		proc := e.GetProcess()
		if proc == "" {
			proc = "-"
		}
		detail := e.GetDetail()
		if n := e.GetSuppressed(); n > 0 {
			detail += fmt.Sprintf(" (%d earlier events suppressed by the rate limit)", n)
		}
		t := time.UnixMilli(e.GetTimeUnixMs()).UTC().Format("2006-01-02T15:04:05.000Z")
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", e.GetSeq(), t, e.GetKind(), e.GetCount(), proc, detail)
	}
	tw.Flush()
}

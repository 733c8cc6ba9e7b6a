package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func newPauseCommand() *cobra.Command {
	var (
		reclaim  bool
		labels   []string
		parallel int32
	)
	c := &cobra.Command{
		Use:   "pause ID... | pause --label KEY=VALUE...",
		Short: "Freeze sandboxes in place, and give back their memory",
		Long: `Freeze every process of a running sandbox where it is. With --reclaim the
sandbox then gives back its page cache and, where the node has swap or
zswap, its anonymous memory. A paused sandbox refuses exec and file calls
until resumed; its lifetime keeps counting (see "warren sandbox extend").
It stays paused across a daemon restart.

With --label, every running sandbox carrying all the labels is paused,
--parallel at a time, and each is reported as it finishes.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKVs("label", labels)
			if err != nil {
				return err
			}
			if (len(args) == 0) == (len(sel) == 0) {
				return usagef("give sandbox IDs or --label, not both and not neither")
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			out := cmd.OutOrStdout()
			if len(sel) > 0 {
				res, err := cl.PauseByLabel(cmd.Context(), &warrenv1.PauseByLabelRequest{Labels: sel, Reclaim: reclaim, Parallelism: parallel},
					func(ev *warrenv1.ByLabelEvent) error { return printByLabel(cmd, out, ev) })
				if err != nil {
					return err
				}
				return byLabelSummary(cmd, "paused", res.Total, res.Failed)
			}
			for _, id := range args {
				res, err := cl.Pause(cmd.Context(), id, reclaim)
				if err != nil {
					return err
				}
				if JSONOutput(cmd) {
					if err := printJSON(out, res); err != nil {
						return err
					}
					continue
				}
				fmt.Fprintln(out, pauseLine(id, res))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&reclaim, "reclaim", false, "give back the page cache (and anonymous memory, where the node has swap) once frozen")
	c.Flags().StringArrayVar(&labels, "label", nil, "pause the running sandboxes with label KEY=VALUE (repeatable; all must match)")
	c.Flags().Int32Var(&parallel, "parallel", 0, "with --label: sandboxes paused at a time (default 8, at most 64)")
	return c
}

func newResumeCommand() *cobra.Command {
	var (
		labels   []string
		parallel int32
	)
	c := &cobra.Command{
		Use:   "resume ID... | resume --label KEY=VALUE...",
		Short: "Thaw paused sandboxes: their processes continue where they stopped",
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKVs("label", labels)
			if err != nil {
				return err
			}
			if (len(args) == 0) == (len(sel) == 0) {
				return usagef("give sandbox IDs or --label, not both and not neither")
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			out := cmd.OutOrStdout()
			if len(sel) > 0 {
				res, err := cl.ResumeByLabel(cmd.Context(), &warrenv1.ResumeByLabelRequest{Labels: sel, Parallelism: parallel},
					func(ev *warrenv1.ByLabelEvent) error { return printByLabel(cmd, out, ev) })
				if err != nil {
					return err
				}
				return byLabelSummary(cmd, "resumed", res.Total, res.Failed)
			}
			for _, id := range args {
				res, err := cl.Resume(cmd.Context(), id)
				if err != nil {
					return err
				}
				if JSONOutput(cmd) {
					if err := printJSON(out, res); err != nil {
						return err
					}
					continue
				}
				fmt.Fprintln(out, resumeLine(id, res))
			}
			return nil
		},
	}
	c.Flags().StringArrayVar(&labels, "label", nil, "resume the paused sandboxes with label KEY=VALUE (repeatable; all must match)")
	c.Flags().Int32Var(&parallel, "parallel", 0, "with --label: sandboxes resumed at a time (default 8, at most 64)")
	return c
}

func pauseLine(id string, r *warrenv1.PauseResponse) string {
	b, a := int64(r.GetBefore().GetBytes()), int64(r.GetAfter().GetBytes())
	return fmt.Sprintf("%s paused in %v (freeze %v): memory %s -> %s, %s given back",
		id, time.Duration(r.GetTotalUs())*time.Microsecond, time.Duration(r.GetFreezeUs())*time.Microsecond,
		formatBytes(b), formatBytes(a), formatBytes(max(0, b-a)))
}

func resumeLine(id string, r *warrenv1.ResumeResponse) string {
	return fmt.Sprintf("%s resumed (thaw %v) after %v paused", id,
		time.Duration(r.GetThawUs())*time.Microsecond, time.Duration(r.GetPausedMs())*time.Millisecond)
}

// printByLabel prints one sandbox's event: a JSON line with --json, else
// a progress line.
func printByLabel(cmd *cobra.Command, out io.Writer, ev *warrenv1.ByLabelEvent) error {
	if JSONOutput(cmd) {
		b, err := marshalJSON(ev, false)
		if err != nil {
			return err
		}
		_, err = out.Write(append(b, '\n'))
		return err
	}
	line := ""
	switch {
	case ev.GetError() != "":
		line = ev.GetSandboxId() + " failed: " + ev.GetError()
	case ev.GetPaused() != nil:
		line = pauseLine(ev.GetSandboxId(), ev.GetPaused())
	case ev.GetResumed() != nil:
		line = resumeLine(ev.GetSandboxId(), ev.GetResumed())
	}
	_, err := fmt.Fprintf(out, "[%d/%d] %s\n", ev.GetCompleted(), ev.GetTotal(), line)
	return err
}

// byLabelSummary says how many sandboxes matched, and fails the command
// when any failed.
func byLabelSummary(cmd *cobra.Command, verb string, total, failed int) error {
	if !JSONOutput(cmd) {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s %d of %d sandboxes\n", verb, total-failed, total)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d sandboxes failed", failed, total)
	}
	return nil
}

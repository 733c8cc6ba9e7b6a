package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// lifecycleCommand is the shape pause, resume and hibernate share: sandbox
// IDs, or --label (all must match) with --parallel; one line (or JSON
// object) per sandbox as it finishes, and a summary for a batch.
type lifecycleCommand struct {
	use, short, long, verb string
	labelHelp, parHelp     string
	// one does the call for one sandbox and returns its response and
	// line; batch does the by-label call, printing each event.
	one   func(cmd *cobra.Command, cl *client.Client, id string) (proto.Message, string, error)
	batch func(cmd *cobra.Command, cl *client.Client, sel map[string]string, parallel int32, each func(*warrenv1.ByLabelEvent) error) (*client.ByLabelResult, error)
}

func (lc lifecycleCommand) command() *cobra.Command {
	var (
		labels   []string
		parallel int32
	)
	c := &cobra.Command{
		Use:   lc.use,
		Short: lc.short,
		Long:  lc.long,
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
				res, err := lc.batch(cmd, cl, sel, parallel, func(ev *warrenv1.ByLabelEvent) error { return printByLabel(cmd, out, ev) })
				if err != nil {
					return err
				}
				return byLabelSummary(cmd, lc.verb, res.Total, res.Failed)
			}
			for _, id := range args {
				res, line, err := lc.one(cmd, cl, id)
				if err != nil {
					return err
				}
				if JSONOutput(cmd) {
					if err := printJSON(out, res); err != nil {
						return err
					}
					continue
				}
				fmt.Fprintln(out, line)
			}
			return nil
		},
	}
	c.Flags().StringArrayVar(&labels, "label", nil, lc.labelHelp)
	c.Flags().Int32Var(&parallel, "parallel", 0, lc.parHelp)
	return c
}

func newPauseCommand() *cobra.Command {
	var reclaim bool
	c := lifecycleCommand{
		use:   "pause ID... | pause --label KEY=VALUE...",
		short: "Freeze sandboxes in place, and give back their memory",
		long: `Freeze every process of a running sandbox where it is. With --reclaim the
sandbox then gives back its page cache and, where the node has swap or
zswap, its anonymous memory. A paused sandbox refuses exec and file calls
until resumed; its lifetime keeps counting (see "warren sandbox extend").
It stays paused across a daemon restart.

With --label, every running sandbox carrying all the labels is paused,
--parallel at a time, and each is reported as it finishes.`,
		verb:      "paused",
		labelHelp: "pause the running sandboxes with label KEY=VALUE (repeatable; all must match)",
		parHelp:   "with --label: sandboxes paused at a time (default 8, at most 64)",
		one: func(cmd *cobra.Command, cl *client.Client, id string) (proto.Message, string, error) {
			res, err := cl.Pause(cmd.Context(), id, reclaim)
			if err != nil {
				return nil, "", err
			}
			return res, pauseLine(id, res), nil
		},
		batch: func(cmd *cobra.Command, cl *client.Client, sel map[string]string, par int32, each func(*warrenv1.ByLabelEvent) error) (*client.ByLabelResult, error) {
			return cl.PauseByLabel(cmd.Context(), &warrenv1.PauseByLabelRequest{Labels: sel, Reclaim: reclaim, Parallelism: par}, each)
		},
	}.command()
	c.Flags().BoolVar(&reclaim, "reclaim", false, "give back the page cache (and anonymous memory, where the node has swap) once frozen")
	return c
}

func newRestoreCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "restore ID...",
		Short: "Restore hibernated sandboxes on this node, from a checkpoint directory nodes share",
		Long: `Restore a hibernated sandbox on the node this command talks to. Where the
nodes share a checkpoint directory ("warren serve --checkpoint-dir" on a
shared filesystem, with the image store), the sandbox may have been
hibernated on another node: it moves here with its id, files, processes
and trajectory log, and gets an address of this node's. The node it left
forgets it. On the node that hibernated it, restore is "resume".`,
		Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			out := cmd.OutOrStdout()
			for _, id := range args {
				res, err := cl.Restore(cmd.Context(), id)
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
}

func newResumeCommand() *cobra.Command {
	c := lifecycleCommand{
		use:   "resume ID... | resume --label KEY=VALUE...",
		short: "Thaw paused sandboxes, or restore hibernated ones: their processes continue where they stopped",
		long: `Thaw a paused sandbox, or restore a hibernated one from its checkpoint
(see "warren sandbox hibernate"): either way its processes continue where
they stopped.

With --label, every paused or hibernated sandbox carrying all the labels
is resumed, --parallel at a time, and each is reported as it finishes.`,
		verb:      "resumed",
		labelHelp: "resume the paused and hibernated sandboxes with label KEY=VALUE (repeatable; all must match)",
		parHelp:   "with --label: sandboxes resumed at a time (default 8, at most 64)",
		one: func(cmd *cobra.Command, cl *client.Client, id string) (proto.Message, string, error) {
			res, err := resumeOne(cmd, cl, id)
			if err != nil {
				return nil, "", err
			}
			return res, resumeLine(id, res), nil
		},
		batch: func(cmd *cobra.Command, cl *client.Client, sel map[string]string, par int32, each func(*warrenv1.ByLabelEvent) error) (*client.ByLabelResult, error) {
			return cl.ResumeByLabel(cmd.Context(), &warrenv1.ResumeByLabelRequest{Labels: sel, Parallelism: par}, each)
		},
	}.command()
	c.Flags().Bool("lazy-pages", true, "true: a hibernated sandbox's memory comes back lazily, as it is touched; false: all of it before the call returns; not given: as the node's warren serve --lazy-pages says")
	return c
}

// resumeOne is Resume, with the memory restored as --lazy-pages says
// where it was given.
func resumeOne(cmd *cobra.Command, cl *client.Client, id string) (*warrenv1.ResumeResponse, error) {
	if f := cmd.Flags().Lookup("lazy-pages"); f != nil && f.Changed {
		lazy, _ := cmd.Flags().GetBool("lazy-pages")
		return cl.ResumeLazy(cmd.Context(), id, lazy)
	}
	return cl.Resume(cmd.Context(), id)
}

func newHibernateCommand() *cobra.Command {
	c := lifecycleCommand{
		use:   "hibernate ID... | hibernate --label KEY=VALUE...",
		short: "Checkpoint sandboxes to disk and release everything they hold on the node",
		long: `Checkpoint a running or paused sandbox with CRIU: its processes (memory,
open files, pipes) and its writable layer go to disk under the daemon's
state directory, and its memory, processes, mounts and cgroup are
released. A hibernated sandbox survives daemon restarts and reboots;
"warren sandbox resume" restores it, and its processes continue where they
stopped. Its lifetime keeps counting while hibernated.

A sandbox CRIU cannot checkpoint (docs/HIBERNATE.md) is refused with the
reason and keeps running.

With --label, every running or paused sandbox carrying all the labels is
hibernated, --parallel at a time, and each is reported as it finishes.`,
		verb:      "hibernated",
		labelHelp: "hibernate the running and paused sandboxes with label KEY=VALUE (repeatable; all must match)",
		parHelp:   "with --label: sandboxes hibernated at a time (default 8, at most 64)",
		one: func(cmd *cobra.Command, cl *client.Client, id string) (proto.Message, string, error) {
			res, err := cl.Hibernate(cmd.Context(), id)
			if err != nil {
				return nil, "", err
			}
			return res, hibernateLine(id, res), nil
		},
		batch: func(cmd *cobra.Command, cl *client.Client, sel map[string]string, par int32, each func(*warrenv1.ByLabelEvent) error) (*client.ByLabelResult, error) {
			return cl.HibernateByLabel(cmd.Context(), &warrenv1.HibernateByLabelRequest{Labels: sel, Parallelism: par}, each)
		},
	}.command()
	return c
}

func newForkCommand() *cobra.Command {
	var (
		count   int32
		lazy    bool
		labels  []string
		timeout time.Duration
	)
	c := &cobra.Command{
		Use:   "fork ID",
		Short: "Make copies of a sandbox: its processes and files, each on its own copy-on-write layer",
		Long: `Make --count copies of a sandbox from a checkpoint of it: each runs the
sandbox's processes from where they were and sees its files, writing on a
copy-on-write layer of its own, and then goes its own way. A running or
paused sandbox is hibernated for the fork and put back as it was; a
hibernated one stays hibernated. Forks carry the sandbox's labels plus
--label, and a copy of its trajectory log. Prints the forks' IDs, one per
line (the whole response with --json).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKVs("label", labels)
			if err != nil {
				return err
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			req := &warrenv1.ForkRequest{Id: args[0], Count: count, Labels: sel, TimeoutSeconds: int64(timeout / time.Second)}
			if cmd.Flags().Changed("lazy-pages") {
				req.LazyPages = &lazy
			}
			res, err := cl.Fork(cmd.Context(), req)
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), res)
			}
			for _, f := range res.GetSandboxes() {
				fmt.Fprintln(cmd.OutOrStdout(), f.GetId())
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "forked %s %d times in %v\n", args[0], len(res.GetSandboxes()), time.Duration(res.GetTotalUs())*time.Microsecond)
			return nil
		},
	}
	c.Flags().Int32VarP(&count, "count", "n", 1, "how many copies (at most 64)")
	c.Flags().StringArrayVar(&labels, "label", nil, "a label KEY=VALUE the forks carry besides the source's (repeatable)")
	c.Flags().DurationVar(&timeout, "timeout", 0, "the forks' lifetime (default: the node's)")
	c.Flags().BoolVar(&lazy, "lazy-pages", true, "true: the forks' memory comes back lazily, as it is touched; false: all of it before the call returns; not given: as the node's warren serve --lazy-pages says")
	return c
}

func hibernateLine(id string, r *warrenv1.HibernateResponse) string {
	return fmt.Sprintf("%s hibernated in %v (checkpoint %v): %s released, checkpoint %s on disk", id,
		time.Duration(r.GetTotalUs())*time.Microsecond, time.Duration(r.GetCheckpointUs())*time.Microsecond,
		formatBytes(int64(r.GetBefore().GetBytes())), formatBytes(int64(r.GetBytes())))
}

func pauseLine(id string, r *warrenv1.PauseResponse) string {
	b, a := int64(r.GetBefore().GetBytes()), int64(r.GetAfter().GetBytes())
	return fmt.Sprintf("%s paused in %v (freeze %v): memory %s -> %s, %s given back",
		id, time.Duration(r.GetTotalUs())*time.Microsecond, time.Duration(r.GetFreezeUs())*time.Microsecond,
		formatBytes(b), formatBytes(a), formatBytes(max(0, b-a)))
}

func resumeLine(id string, r *warrenv1.ResumeResponse) string {
	if r.GetRestored() {
		mem := "memory whole"
		switch {
		case r.GetLazyPages():
			mem = "memory lazily"
		case r.GetEagerReason() != "":
			mem = "memory whole: " + r.GetEagerReason()
		}
		return fmt.Sprintf("%s restored in %v after %v hibernated (%s)", id,
			time.Duration(r.GetRestoreUs())*time.Microsecond, time.Duration(r.GetPausedMs())*time.Millisecond, mem)
	}
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
	case ev.GetHibernated() != nil:
		line = hibernateLine(ev.GetSandboxId(), ev.GetHibernated())
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

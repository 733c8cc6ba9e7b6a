package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/internal/bench"
)

func init() { AddCommand(newBenchCommand()) }

type benchFlags struct {
	image     string
	daemonBin string
	peers     bool
	quiet     bool
}

func newBenchCommand() *cobra.Command {
	var bf benchFlags
	c := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark sandbox creation, exec and density against peers",
		Long: `Benchmark a Warren daemon. Without --addr each benchmark starts a private
daemon (this binary, with its own state, run and cgroup directories), builds
and imports a busybox image, and removes everything at the end. With --addr
it drives that daemon and deletes only the sandboxes it created.

Peers (crun, runc, unshare+chroot, nsenter) run in the same invocation on
the same busybox root filesystem. Run as root. Progress goes to stderr; the
result to stdout, as a table or (--json) one JSON object.`,
		Args: groupArgs,
		RunE: groupRun,
	}
	pf := c.PersistentFlags()
	pf.StringVar(&bf.image, "image", "", "use this existing image instead of importing a busybox one")
	pf.StringVar(&bf.daemonBin, "daemon-bin", "", "warren binary of the private daemon (default: this executable)")
	pf.BoolVar(&bf.peers, "peers", true, "also measure the peer systems")
	pf.BoolVar(&bf.quiet, "quiet", false, "no progress on stderr")
	_ = pf.MarkHidden("daemon-bin")
	c.AddCommand(newBenchCreateCommand(&bf), newBenchExecCommand(&bf), newBenchDensityCommand(&bf))
	return c
}

// benchEnv raises RLIMIT_NOFILE (the private daemon inherits it) and sets
// up the daemon the benchmark drives.
func benchEnv(cmd *cobra.Command, bf *benchFlags) (*bench.Env, uint64, error) {
	nofile, err := bench.RaiseNofile()
	if err != nil {
		return nil, 0, fmt.Errorf("raise RLIMIT_NOFILE: %w", err)
	}
	o := bench.Options{Image: bf.image, Exe: bf.daemonBin, UserAgent: "warren-bench/" + version()}
	if f := cmd.Flag("addr"); f != nil && f.Changed {
		o.Addr = f.Value.String()
	} else if os.Geteuid() != 0 {
		return nil, 0, errors.New("the private daemon needs root; run as root or pass --addr")
	}
	if !bf.quiet {
		o.Progress = cmd.ErrOrStderr()
	}
	env, err := bench.Setup(cmd.Context(), o)
	return env, nofile, err
}

// runBench sets up, runs fn, prints its report and cleans up.
func runBench(cmd *cobra.Command, bf *benchFlags, fn func(ctx context.Context, env *bench.Env, nofile uint64) (bench.Report, error)) (err error) {
	env, nofile, err := benchEnv(cmd, bf)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := env.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()
	rep, err := fn(cmd.Context(), env, nofile)
	if err != nil {
		if log := env.DaemonLog(); log != "" {
			err = fmt.Errorf("%w (daemon log: %s)", err, log)
		}
		return err
	}
	return writeReport(cmd, rep)
}

func writeReport(cmd *cobra.Command, rep bench.Report) error {
	if JSONOutput(cmd) {
		return bench.WriteJSON(cmd.OutOrStdout(), rep)
	}
	return rep.Table(cmd.OutOrStdout())
}

func concurrencyFlag(c *cobra.Command, p *[]int) {
	c.Flags().IntSliceVar(p, "concurrency", []int{1, 8}, "concurrent clients, one run per value")
}

func checkCounts(n, warmup int, conc []int) error {
	if n < 1 {
		return usagef("--n must be at least 1")
	}
	if warmup < 0 {
		return usagef("--warmup must not be negative")
	}
	if len(conc) == 0 {
		return usagef("--concurrency needs at least one value")
	}
	for _, c := range conc {
		if c < 1 || c > 1024 {
			return usagef("--concurrency values must be in [1, 1024], got %d", c)
		}
	}
	return nil
}

func newBenchCreateCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.CreateConfig{}
	c := &cobra.Command{
		Use:   "create [--n 200] [--concurrency 1,8]",
		Short: "Create -> exec `true` -> delete cycles, against crun run, runc run and unshare+chroot",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCounts(cfg.N, cfg.Warmup, cfg.Concurrency); err != nil {
				return err
			}
			cfg.Peers = bf.peers
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunCreate(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 200, "measured cycles per system and concurrency")
	c.Flags().IntVar(&cfg.Warmup, "warmup", 10, "unmeasured cycles before each measured run")
	c.Flags().DurationVar(&cfg.Pause, "pause", 0, "sleep before every cycle of each client (latency on an idle host; lowers per_s)")
	concurrencyFlag(c, &cfg.Concurrency)
	return c
}

func newBenchExecCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.ExecConfig{}
	c := &cobra.Command{
		Use:   "exec [--n 2000] [--concurrency 1,8]",
		Short: "Exec `true` round trips into one sandbox, against crun exec, runc exec and nsenter",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCounts(cfg.N, cfg.Warmup, cfg.Concurrency); err != nil {
				return err
			}
			cfg.Peers = bf.peers
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunExec(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 2000, "measured execs per system and concurrency")
	c.Flags().IntVar(&cfg.Warmup, "warmup", 50, "unmeasured execs before each measured run")
	concurrencyFlag(c, &cfg.Concurrency)
	return c
}

func newBenchDensityCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.DensityConfig{}
	c := &cobra.Command{
		Use:   "density --n N",
		Short: "Memory per idle sandbox, create and delete time of N sandboxes",
		Long: `Create N idle sandboxes (8 at a time), then report the node memory per
sandbox (MemAvailable before minus after, both read after sync and
drop_caches), the daemon's RSS and Pss growth, the agents' Pss, and the
create time; check that a random 1% still answer exec, delete all and
report the delete time and how much memory came back. With --peers, N
idle unshare+chroot and crun containers are measured the same way.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCounts(cfg.N, 0, []int{cfg.Concurrency}); err != nil {
				return err
			}
			if os.Geteuid() != 0 {
				return errors.New("bench density drops the page cache and reads other processes' memory: run as root")
			}
			cfg.Peers = bf.peers
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, nofile uint64) (bench.Report, error) {
				return bench.RunDensity(ctx, env, cfg, nofile)
			})
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 0, "number of sandboxes")
	c.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "creates and deletes in flight")
	_ = c.MarkFlagRequired("n")
	return c
}

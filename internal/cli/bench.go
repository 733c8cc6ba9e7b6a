package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/internal/bench"
	"github.com/warrenrl/warren/internal/microvm"
)

func init() { AddCommand(newBenchCommand()) }

type benchFlags struct {
	image     string
	daemonBin string
	peers     bool
	quiet     bool
	jsonFile  string
	// daemonArgs are extra `warren serve` flags of the private daemon
	// (e.g. --pprof, to profile it under a benchmark).
	daemonArgs []string
	// pprof serves this process's profiles (its clients, and the
	// in-process gateway of `bench create --gateway`).
	pprof string
}

func newBenchCommand() *cobra.Command {
	var bf benchFlags
	c := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark sandbox creation, exec and density against peers, shared layers and on-demand loading",
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
	pf.StringVar(&bf.jsonFile, "json-file", "", "also write the report as JSON to this file")
	pf.StringArrayVar(&bf.daemonArgs, "daemon-arg", nil, "extra `warren serve` flag of the private daemon (repeatable), e.g. --daemon-arg=--pprof=127.0.0.1:6060")
	pf.StringVar(&bf.pprof, "pprof", "", "serve this process's profiles (its clients; the gateway of create --gateway) on this loopback address")
	_ = pf.MarkHidden("pprof")
	_ = pf.MarkHidden("daemon-bin")
	_ = pf.MarkHidden("daemon-arg")
	c.AddCommand(newBenchCreateCommand(&bf), newBenchExecCommand(&bf), newBenchDeleteCommand(&bf), newBenchDensityCommand(&bf),
		newBenchLayersCommand(&bf), newBenchOndemandCommand(&bf), newBenchRestartCommand(&bf), newBenchHardeningCommand(&bf),
		newBenchNetworkCommand(&bf), newBenchNetClientCommand(), newBenchHibernateCommand(&bf), newBenchTrajectoryCommand(&bf), newBenchFnCallCommand(&bf),
		newBenchSchedCommand(&bf), newBenchE2BCommand(&bf), newBenchVMCommand(&bf), newBenchQoSCommand(&bf))
	return c
}

// benchEnv raises RLIMIT_NOFILE (the private daemon inherits it) and sets
// up the daemon the benchmark drives.
func benchEnv(cmd *cobra.Command, bf *benchFlags, opts func(*bench.Options)) (*bench.Env, uint64, error) {
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
	if opts != nil {
		opts(&o)
	}
	o.DaemonArgs = append(o.DaemonArgs, bf.daemonArgs...)
	env, err := bench.Setup(cmd.Context(), o)
	return env, nofile, err
}

// runBench sets up, runs fn, prints its report and cleans up.
func runBench(cmd *cobra.Command, bf *benchFlags, fn func(ctx context.Context, env *bench.Env, nofile uint64) (bench.Report, error)) error {
	return runBenchOpts(cmd, bf, nil, fn)
}

// runBenchOpts is runBench with a change of the setup options.
func runBenchOpts(cmd *cobra.Command, bf *benchFlags, opts func(*bench.Options), fn func(ctx context.Context, env *bench.Env, nofile uint64) (bench.Report, error)) (err error) {
	env, nofile, err := benchEnv(cmd, bf, opts)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := env.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()
	if bf.pprof != "" {
		if _, err := servePprof(cmd.Context(), bf.pprof, slog.Default()); err != nil {
			return err
		}
	}
	rep, err := fn(cmd.Context(), env, nofile)
	if err != nil {
		if log := env.DaemonLog(); log != "" {
			err = fmt.Errorf("%w (daemon log: %s)", err, log)
		}
		return err
	}
	if bf.jsonFile != "" {
		if err := writeJSONFile(bf.jsonFile, rep); err != nil {
			return err
		}
	}
	return writeReport(cmd, rep)
}

func writeJSONFile(path string, rep bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.WriteJSON(f, rep); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
	var viaGateway bool
	c := &cobra.Command{
		Use:   "create [--n 200] [--concurrency 1,8]",
		Short: "Create -> exec `true` -> delete cycles, against crun run, runc run and unshare+chroot",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCounts(cfg.N, cfg.Warmup, cfg.Concurrency); err != nil {
				return err
			}
			cfg.Peers = bf.peers
			if viaGateway {
				return runCreateGateway(cmd, bf, cfg)
			}
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunCreate(ctx, env, cfg)
			})
		},
	}
	c.Flags().BoolVar(&viaGateway, "gateway", false, "measure through a gateway (started in this process, joined to the private daemon's gossip) against the same node over TCP, as a ratio (no peers)")
	c.Flags().IntVar(&cfg.N, "n", 200, "measured cycles per system and concurrency")
	c.Flags().IntVar(&cfg.Warmup, "warmup", 10, "unmeasured cycles before each measured run")
	c.Flags().DurationVar(&cfg.Pause, "pause", 0, "sleep before every cycle of each client (latency on an idle host; lowers per_s)")
	c.Flags().StringSliceVar(&cfg.Backends, "backend", []string{"container"}, "backends to create Warren's sandboxes with, each measured in the same run (e.g. container,fncall)")
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
			cfg.Peers = bf.peers && !cfg.Harness
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunExec(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 2000, "measured execs per system and concurrency")
	c.Flags().IntVar(&cfg.Warmup, "warmup", 50, "unmeasured execs before each measured run")
	c.Flags().BoolVar(&cfg.Harness, "harness", false, "exec into a harness sandbox's child, through the node socket and through the harness's route (no peers)")
	concurrencyFlag(c, &cfg.Concurrency)
	return c
}

func newBenchFnCallCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.FnCallConfig{}
	c := &cobra.Command{
		Use:   "fncall [--n 2000] [--concurrency 1,4]",
		Short: "Run one-step jobs in the fncall backend, against bare fork+exec, unshare+chroot, crun run and exec per step",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCounts(cfg.N, cfg.Warmup, cfg.Concurrency); err != nil {
				return err
			}
			cfg.Peers = bf.peers
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunFnCall(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 2000, "measured runs per system, program and concurrency")
	c.Flags().IntVar(&cfg.Warmup, "warmup", 100, "unmeasured runs before each measured run")
	c.Flags().IntSliceVar(&cfg.Concurrency, "concurrency", []int{1, 4}, "concurrent callers (comma-separated)")
	c.Flags().StringVar(&cfg.PythonImage, "python-image", "", "python image (scripts/fn-images.sh python): an image of the daemon, or its root directory to import; adds the python3 -c pass row")
	c.Flags().StringVar(&cfg.CCImage, "cc-image", "", "C compiler image (scripts/fn-images.sh cc): an image of the daemon, or its root directory to import; adds the compile-then-run row")
	return c
}

func newBenchDeleteCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.DeleteConfig{}
	c := &cobra.Command{
		Use:   "delete [--rounds 5] [--files 20000] [--dirty-mib 400]",
		Short: "Delete latency: idle, after writing files, and beside a sandbox with unwritten data; against rm -rf",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Rounds < 1 || cfg.Files < 1 || cfg.DirtyMiB < 1 {
				return errors.New("--rounds, --files and --dirty-mib must be positive")
			}
			cfg.Peers = bf.peers
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunDelete(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.Rounds, "rounds", 5, "deletes timed per case")
	c.Flags().IntVar(&cfg.Files, "files", 20000, "files the sandbox writes before its delete in the \"wrote files\" case")
	c.Flags().IntVar(&cfg.DirtyMiB, "dirty-mib", 400, "MiB another sandbox writes (unsynced) in the \"neighbour\" case")
	return c
}

func newBenchHibernateCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.HibernateConfig{}
	c := &cobra.Command{
		Use:   "hibernate [--rounds 100] [--reclaim-rounds 20] [--anon-mib 256] [--cache-mib 256] [--checkpoint-rounds 5] [--forks 16] [--replay-steps 1000]",
		Short: "Pause, hibernate, restore and fork: latencies, memory freed, checkpoint size; against the raw cgroup and bare CRIU",
		Long: `Create one sandbox holding --anon-mib of anonymous memory and --cache-mib of
page cache, then time Pause (freeze only) and Resume through the API, and
Pause with reclaim with the memory it gave back (the page cache is refilled
before every round). Then Hibernate (a CRIU checkpoint to disk) and
Resume (restore) --checkpoint-rounds times, with the checkpoint's size and
the time to the first exec after a restore, and a Fork of --forks copies
of the hibernated sandbox. A --replay-steps log of execs (each appends a
line to a file) is recorded before the checkpoints and replayed after
them, as a resumed rollout would: through the Go SDK's rollout, and with
each call a round trip to the daemon. With --peers, the same cgroup is frozen, thawed
and reclaimed by writing its files directly, in alternating rounds (needs
the private daemon), and bare CRIU dumps and restores a plain process
holding the same anonymous memory: the floors.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Rounds < 1 || cfg.ReclaimRounds < 1 || cfg.AnonMiB < 1 || cfg.CacheMiB < 1 {
				return errors.New("--rounds, --reclaim-rounds, --anon-mib and --cache-mib must be positive")
			}
			if cfg.ReplaySteps < 0 || cfg.Replays < 1 {
				return errors.New("--replay-steps must not be negative and --replays must be positive")
			}
			cfg.Peers = bf.peers
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunHibernate(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.Rounds, "rounds", 100, "freeze+thaw rounds")
	c.Flags().IntVar(&cfg.ReclaimRounds, "reclaim-rounds", 20, "pause-with-reclaim rounds")
	c.Flags().IntVar(&cfg.AnonMiB, "anon-mib", 256, "anonymous memory the sandbox holds, MiB")
	c.Flags().IntVar(&cfg.CacheMiB, "cache-mib", 256, "page cache the sandbox reads before each reclaim, MiB")
	c.Flags().IntVar(&cfg.CheckpointRounds, "checkpoint-rounds", 5, "hibernate and restore rounds (0: none; needs CRIU, scripts/criu.sh)")
	c.Flags().BoolVar(&cfg.UserNS, "userns", false, "measure a sandbox in a user namespace (the daemon's default) instead of one without")
	c.Flags().IntVar(&cfg.Forks, "forks", 16, "copies the fork case makes of the hibernated sandbox (0: no fork case)")
	c.Flags().IntVar(&cfg.ReplaySteps, "replay-steps", 1000, "steps of the trajectory log replayed after the checkpoints (0: no replay case)")
	c.Flags().IntVar(&cfg.Replays, "replays", 5, "times the whole log is replayed, each way")
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
create time, the daemon's CPU while they sit idle (--idle-window, after
--idle-settle);
check that a random 1% still answer exec, delete all and
report the delete time and how much memory came back. With --peers, N
idle unshare+chroot and crun containers are measured the same way. With
--kmem-trace M, M more sandboxes are created with the kernel's kmem
tracepoints on, and the slab objects they keep are attributed to the
kernel functions that allocated them.`,
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
	c.Flags().DurationVar(&cfg.IdleWindow, "idle-window", 30*time.Second, "how long the daemon's CPU is measured with the sandboxes idle")
	c.Flags().DurationVar(&cfg.IdleSettle, "idle-settle", 64*time.Second, "how long the sandboxes sit idle before that (the daemon's looks at idle sandboxes back off over ~60 s)")
	c.Flags().IntVar(&cfg.KmemTrace, "kmem-trace", 0, "also create this many sandboxes with kmem tracing and attribute the slab they keep to kernel call sites (needs tracefs)")
	_ = c.MarkFlagRequired("n")
	return c
}

// scratchDiskFlags adds --scratch-disk and --read-ahead-kb.
func scratchDiskFlags(c *cobra.Command, p *bool, ra *int) {
	c.Flags().BoolVar(p, "scratch-disk", true, "put the private daemon's state directory on a loop-mounted ext4 of its own, so that its disk writes are measured apart from the host's other writers")
	c.Flags().IntVar(ra, "read-ahead-kb", 0, "read_ahead_kb of the scratch disk (default: that of the disk holding it)")
}

func newBenchLayersCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.LayersConfig{}
	scratch, readAhead := true, 0
	c := &cobra.Command{
		Use:   "layers [--n 32] [--size-mb 300]",
		Short: "N sandboxes on one shared workspace + toolkit: per-sandbox tar.gz extraction vs named layers",
		Long: `Generate a deterministic workspace + toolkit of about --size-mb MiB (many
small source files and some binaries), then give it to N sandboxes in two
ways, each measured in this run after sync and drop_caches:

  baseline  create from the base image and upload the tar.gz through the
            archive endpoint (like docker cp), which extracts it into the
            sandbox's writable layer
  warren    build the two named layers once (reported as its own row: a
            one-time cost, amortised over runs), create with
            --layer workspace --layer toolkit

and run the same recorded tool calls (read, grep, edit, "build", "test",
write) in every sandbox. Reports wall time (first create to last tool call
done), bytes written to the state directory's disk (/proc/diskstats, after
a final sync) and the peak write rate (100 ms samples); speedup and
write_reduction are baseline / warren. Run as root (drop_caches).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.N < 1 || cfg.SizeMB < 1 || cfg.Concurrency < 1 {
				return usagef("--n, --size-mb and --concurrency must be at least 1")
			}
			if os.Geteuid() != 0 {
				return errors.New("bench layers drops the page cache: run as root")
			}
			opts := func(o *bench.Options) {
				if scratch {
					o.ScratchDiskBytes = bench.ScratchDiskSize(cfg.N, cfg.SizeMB)
					o.ScratchReadAheadKB = readAhead
				}
			}
			return runBenchOpts(cmd, bf, opts, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunLayers(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 32, "sandboxes per phase")
	c.Flags().IntVar(&cfg.SizeMB, "size-mb", 300, "size of the workspace + toolkit in MiB")
	c.Flags().IntVar(&cfg.Concurrency, "concurrency", 4, "sandboxes in flight")
	c.Flags().StringVar(&cfg.StateDir, "state-dir", "", "the daemon's state directory, to find its disk (needed with --addr)")
	scratchDiskFlags(c, &scratch, &readAhead)
	return c
}

func newBenchOndemandCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.OndemandConfig{}
	scratch, readAhead := true, 0
	layerDirectIO, layerReadAhead := true, 0
	c := &cobra.Command{
		Use:   "ondemand [--image NAME | --busybox]",
		Short: "How much of an image one agent session reads, and cold start vs copying the image first",
		Long: `Run the recorded tool calls of 'bench layers' in one sandbox of a Debian +
python image with the synthetic workspace and toolkit layers on top, the
page cache dropped before, and report per layer the fraction of its EROFS
blob that was read (ImageStats: resident / size). Then compare the start
time (create to first exec result, cold page cache) with copying the
flattened tree to a new directory (cp -a) and starting the same command in
it with unshare+chroot. As a check independent of the page cache, the
bytes read from the scratch disk holding the store meanwhile are reported
too (/proc/diskstats).

The image is --image NAME, else the daemon's image "default" or "debian",
else Debian bookworm (minbase, python3, git) built here with debootstrap
(a minute or two). --busybox uses the busybox image instead, for hosts
without debootstrap. Run as root (drop_caches).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.SizeMB < 1 || cfg.Runs < 1 {
				return usagef("--size-mb and --runs must be at least 1")
			}
			if os.Geteuid() != 0 {
				return errors.New("bench ondemand drops the page cache: run as root")
			}
			cfg.Image = bf.image
			if cfg.Image != "" && cfg.Busybox {
				return usagef("--image and --busybox exclude each other")
			}
			if layerReadAhead < 0 {
				return usagef("--layer-read-ahead-kb must not be negative")
			}
			opts := func(o *bench.Options) {
				if scratch {
					o.ScratchDiskBytes = bench.ScratchDiskSize(4, cfg.SizeMB)
					o.ScratchReadAheadKB = readAhead
				}
				o.DaemonArgs = []string{"--layer-direct-io=" + strconv.FormatBool(layerDirectIO), "--layer-read-ahead-kb=" + strconv.Itoa(layerReadAhead)}
			}
			return runBenchOpts(cmd, bf, opts, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunOndemand(ctx, env, cfg)
			})
		},
	}
	c.Flags().BoolVar(&cfg.Busybox, "busybox", false, "use the busybox image (no debootstrap needed)")
	c.Flags().IntVar(&cfg.SizeMB, "size-mb", 300, "size of the workspace + toolkit layers in MiB")
	c.Flags().IntVar(&cfg.Runs, "runs", 3, "cold starts per system")
	c.Flags().BoolVar(&layerDirectIO, "layer-direct-io", true, "the private daemon's --layer-direct-io (false: layers read through the blobs' page cache, as before)")
	c.Flags().IntVar(&layerReadAhead, "layer-read-ahead-kb", 0, "the private daemon's --layer-read-ahead-kb (0: the kernel's default)")
	scratchDiskFlags(c, &scratch, &readAhead)
	return c
}

func newBenchRestartCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.RestartConfig{}
	c := &cobra.Command{
		Use:   "restart [--n 3200] [--rounds 5]",
		Short: "Daemon restart to serving with N live sandboxes and N background processes, and exec right after; against an empty daemon's start",
		Long: `Create N sandboxes (--concurrency at a time), each running one background
process, then --rounds times: kill -9 the private daemon and start it again,
then stop it with SIGTERM and start it again. Each restart is timed from the
exec of 'warren serve' to its first Version reply (serving), to a List
showing all N RUNNING (running) and to ListProcesses of --sample-procs
random sandboxes showing their process running (ready); then --execs
Exec(true) into random sandboxes are timed, and every sandbox's process is
checked to be running. The peer is the same binary with the same flags
started on an empty state directory in each round. Needs the private
daemon (no --addr); run as root. About 1 MiB of node memory per sandbox.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.N < 1 || cfg.Rounds < 1 || cfg.Execs < 1 || cfg.ExecConcurrency < 1 || cfg.SampleProcs < 1 || cfg.Concurrency < 1 {
				return usagef("--n, --rounds, --execs, --exec-concurrency, --sample-procs and --concurrency must be at least 1")
			}
			if f := cmd.Flag("addr"); f != nil && f.Changed {
				return usagef("bench restart stops and starts the daemon: it runs only against its private one (no --addr)")
			}
			cfg.Peers = bf.peers
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, nofile uint64) (bench.Report, error) {
				return bench.RunRestart(ctx, env, cfg, nofile)
			})
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 3200, "live sandboxes, each with one background process")
	c.Flags().IntVar(&cfg.Rounds, "rounds", 5, "restarts per stop mode (kill -9, SIGTERM)")
	c.Flags().IntVar(&cfg.Execs, "execs", 200, "execs timed right after each restart")
	c.Flags().IntVar(&cfg.ExecConcurrency, "exec-concurrency", 1, "execs in flight")
	c.Flags().IntVar(&cfg.SampleProcs, "sample-procs", 64, "sandboxes whose ListProcesses must show the process running before ready")
	c.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "creates in flight")
	return c
}

func newBenchNetworkCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.NetworkConfig{}
	c := &cobra.Command{
		Use:   "network [--creates 100] [--updates 200]",
		Short: "Create latency per network mode, policy-change latency, TCP connect and throughput to a test host against a bare veth pair",
		Long: `Create latency in network modes none, open and allowlist; the latency of
UpdateSandbox changing a running sandbox's policy; TCP connections and
throughput from a sandbox to a test host (a network namespace this run
makes on the node: no packet leaves the machine) in modes open and
allowlist, against the same busybox commands in a bare network namespace
joined to the test host by a veth pair. Run as root.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Creates < 1 || cfg.Updates < 1 || cfg.Connects < 2 || cfg.MiB < 1 || cfg.Runs < 1 {
				return usagef("--creates, --updates, --mib and --runs must be at least 1, --connects at least 2")
			}
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunNetwork(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.Creates, "creates", 100, "timed creates per mode")
	c.Flags().IntVar(&cfg.Updates, "updates", 200, "timed policy changes")
	c.Flags().IntVar(&cfg.Connects, "connects", 200, "TCP connections per system")
	c.Flags().IntVar(&cfg.MiB, "mib", 256, "MiB sent per throughput run")
	c.Flags().IntVar(&cfg.Runs, "runs", 5, "throughput runs per system")
	c.Flags().DurationVar(&cfg.Settle, "settle", 50*time.Millisecond, "pause after each delete of the create runs (0: the next create pays for the last one's namespace teardown)")
	return c
}

// newBenchNetClientCommand is the client `warren bench network` runs in
// a sandbox and in its peer's namespace.
func newBenchNetClientCommand() *cobra.Command {
	var connect, send, dnsServer, name string
	var n, mib int
	c := &cobra.Command{
		Use:    "netclient --connect ADDR:PORT [--n N] [--send ADDR:PORT --mib M]",
		Short:  "The network benchmark's client (runs inside a sandbox)",
		Hidden: true,
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dnsServer != "" {
				return bench.RunDNSClient(cmd.OutOrStdout(), dnsServer, name, n)
			}
			return bench.RunNetClient(cmd.OutOrStdout(), connect, n, send, mib)
		},
	}
	c.Flags().StringVar(&dnsServer, "dns", "", "instead: resolve --name at this nameserver (ADDR:PORT) n times")
	c.Flags().StringVar(&name, "name", "", "the name --dns resolves")
	c.Flags().StringVar(&connect, "connect", "", "address to connect to n times")
	c.Flags().IntVar(&n, "n", 100, "connections")
	c.Flags().StringVar(&send, "send", "", "address to send mib MiB to")
	c.Flags().IntVar(&mib, "mib", 0, "MiB to send")
	return c
}

func newBenchHardeningCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.HardeningConfig{}
	c := &cobra.Command{
		Use:   "hardening [--n 500] [--syscalls 1000000]",
		Short: "What the seccomp filters (or, --feature userns, user namespaces) cost: create, exec and a syscall-bound exec, against the same binary without",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if cfg.N < 1 || cfg.Runs < 1 || cfg.Syscalls < 1 || cfg.Warmup < 0 {
				return usagef("--n, --runs and --syscalls must be at least 1, --warmup not negative")
			}
			if f := cmd.Flag("addr"); f != nil && f.Changed {
				return usagef("%v", bench.ErrHardeningNeedsPrivate)
			}
			args, ok := bench.HardeningFeatures[cfg.Feature]
			if !ok {
				return usagef("--feature: %q is not seccomp or userns", cfg.Feature)
			}
			with, _, err := benchEnv(cmd, bf, func(o *bench.Options) { o.DaemonArgs = append(o.DaemonArgs, args[0]...) })
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, with.Close()) }()
			without, _, err := benchEnv(cmd, bf, func(o *bench.Options) { o.DaemonArgs = append(o.DaemonArgs, args[1]...) })
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, without.Close()) }()
			rep, err := bench.RunHardening(cmd.Context(), with, without, cfg)
			if err != nil {
				return err
			}
			if bf.jsonFile != "" {
				if err := writeJSONFile(bf.jsonFile, rep); err != nil {
					return err
				}
			}
			return writeReport(cmd, rep)
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 500, "measured cycles per daemon")
	c.Flags().IntVar(&cfg.Warmup, "warmup", 20, "unmeasured cycles per daemon first")
	c.Flags().IntVar(&cfg.Syscalls, "syscalls", 1000000, "bytes dd copies one at a time (twice as many system calls)")
	c.Flags().IntVar(&cfg.Runs, "runs", 10, "measured runs of the syscall-bound exec per daemon")
	c.Flags().StringVar(&cfg.Feature, "feature", "seccomp", "what the two daemons differ in: seccomp (the filters, against --seccomp=false) or userns (--userns against without)")
	return c
}

func newBenchTrajectoryCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.TrajectoryConfig{}
	c := &cobra.Command{
		Use:   "trajectory [--steps 1000] [--replays 5] [--n 1000]",
		Short: "Replay of a recorded rollout and the per-exec cost of recording it in the trajectory log",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Steps < 1 || cfg.Replays < 1 || cfg.N < 1 || cfg.Warmup < 0 {
				return errors.New("--steps, --replays and --n must be positive")
			}
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunTrajectory(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.Steps, "steps", 1000, "steps of the recorded rollout")
	c.Flags().IntVar(&cfg.Replays, "replays", 5, "replays of the whole log")
	c.Flags().IntVar(&cfg.N, "n", 1000, "measured exec rounds, logged and unlogged")
	c.Flags().IntVar(&cfg.Warmup, "warmup", 50, "unmeasured exec rounds first")
	return c
}

// newBenchSched measures the placement engine alone: it needs no daemon,
// no root and no image, so it does not go through benchEnv.
func newBenchSchedCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.SchedConfig{}
	c := &cobra.Command{
		Use:   "sched [--nodes 160] [--live 380000] [--duration 5s] [--concurrency 16]",
		Short: "Placement on a simulated cluster: placements per second and latency, best-of-K against scoring every node",
		Long: `Simulate a cluster in-process (nodes that accept creates, delete and report
capacity, load, QoS classes, labels and layers, without running anything),
fill it with live sandboxes of Zipf-popular images, and place sandboxes from
many goroutines while the nodes report. With --peers (the default) a placer
that scores every node runs on an identical cluster, for the ratio.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Peers = bf.peers
			return runStandalone(cmd, bf, func(progress io.Writer) (bench.Report, error) {
				return bench.RunSched(cfg, progress)
			})
		},
	}
	f := c.Flags()
	f.IntVar(&cfg.Nodes, "nodes", 160, "simulated nodes")
	f.IntVar(&cfg.Live, "live", 380000, "live sandboxes spread over the nodes before the run")
	f.IntVar(&cfg.Images, "images", 2000, "distinct images (Zipf popularity)")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "measured run per placer")
	f.IntVar(&cfg.Concurrency, "concurrency", 16, "placing goroutines")
	f.IntVar(&cfg.K, "k", 0, "best-of-K (0: the placer's default)")
	f.Float64Var(&cfg.Overcommit, "overcommit", 4, "CPU and memory over-commit ratio")
	f.DurationVar(&cfg.ReportInterval, "report-interval", time.Second, "each node reports once per interval")
	f.Int64Var(&cfg.Seed, "seed", 1, "seed of the simulated cluster and workload")
	return c
}
func newBenchE2BCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.E2BConfig{}
	c := &cobra.Command{
		Use:   "e2b [--n 200] [--python PY]",
		Short: "Create -> run `true` -> kill through the official E2B Python SDK (--e2b-addr) against Warren's own Python SDK, interleaved",
		Long: `Create -> run "true" -> kill cycles through the official E2B Python SDK
against Warren's E2B door, and the same through Warren's own Python SDK,
interleaved in the same run; prints both and their ratio. The private
daemon serves --e2b-addr on a free loopback port with a fresh key. Without
--python a venv is made with --e2b-requirement and the Warren SDK from
--warren-sdk (pip, from PyPI).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCounts(cfg.N, cfg.Warmup, []int{1}); err != nil {
				return err
			}
			if f := cmd.Flag("addr"); f != nil && f.Changed {
				return usagef("bench e2b starts its own daemon with --e2b-addr: it runs without --addr")
			}
			addr, keyFile, key, err := e2bBenchDoor()
			if err != nil {
				return err
			}
			defer os.Remove(keyFile)
			cfg.URL, cfg.Key = "http://"+addr, key
			return runBenchOpts(cmd, bf, func(o *bench.Options) {
				o.DaemonArgs = append(o.DaemonArgs, "--e2b-addr", addr, "--e2b-api-key-file", keyFile)
			}, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunE2B(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.N, "n", 200, "measured cycles per SDK")
	c.Flags().IntVar(&cfg.Warmup, "warmup", 10, "unmeasured cycles per SDK first")
	c.Flags().StringVar(&cfg.Python, "python", "", "a python with the e2b and warren packages installed (default: a venv made for the run)")
	c.Flags().StringVar(&cfg.E2BRequirement, "e2b-requirement", "e2b==2.63.0", "the E2B SDK the venv gets")
	c.Flags().StringVar(&cfg.WarrenSDK, "warren-sdk", "./sdk/python", "the Warren Python SDK the venv gets (a directory or a pip requirement)")
	return c
}

// e2bBenchDoor picks a free loopback port and writes a fresh API key.
func e2bBenchDoor() (addr, keyFile, key string, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", "", err
	}
	addr = ln.Addr().String()
	ln.Close()
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	key = "e2b_" + hex.EncodeToString(b)
	f, err := os.CreateTemp("", "warren-bench-e2b-key-")
	if err != nil {
		return "", "", "", err
	}
	_, err = f.WriteString(key + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return addr, f.Name(), key, err
}

// runStandalone runs a benchmark that needs no daemon (benchEnv): its
// progress on stderr unless --quiet, its report as --json-file asks and
// on stdout.
func runStandalone(cmd *cobra.Command, bf *benchFlags, run func(progress io.Writer) (bench.Report, error)) error {
	var progress io.Writer
	if !bf.quiet {
		progress = cmd.ErrOrStderr()
	}
	rep, err := run(progress)
	if err != nil {
		return err
	}
	if bf.jsonFile != "" {
		if err := writeJSONFile(bf.jsonFile, rep); err != nil {
			return err
		}
	}
	return writeReport(cmd, rep)
}

// newBenchVMCommand boots microVMs directly (internal/microvm): no daemon.
func newBenchVMCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.VMConfig{}
	c := &cobra.Command{
		Use:   "vm [--n 4] [--idle 3] [--pmem] [--layer-mib 32] [--kvm] [--guest-agent PATH]",
		Short: "MicroVM boot to agent ready (virtio-blk and pmem layers) against the bare kernel boot and a container, and idle host memory per VM with and without free page reporting and pmem DAX",
		Long: `Boot microVMs (QEMU -M microvm, the guest kernel scripts/vm.sh installs,
Warren's guest agent, a busybox EROFS layer with a --layer-mib file) one
after another and time each to its agent's first answer, with the layer on
virtio-blk and (--pmem) on persistent memory with DAX. Then hold --idle of
them at once in each memory configuration (virtio-blk with the balloon's
free page reporting, without the balloon, pmem DAX), each VM having read
the file once, and read QEMU's Pss and anonymous memory per VM, before and
after every guest dropped its page cache. Snapshot and restore are measured
once microVM sandboxes implement backend.Checkpointer (a named skip
otherwise). With --peers (the default) the same QEMU and kernel boot an
init that powers off at once (the floor), and a private daemon times
container sandboxes of the same busybox image, Create to the first exec.
The default run takes about 2 minutes on 2 loaded cores (TCG); the
issue's comparison is --n 10 --idle 16.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.N < 1 || cfg.Idle < 0 || cfg.LayerMiB < 0 {
				return errors.New("--n must be positive, --idle and --layer-mib not negative")
			}
			if cfg.GuestAgent == "" {
				cfg.GuestAgent = microvm.DefaultGuestAgent()
			}
			cfg.Peers = bf.peers
			return runStandalone(cmd, bf, func(progress io.Writer) (bench.Report, error) {
				return bench.RunVM(cmd.Context(), cfg, progress)
			})
		},
	}
	f := c.Flags()
	f.IntVar(&cfg.N, "n", 4, "measured boots per layer mode (and floor and container boots)")
	f.IntVar(&cfg.Idle, "idle", 3, "VMs held idle at once in each memory configuration")
	f.BoolVar(&cfg.Pmem, "pmem", true, "also measure layers on persistent memory with DAX")
	f.IntVar(&cfg.LayerMiB, "layer-mib", 32, "size of the file in the image each idle VM reads once")
	f.BoolVar(&cfg.KVM, "kvm", false, "boot with KVM (TCG otherwise)")
	f.BoolVar(&cfg.Vsock, "vsock", true, "also boot with the agent on vsock (the kernel's vhost-vsock, else vhost-device-vsock: scripts/vsock.sh; a named skip without either)")
	f.StringVar(&cfg.GuestAgent, "guest-agent", "", "the guest agent (default: warren-guest beside this binary)")
	return c
}

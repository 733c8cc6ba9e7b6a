package cli

import (
	"context"
	"errors"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/internal/bench"
)

func newBenchQoSCommand(bf *benchFlags) *cobra.Command {
	cfg := bench.QoSConfig{}
	c := &cobra.Command{
		Use:   "qos [--rounds 5] [--moves 20] [--iters 150000] [--be 4] [--be-loops 2] [--pin-cpu N]",
		Short: "CPU QoS: a latency-sensitive sandbox's step latency under best-effort load, without and with each mechanism",
		Long: `Create one latency-sensitive (ls) sandbox and --be best-effort sandboxes
running --be-loops busy loops each (enough to saturate every core), then
time the LS sandbox's steps: one exec of an awk loop of --iters iterations,
a fixed amount of work like a chess engine's move. Four scenarios alternate
in --rounds rounds of --moves steps: an idle node (the BE sandboxes frozen),
BE load with no QoS (every cgroup at the kernel's default weight), BE load
with best-effort as SCHED_IDLE (cpu.idle), and BE load with every mechanism
the node has (cpu.idle, the LS weight, the LS sandbox pinned to --pin-cpu,
core scheduling where the kernel has it). Reports the step latency p50/p99
and its increase over the idle node. Needs the private daemon (no --addr):
the no-QoS scenarios write the cgroups' files directly.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Rounds < 1 || cfg.Moves < 1 || cfg.Iters < 1 || cfg.BESandboxes < 1 || cfg.BELoops < 1 {
				return errors.New("--rounds, --moves, --iters, --be and --be-loops must be positive")
			}
			return runBench(cmd, bf, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
				return bench.RunQoS(ctx, env, cfg)
			})
		},
	}
	c.Flags().IntVar(&cfg.Rounds, "rounds", 5, "interleaved rounds (each runs every scenario)")
	c.Flags().IntVar(&cfg.Moves, "moves", 20, "measured steps per scenario per round")
	c.Flags().IntVar(&cfg.Iters, "iters", 150000, "iterations of the step's CPU-bound loop (150000: about 50 ms on an idle core here)")
	c.Flags().IntVar(&cfg.BESandboxes, "be", 4, "best-effort sandboxes")
	c.Flags().IntVar(&cfg.BELoops, "be-loops", 2, "busy loops in each best-effort sandbox")
	c.Flags().IntVar(&cfg.PinCPU, "pin-cpu", runtime.NumCPU()-1, "CPU the every-mechanism scenario pins the LS sandbox to (-1: not pinned)")
	return c
}

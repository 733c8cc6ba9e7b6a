package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/container"
)

// QoSConfig configures `warren bench qos`.
type QoSConfig struct {
	Rounds int // interleaved rounds: every scenario runs Moves moves in each
	Moves  int // moves per scenario per round
	Iters  int // iterations of the CPU-bound loop per move
	// BESandboxes best-effort sandboxes run BELoops busy loops each.
	BESandboxes int
	BELoops     int
	// PinCPU is the CPU the "all" scenario pins the LS sandbox to; -1
	// leaves it unpinned.
	PinCPU int
}

// QoSReport is the result of `warren bench qos`.
type QoSReport struct {
	Benchmark      string   `json:"benchmark"`
	Daemon         string   `json:"daemon"`
	Cgroups        string   `json:"cgroups"`
	CPUs           int      `json:"cpus"`
	CPUIdle        bool     `json:"cpu_idle"`
	CoreScheduling bool     `json:"core_scheduling"`
	Rounds         int      `json:"rounds"`
	Moves          int      `json:"moves_per_round"`
	Iters          int      `json:"iters_per_move"`
	BESandboxes    int      `json:"be_sandboxes"`
	BELoops        int      `json:"be_loops_each"`
	Results        []QoSRow `json:"results"`
	Notes          []string `json:"notes,omitempty"`
}

// QoSRow is one scenario: the LS step latency and its increase over the
// idle node's (p50 over p50, p99 over p99).
type QoSRow struct {
	Scenario   string  `json:"scenario"`
	Mechanisms string  `json:"mechanisms"`
	Summary            // step latency
	P50Incr    float64 `json:"p50_increase_pct"`
	P99Incr    float64 `json:"p99_increase_pct"`
	// PairedP50Incr is the median over rounds of the round's p50 over the
	// idle node's p50 in the same round: less of the node's other load,
	// which changes between rounds, in it.
	PairedP50Incr float64 `json:"paired_p50_increase_pct"`
	// Load1 is the node's 1-minute load average at the scenario's last
	// round (the node's other work shows here too).
	Load1 float64 `json:"load1"`
}

// qosScenario is one configuration of the node.
type qosScenario struct {
	name, mechanisms string
	beRunning        bool
	// set puts the sandboxes in the scenario's classes.
	set func(ctx context.Context) error
}

// RunQoS measures a latency-sensitive sandbox's step (one exec of a
// fixed-work awk loop, timed by the client: a move of a chess engine that
// searches a fixed node count) on an idle node, and while best-effort
// sandboxes saturate every core: with no QoS (every group the kernel's
// default weight, none idle), with the best-effort ones under SCHED_IDLE
// (cpu.idle), and with every mechanism the node has (cpu.idle, the LS
// weight, a pinned CPU, core scheduling where the kernel has it). The
// scenarios alternate in rounds, so that the node's other load weighs on
// all of them alike. Classes are set through UpdateSandbox; the no-QoS
// node and the LS sandbox without its weight are written into the cgroup
// files directly, which needs the private daemon.
func RunQoS(ctx context.Context, env *Env, cfg QoSConfig) (*QoSReport, error) {
	if !env.Private {
		return nil, errors.New("bench qos resets cgroups to the kernel's defaults for its no-QoS scenarios: it needs the private daemon (no --addr)")
	}
	v, err := env.Client.Version(ctx)
	if err != nil {
		return nil, err
	}
	rep := &QoSReport{Benchmark: "qos", Daemon: env.describe(), Cgroups: cgroups.Mode(), CPUs: runtime.NumCPU(),
		CPUIdle: v.GetCpuIdle(), CoreScheduling: v.GetCoreScheduling(), Rounds: cfg.Rounds, Moves: cfg.Moves,
		Iters: cfg.Iters, BESandboxes: cfg.BESandboxes, BELoops: cfg.BELoops}
	if !rep.CPUIdle {
		return nil, errors.New("the node's kernel has no cpu.idle: nothing to compare")
	}
	if cfg.PinCPU >= runtime.NumCPU() {
		return nil, fmt.Errorf("--pin-cpu %d: the node has %d CPUs", cfg.PinCPU, runtime.NumCPU())
	}

	ls, err := env.Client.Create(ctx, qosCreate(env, "ls"))
	if err != nil {
		return nil, fmt.Errorf("create the LS sandbox: %w", err)
	}
	var bes []string
	for i := 0; i < cfg.BESandboxes; i++ {
		sb, err := env.Client.Create(ctx, qosCreate(env, "be"))
		if err != nil {
			return nil, fmt.Errorf("create BE sandbox %d: %w", i, err)
		}
		bes = append(bes, sb.GetId())
		for range cfg.BELoops {
			if _, err := env.Client.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(),
				Argv: []string{"sh", "-c", "while :; do :; done"}}); err != nil {
				return nil, fmt.Errorf("start a busy loop: %w", err)
			}
		}
	}
	env.logf("created LS sandbox %s and %d BE sandboxes of %d busy loops each", ls.GetId(), len(bes), cfg.BELoops)

	resetTo := func(q cgroups.QoS, ids ...string) error {
		for _, id := range ids {
			g, err := cgroups.Load(env.cgroupParent, id)
			if err == nil {
				err = g.SetQoS(q)
			}
			if err != nil {
				return fmt.Errorf("reset the cgroup of %s: %w", id, err)
			}
		}
		return nil
	}
	reset := func(ids ...string) error { return resetTo(cgroups.QoS{}, ids...) }
	class := func(ctx context.Context, id, c string, cpus ...int32) error {
		_, err := env.Client.Update(ctx, id, client.SandboxUpdate{QoS: &c, QoSCPUs: cpus})
		return err
	}
	lsPlain := func(ctx context.Context) error {
		if err := class(ctx, ls.GetId(), "ls"); err != nil {
			return err
		}
		return reset(ls.GetId())
	}
	allMech := fmt.Sprintf("cpu.idle (be) + weight %d (ls)", container.LSWeight)
	var pin []int32
	if cfg.PinCPU >= 0 {
		pin = []int32{int32(cfg.PinCPU)}
		allMech += " + cpuset " + strconv.Itoa(cfg.PinCPU)
	}
	if rep.CoreScheduling {
		allMech += " + core scheduling"
	}
	scenarios := []qosScenario{
		{name: "idle node", mechanisms: "none (BE sandboxes frozen)", set: lsPlain},
		{name: "BE load, no QoS", mechanisms: "none: every group the default weight", beRunning: true, set: func(ctx context.Context) error {
			if err := lsPlain(ctx); err != nil {
				return err
			}
			return reset(bes...)
		}},
		{name: "BE load, be at weight 1", mechanisms: "cpu.weight 1 (be; cpu.shares 10 on v1), not idle", beRunning: true, set: func(ctx context.Context) error {
			if err := lsPlain(ctx); err != nil {
				return err
			}
			return resetTo(cgroups.QoS{Weight: 1}, bes...)
		}},
		{name: "BE load, be = SCHED_IDLE", mechanisms: "cpu.idle (be)", beRunning: true, set: func(ctx context.Context) error {
			for _, id := range bes {
				if err := class(ctx, id, "be"); err != nil {
					return err
				}
			}
			return lsPlain(ctx)
		}},
		{name: "BE load, every mechanism", mechanisms: allMech, beRunning: true, set: func(ctx context.Context) error {
			for _, id := range bes {
				if err := class(ctx, id, "be"); err != nil {
					return err
				}
			}
			return class(ctx, ls.GetId(), "ls", pin...)
		}},
	}

	samples := make([][]time.Duration, len(scenarios))
	roundP50 := make([][]float64, len(scenarios)) // per round
	loads := make([]float64, len(scenarios))
	paused := false
	script := "BEGIN{for(i=0;i<" + strconv.Itoa(cfg.Iters) + ";i++)x+=i*i%7; if(x<0)print x}"
	move := func() (time.Duration, error) {
		t0 := time.Now()
		res, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: ls.GetId(), Argv: []string{"awk", script}})
		d := time.Since(t0)
		if err == nil && res.GetExitCode() != 0 {
			err = fmt.Errorf("step exited %d: %s", res.GetExitCode(), res.GetStderr())
		}
		return d, err
	}
	for r := 0; r < cfg.Rounds; r++ {
		for i, sc := range scenarios {
			if paused && sc.beRunning {
				for _, id := range bes {
					if _, err := env.Client.Resume(ctx, id); err != nil {
						return nil, fmt.Errorf("resume %s: %w", id, err)
					}
				}
				paused = false
			}
			if err := sc.set(ctx); err != nil {
				return nil, fmt.Errorf("scenario %q: %w", sc.name, err)
			}
			if !paused && !sc.beRunning {
				for _, id := range bes {
					if _, err := env.Client.Pause(ctx, id, false); err != nil {
						return nil, fmt.Errorf("pause %s: %w", id, err)
					}
				}
				paused = true
			}
			// One move unmeasured: the scheduler settles on the new
			// weights, and the step's binary is in the page cache.
			if _, err := move(); err != nil {
				return nil, err
			}
			var round []time.Duration
			for range cfg.Moves {
				d, err := move()
				if err != nil {
					return nil, err
				}
				round = append(round, d)
			}
			samples[i] = append(samples[i], round...)
			roundP50[i] = append(roundP50[i], Summarize(round).P50)
			loads[i] = load1()
			env.logf("round %d/%d: %s: p50 %.1f ms", r+1, cfg.Rounds, sc.name, Summarize(samples[i]).P50)
		}
	}
	if paused {
		for _, id := range bes {
			_, _ = env.Client.Resume(ctx, id)
		}
	}
	base := Summarize(samples[0])
	for i, sc := range scenarios {
		s := Summarize(samples[i])
		ratios := make([]time.Duration, len(roundP50[i]))
		for r, p := range roundP50[i] {
			// Summarize works on durations: the ratio in ms units.
			ratios[r] = time.Duration(p / roundP50[0][r] * float64(time.Millisecond))
		}
		rep.Results = append(rep.Results, QoSRow{Scenario: sc.name, Mechanisms: sc.mechanisms, Summary: s,
			P50Incr: 100 * (s.P50/base.P50 - 1), P99Incr: 100 * (s.P99/base.P99 - 1),
			PairedP50Incr: 100 * (Summarize(ratios).P50 - 1), Load1: loads[i]})
	}
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("a step is one exec of awk running %d loop iterations in the LS sandbox, timed by the client over the API (the exec's own cost is in every scenario, the idle one too)", cfg.Iters),
		fmt.Sprintf("%d BE sandboxes ran %d busy loops each (%d runnable threads on %d CPUs); in the idle scenario they are frozen (Pause)", cfg.BESandboxes, cfg.BELoops, cfg.BESandboxes*cfg.BELoops, runtime.NumCPU()),
		"no QoS: the sandboxes' cgroups written back to the kernel's defaults (cpu.idle 0, the default weight), as a node without classes runs them",
		"target (issue #17): <= 10% step-latency increase under BE load with every mechanism; the reference system measured 45.2% without QoS and 17.3% with SCHED_IDLE plus core scheduling",
		"paired p50 +%: the median over rounds of each round's p50 over the idle node's in the same round",
		fmt.Sprintf("the node's load1 includes the BE loops (%d runnable threads while they run) and whatever else ran on it at the time", cfg.BESandboxes*cfg.BELoops))
	if !rep.CoreScheduling {
		rep.Notes = append(rep.Notes, "this kernel has no core scheduling (PR_SCHED_CORE): the every-mechanism scenario runs without it")
	}
	return rep, nil
}

func qosCreate(env *Env, class string) *warrenv1.CreateRequest {
	req := env.CreateRequest()
	req.Qos = class
	return req
}

// Table writes the report.
func (r *QoSReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "CPU QoS: LS step latency under BE load (daemon: %s; cgroups %s; %d CPUs; cpu.idle %v; core scheduling %v; %d rounds x %d moves of %d iterations)\n\n",
		r.Daemon, r.Cgroups, r.CPUs, r.CPUIdle, r.CoreScheduling, r.Rounds, r.Moves, r.Iters)
	t := newTable("SCENARIO", "MECHANISMS", "N", "P50 ms", "P99 ms", "P50 +%", "P99 +%", "PAIRED P50 +%", "LOAD1")
	for _, row := range r.Results {
		t.add(row.Scenario, row.Mechanisms, strconv.Itoa(row.N), ms(row.P50), ms(row.P99),
			strconv.FormatFloat(row.P50Incr, 'f', 1, 64), strconv.FormatFloat(row.P99Incr, 'f', 1, 64),
			strconv.FormatFloat(row.PairedP50Incr, 'f', 1, 64),
			strconv.FormatFloat(row.Load1, 'f', 2, 64))
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	writeNotes(w, r.Notes)
	return nil
}

package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// ExecConfig configures `warren bench exec`.
type ExecConfig struct {
	N           int
	Warmup      int
	Concurrency []int
	Peers       bool // crun exec, runc exec, nsenter
}

// ExecReport is the result of `warren bench exec`.
type ExecReport struct {
	Benchmark string   `json:"benchmark"`
	Daemon    string   `json:"daemon"`
	Warmup    int      `json:"warmup"`
	SandboxID string   `json:"sandbox_id"`
	Results   []Row    `json:"results"`
	Notes     []string `json:"notes,omitempty"`
}

// RunExec measures the round trip of Exec `true` into one live sandbox
// (client -> daemon -> agent -> fork/exec -> result), and the peers' exec
// of /bin/true into a running container.
func RunExec(ctx context.Context, env *Env, cfg ExecConfig) (*ExecReport, error) {
	rep := &ExecReport{Benchmark: "exec", Daemon: env.describe(), Warmup: cfg.Warmup}
	rep.Notes = append(rep.Notes,
		"warren: Exec(argv [\"true\"]) round trip through the client SDK into one running sandbox; per_s = completed execs / wall time",
		"peers: the whole command (crun exec / runc exec / nsenter), including its own process start")
	sb, err := env.Client.Create(ctx, env.CreateRequest())
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	rep.SandboxID = sb.GetId()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = env.Client.Delete(dctx, sb.GetId())
	}()
	iter := func(ctx context.Context, _ int) ([]time.Duration, error) {
		t0 := time.Now()
		res, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Argv: []string{"true"}})
		d := time.Since(t0)
		if err != nil {
			return nil, err
		}
		if res.GetExitCode() != 0 {
			return nil, fmt.Errorf("exec true: exit code %d, stderr %q", res.GetExitCode(), res.GetStderr())
		}
		return []time.Duration{d}, nil
	}
	var rows []Row
	for _, c := range cfg.Concurrency {
		env.logf("exec: warren, concurrency %d, %d execs (+%d warm-up)", c, cfg.N, cfg.Warmup)
		rows = append(rows, rowFrom("warren", c, Loop(ctx, cfg.N, cfg.Warmup, c, 1, iter)))
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	if cfg.Peers {
		initPid := func() (int, error) {
			if env.DaemonPid == 0 {
				return 0, fmt.Errorf("daemon pid unknown (not a local unix socket)")
			}
			return sandboxInitPid(env.DaemonPid, sb.GetId())
		}
		for _, p := range execPeers(env.Tmp, env.Rootfs, initPid) {
			rows = append(rows, runPeer(ctx, env, p, cfg.N, cfg.Warmup, cfg.Concurrency, 1, nil)...)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
	}
	rep.Results = orderRows(rows, cfg.Concurrency)
	addRatios(rep.Results)
	return rep, nil
}

// Table prints the exec report.
func (r *ExecReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "exec `true` round trip into one running sandbox (daemon: %s, warm-up %d)\n\n", r.Daemon, r.Warmup)
	t := newTable("SYSTEM", "CONC", "N", "ERR", "P50 ms", "P99 ms", "MEAN ms", "PER S", "WARREN P50 / THIS", "WARREN PER S / THIS")
	for _, row := range r.Results {
		rp50, rps := "", ""
		if row.System != "warren" {
			rp50, rps = "-", "-"
			for _, w := range r.Results {
				if w.System == "warren" && w.Concurrency == row.Concurrency {
					k := peerKey(row.System)
					rp50, rps = ratioStr(w.Ratios["vs_"+k+"_p50"]), ratioStr(w.Ratios["vs_"+k+"_per_s"])
				}
			}
		}
		t.add(row.System, strconv.Itoa(row.Concurrency), strconv.Itoa(row.N), strconv.Itoa(row.Errors),
			ms(row.P50), ms(row.P99), ms(row.Mean), num(row.PerS), rp50, rps)
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	writeRowProblems(w, r.Results)
	writeNotes(w, r.Notes)
	return nil
}

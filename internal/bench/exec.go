package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// ExecConfig configures `warren bench exec`.
type ExecConfig struct {
	N           int
	Warmup      int
	Concurrency []int
	Peers       bool // crun exec, runc exec, nsenter
	// Harness also measures the exec through a harness sandbox's route
	// into its child, beside the node socket's into the same child
	// (a private daemon only: the route's socket is in its run dir).
	Harness bool
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
	defer func(id string) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = env.Client.Delete(dctx, id)
	}(sb.GetId())
	systems := []struct {
		name string
		c    *client.Client
	}{{"warren", env.Client}}
	if cfg.Harness {
		// The harness's child is the sandbox of every row: the rows
		// differ in the path of the call only.
		route, child, done, err := harnessChild(ctx, env)
		if err != nil {
			return nil, err
		}
		defer done()
		sb = child // deleted with the harness
		rep.SandboxID = sb.GetId()
		systems = append(systems, struct {
			name string
			c    *client.Client
		}{"warren via harness route", route})
		rep.Notes = append(rep.Notes, "with --harness: every row execs into a harness's child; \"warren via harness route\" calls through the harness's socket (its scope check included)")
	}
	var cl *client.Client
	iter := func(ctx context.Context, _ int) ([]time.Duration, error) {
		t0 := time.Now()
		res, err := cl.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Argv: []string{"true"}})
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
	for _, sys := range systems {
		cl = sys.c
		for _, c := range cfg.Concurrency {
			env.logf("exec: %s, concurrency %d, %d execs (+%d warm-up)", sys.name, c, cfg.N, cfg.Warmup)
			rows = append(rows, rowFrom(sys.name, c, Loop(ctx, cfg.N, cfg.Warmup, c, 1, iter)))
			if err := ctx.Err(); err != nil {
				return nil, err
			}
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

// harnessChild creates a harness sandbox and a child through its route,
// and returns a client of the route, the child, and a func that deletes
// the harness (and with it the child).
func harnessChild(ctx context.Context, env *Env) (*client.Client, *warrenv1.Sandbox, func(), error) {
	if !env.Private {
		return nil, nil, nil, fmt.Errorf("--harness needs a private daemon (its route is in the daemon's run dir)")
	}
	req := env.CreateRequest()
	req.Harness = &warrenv1.HarnessOptions{}
	h, err := env.Client.Create(ctx, req)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create harness: %w", err)
	}
	route, err := client.New("unix://" + filepath.Join(env.Tmp, "run", "devfs", h.GetId(), "warren.sock"))
	done := func() {
		if route != nil {
			route.Close()
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = env.Client.Delete(dctx, h.GetId())
	}
	if err != nil {
		done()
		return nil, nil, nil, err
	}
	child, err := route.Create(ctx, &warrenv1.CreateRequest{Image: env.Image})
	if err != nil {
		done()
		return nil, nil, nil, fmt.Errorf("create a child through the harness's route: %w", err)
	}
	return route, child, done, nil
}

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// CreateConfig configures `warren bench create`.
type CreateConfig struct {
	N           int   // measured cycles per system and concurrency
	Warmup      int   // unmeasured cycles before each run
	Concurrency []int // e.g. 1 and 8
	Peers       bool  // also measure crun, runc and unshare+chroot
	// Pause is slept by each worker before every cycle (not measured; it
	// does count in per_s): creation on an otherwise idle host.
	Pause time.Duration
	// Backends are the backends Warren's sandboxes are created with, each
	// a row ("warren" for the default, "warren <name>" for another); nil
	// or empty: the default only.
	Backends []string
}

// paced sleeps pause before each iteration.
func paced(pause time.Duration, it Iteration) Iteration {
	if pause <= 0 {
		return it
	}
	return func(ctx context.Context, w int) ([]time.Duration, error) {
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return it(ctx, w)
	}
}

// Row is one system at one concurrency.
type Row struct {
	System      string  `json:"system"`
	Concurrency int     `json:"concurrency"`
	N           int     `json:"n"`
	Errors      int     `json:"errors"`
	P50         float64 `json:"p50_ms"`
	P99         float64 `json:"p99_ms"`
	Mean        float64 `json:"mean_ms"`
	PerS        float64 `json:"per_s"`
	WallS       float64 `json:"wall_s"`

	// Create benchmark: the whole cycle including cleanup.
	CycleP50  *float64 `json:"cycle_p50_ms,omitempty"`
	CycleP99  *float64 `json:"cycle_p99_ms,omitempty"`
	CycleMean *float64 `json:"cycle_mean_ms,omitempty"`
	// Warren's create benchmark: its three calls separately.
	CreateP50 *float64 `json:"create_p50_ms,omitempty"`
	CreateP99 *float64 `json:"create_p99_ms,omitempty"`
	ExecP50   *float64 `json:"exec_p50_ms,omitempty"`
	ExecP99   *float64 `json:"exec_p99_ms,omitempty"`
	DeleteP50 *float64 `json:"delete_p50_ms,omitempty"`
	DeleteP99 *float64 `json:"delete_p99_ms,omitempty"`

	// Ratios on Warren's rows: Warren's p50 (or per_s) divided by the
	// peer's at the same concurrency ("vs_crun_p50": 0.5 means Warren's
	// median latency is half crun's). Keys are vs_<peer>_p50 and
	// vs_<peer>_per_s.
	Ratios map[string]*float64 `json:"-"`

	Note  string `json:"note,omitempty"`
	Error string `json:"error,omitempty"`
}

// MarshalJSON flattens the ratios into the row object.
func (r Row) MarshalJSON() ([]byte, error) {
	type plain Row
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	keys := slices.Sorted(maps.Keys(r.Ratios))
	extra := []byte{}
	for _, k := range keys {
		if v := r.Ratios[k]; v != nil {
			extra = fmt.Appendf(extra, ",%q:%s", k, strconv.FormatFloat(*v, 'f', -1, 64))
		}
	}
	// b ends in '}'.
	return append(append(b[:len(b)-1:len(b)-1], extra...), '}'), nil
}

func ptr(v float64) *float64 {
	v = round(v, 3)
	return &v
}

// rowFrom fills a row from a loop result whose metric 0 is the headline
// latency.
func rowFrom(system string, conc int, r LoopResult) Row {
	s := Summarize(r.Samples[0])
	row := Row{
		System: system, Concurrency: conc, N: r.Done, Errors: r.Errors,
		P50: round(s.P50, 3), P99: round(s.P99, 3), Mean: round(s.Mean, 3),
		PerS: round(r.PerSecond(), 1), WallS: round(r.Wall.Seconds(), 3),
	}
	if r.FirstErr != nil {
		row.Error = r.FirstErr.Error()
	}
	return row
}

// peerKey is the ratio key of a system: "unshare+chroot" -> "unshare",
// "crun exec" -> "crun_exec".
func peerKey(system string) string {
	system = strings.SplitN(system, "+", 2)[0]
	return strings.ReplaceAll(system, " ", "_")
}

// addRatios sets Warren's ratios against every other row of the same
// concurrency.
func addRatios(rows []Row) {
	for i := range rows {
		if rows[i].System != "warren" {
			continue
		}
		w := &rows[i]
		w.Ratios = map[string]*float64{}
		for _, p := range rows {
			if p.System == "warren" || p.Concurrency != w.Concurrency {
				continue
			}
			k := peerKey(p.System)
			w.Ratios["vs_"+k+"_p50"] = ratio(w.P50, p.P50)
			w.Ratios["vs_"+k+"_per_s"] = ratio(w.PerS, p.PerS)
		}
	}
}

// CreateReport is the result of `warren bench create`.
type CreateReport struct {
	Benchmark string   `json:"benchmark"`
	Daemon    string   `json:"daemon"`
	Warmup    int      `json:"warmup"`
	Results   []Row    `json:"results"`
	Notes     []string `json:"notes,omitempty"`
}

// RunCreate measures create -> exec `true` -> delete cycles of Warren and
// the run-and-clean-up of /bin/true by the peers.
func RunCreate(ctx context.Context, env *Env, cfg CreateConfig) (*CreateReport, error) {
	rep := &CreateReport{Benchmark: "create", Daemon: env.describe(), Warmup: cfg.Warmup}
	if cfg.Pause > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("every worker paused %v before each cycle: latencies are those of an otherwise idle host; per_s includes the pauses", cfg.Pause))
	}
	rep.Notes = append(rep.Notes,
		"warren: p50/p99/mean are create-to-first-exec-result (Create + Exec `true`); cycle adds Delete; per_s = completed cycles / wall time",
		"peers: p50/p99/mean are the run of /bin/true in a fresh container (start, wait for exit); cycle adds the cleanup command")
	var rows []Row
	backends := cfg.Backends
	if len(backends) == 0 {
		backends = []string{""}
	}
	for _, c := range cfg.Concurrency {
		for _, be := range backends {
			system := "warren"
			if be != "" && be != "container" {
				system += " " + be
			}
			req := func() *warrenv1.CreateRequest {
				r := env.CreateRequest()
				r.Backend = be
				return r
			}
			env.logf("create: %s, concurrency %d, %d cycles (+%d warm-up)", system, c, cfg.N, cfg.Warmup)
			rows = append(rows, warrenCreateRow(system, c, Loop(ctx, cfg.N, cfg.Warmup, c, 5, paced(cfg.Pause, WarrenCycle(env.Client, req)))))
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
	}
	if cfg.Peers {
		for _, p := range runPeers(env.Tmp, env.Rootfs) {
			p.iter = paced(cfg.Pause, p.iter)
			rows = append(rows, runPeer(ctx, env, p, cfg.N, cfg.Warmup, cfg.Concurrency, 2, func(row *Row, r LoopResult) {
				if len(r.Samples[1]) > 0 {
					cy := Summarize(r.Samples[1])
					row.CycleP50, row.CycleP99, row.CycleMean = ptr(cy.P50), ptr(cy.P99), ptr(cy.Mean)
				}
			})...)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
	}
	rep.Results = orderRows(rows, cfg.Concurrency)
	addRatios(rep.Results)
	return rep, nil
}

// warrenCreateRow is a row of Warren's create cycles, with their calls'
// latencies.
func warrenCreateRow(system string, c int, r LoopResult) Row {
	row := rowFrom(system, c, r)
	if len(r.Samples[0]) > 0 {
		cy, cr, ex, de := Summarize(r.Samples[1]), Summarize(r.Samples[2]), Summarize(r.Samples[3]), Summarize(r.Samples[4])
		row.CycleP50, row.CycleP99, row.CycleMean = ptr(cy.P50), ptr(cy.P99), ptr(cy.Mean)
		row.CreateP50, row.CreateP99 = ptr(cr.P50), ptr(cr.P99)
		row.ExecP50, row.ExecP99 = ptr(ex.P50), ptr(ex.P99)
		row.DeleteP50, row.DeleteP99 = ptr(de.P50), ptr(de.P99)
	}
	return row
}

// runPeer sets a peer up, runs it at every concurrency and tears it down.
func runPeer(ctx context.Context, env *Env, p *peer, n, warmup int, concs []int, metrics int, extra func(*Row, LoopResult)) []Row {
	var rows []Row
	env.logf("%s: setting up", p.system)
	err := p.setup(ctx)
	if p.teardown != nil {
		defer p.teardown()
	}
	if err != nil {
		env.logf("%s: skipped: %v", p.system, err)
		for _, c := range concs {
			rows = append(rows, Row{System: p.system, Concurrency: c, Note: p.note, Error: "setup: " + err.Error()})
		}
		return rows
	}
	for _, c := range concs {
		env.logf("%s: concurrency %d, %d iterations (+%d warm-up)", p.system, c, n, warmup)
		r := Loop(ctx, n, warmup, c, metrics, p.iter)
		row := rowFrom(p.system, c, r)
		row.Note = p.note
		if extra != nil {
			extra(&row, r)
		}
		rows = append(rows, row)
		if ctx.Err() != nil {
			break
		}
	}
	return rows
}

// orderRows sorts rows by concurrency (in the order given), keeping the
// system order within one concurrency.
func orderRows(rows []Row, concs []int) []Row {
	out := make([]Row, 0, len(rows))
	for _, c := range concs {
		for _, r := range rows {
			if r.Concurrency == c {
				out = append(out, r)
			}
		}
	}
	return out
}

// warrenCycle: Create, Exec `true`, Delete on env's daemon.
func warrenCycle(env *Env) Iteration { return WarrenCycle(env.Client, env.CreateRequest) }

// WarrenCycle: Create (with req's request), Exec `true`, Delete on the
// daemon c talks to. Metrics: [create+exec, cycle, create, exec, delete].
func WarrenCycle(c *client.Client, req func() *warrenv1.CreateRequest) Iteration {
	return func(ctx context.Context, _ int) ([]time.Duration, error) {
		t0 := time.Now()
		sb, err := c.Create(ctx, req())
		if err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		t1 := time.Now()
		res, xerr := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Argv: []string{"true"}})
		t2 := time.Now()
		derr := c.Delete(ctx, sb.GetId())
		t3 := time.Now()
		switch {
		case xerr != nil:
			return nil, fmt.Errorf("exec: %w", xerr)
		case res.GetExitCode() != 0:
			return nil, fmt.Errorf("exec true: exit code %d, stderr %q", res.GetExitCode(), res.GetStderr())
		case derr != nil:
			return nil, fmt.Errorf("delete: %w", derr)
		}
		return []time.Duration{t2.Sub(t0), t3.Sub(t0), t1.Sub(t0), t2.Sub(t1), t3.Sub(t2)}, nil
	}
}

func (e *Env) describe() string {
	if e.Private {
		return "private (" + e.Addr + ")"
	}
	return e.Addr
}

// Table prints the create report.
func (r *CreateReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "create -> exec `true` -> delete (daemon: %s, warm-up %d)\n\n", r.Daemon, r.Warmup)
	t := newTable("SYSTEM", "CONC", "N", "ERR", "P50 ms", "P99 ms", "MEAN ms", "CYCLE P50", "CYCLE P99", "PER S", "WARREN P50 / THIS", "WARREN PER S / THIS")
	for _, row := range r.Results {
		var rp50, rps string = "", ""
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
			ms(row.P50), ms(row.P99), ms(row.Mean), msPtr(row.CycleP50), msPtr(row.CycleP99), num(row.PerS), rp50, rps)
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, row := range r.Results {
		if strings.HasPrefix(row.System, "warren") && row.CreateP50 != nil {
			fmt.Fprintf(w, "%s at concurrency %d, p50/p99 ms: create %s/%s, exec %s/%s, delete %s/%s\n", row.System, row.Concurrency,
				msPtr(row.CreateP50), msPtr(row.CreateP99), msPtr(row.ExecP50), msPtr(row.ExecP99), msPtr(row.DeleteP50), msPtr(row.DeleteP99))
		}
	}
	writeRowProblems(w, r.Results)
	writeNotes(w, r.Notes)
	return nil
}

func msPtr(v *float64) string {
	if v == nil {
		return "-"
	}
	return ms(*v)
}

// writeRowProblems prints the notes and errors of rows, once per system.
func writeRowProblems(w io.Writer, rows []Row) {
	seen := map[string]bool{}
	for _, row := range rows {
		if row.Note != "" && !seen[row.System+"\x00"+row.Note] {
			seen[row.System+"\x00"+row.Note] = true
			fmt.Fprintf(w, "note: %s: %s\n", row.System, row.Note)
		}
		if row.Error != "" {
			fmt.Fprintf(w, "error: %s (concurrency %d): %d failed; first: %s\n", row.System, row.Concurrency, row.Errors, row.Error)
		}
	}
}

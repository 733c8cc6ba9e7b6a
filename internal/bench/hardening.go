package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// HardeningConfig sizes `warren bench hardening`.
type HardeningConfig struct {
	N        int // measured create -> exec -> delete cycles per daemon
	Warmup   int
	Syscalls int // read+write pairs of the syscall-bound exec (dd bs=1)
	Runs     int // measured runs of it per daemon
	// Feature is what the two daemons differ in: "seccomp" (the
	// default: the filters against --seccomp=false) or "userns" (--userns
	// against without).
	Feature string
}

// HardeningFeatures are the features bench hardening compares, with the
// `warren serve` flags of the daemon with it and of the one without.
var HardeningFeatures = map[string][2][]string{
	"seccomp": {nil, {"--seccomp=false"}},
	"userns":  {{"--userns"}, {"--userns=false"}},
}

// HardeningReport compares a daemon with the default hardening (seccomp
// filters, no_new_privs) against the same binary with --seccomp=false,
// both private, run alternately so that the machine's drift hits both.
type HardeningReport struct {
	Feature string           `json:"feature"`
	Cycles  int              `json:"cycles"`
	Rows    []HardeningRow   `json:"rows"`
	Sys     HardeningSyscall `json:"syscalls"`
	Notes   []string         `json:"notes,omitempty"`
}

// HardeningRow is one latency with the filter and without it.
type HardeningRow struct {
	Metric          string  `json:"metric"`
	WithP50         float64 `json:"with_p50_ms"`
	WithP99         float64 `json:"with_p99_ms"`
	WithoutP50      float64 `json:"without_p50_ms"`
	WithoutP99      float64 `json:"without_p99_ms"`
	RatioP50        float64 `json:"ratio_p50"`         // with / without
	PairRatioMedian float64 `json:"pair_ratio_median"` // median of cycle-by-cycle ratios
}

// HardeningSyscall is the syscall-bound exec: dd copying one byte at a
// time, so that nearly all its time is system calls.
type HardeningSyscall struct {
	Calls      int     `json:"calls"`
	WithP50    float64 `json:"with_p50_ms"`
	WithoutP50 float64 `json:"without_p50_ms"`
	RatioP50   float64 `json:"ratio_p50"`
	NsPerCall  float64 `json:"overhead_ns_per_call"`
}

// RunHardening runs both daemons' cycles and syscall-bound execs in turn.
// without is the daemon started with --seccomp=false.
func RunHardening(ctx context.Context, with, without *Env, cfg HardeningConfig) (*HardeningReport, error) {
	envs := [2]*Env{with, without}
	if cfg.Feature == "" {
		cfg.Feature = "seccomp"
	}
	samples, err := Alternate(ctx, [2]Iteration{warrenCycle(with), warrenCycle(without)}, [2]string{side(cfg.Feature, 0), side(cfg.Feature, 1)}, cfg.Warmup, cfg.N)
	if err != nil {
		return nil, err
	}
	rep := &HardeningReport{Feature: cfg.Feature, Cycles: cfg.N}
	// WarrenCycle's metrics: [create+exec, cycle, create, exec, delete].
	for _, m := range []struct {
		name string
		idx  int
	}{{"create", 2}, {"create_to_first_exec", 0}, {"exec", 3}, {"delete", 4}} {
		p := ComparePaired(samples[0], samples[1], m.idx)
		rep.Rows = append(rep.Rows, HardeningRow{
			Metric: m.name, WithP50: p.NumP50, WithP99: p.NumP99, WithoutP50: p.DenP50, WithoutP99: p.DenP99,
			RatioP50: p.RatioP50, PairRatioMedian: p.PairRatioMedian,
		})
	}
	sys, err := syscallBound(ctx, envs, cfg)
	if err != nil {
		return nil, err
	}
	rep.Sys = sys
	if cfg.Feature == "userns" {
		rep.Notes = append(rep.Notes, "with: every sandbox in a user namespace of its own (--userns: idmapped layers, the init joins the namespace last); without: the same binary without")
	} else {
		rep.Notes = append(rep.Notes, "with: the default hardening (seccomp policy and audit filters, no_new_privs); without: the same binary with --seccomp=false (no_new_privs stays)")
	}
	return rep, nil
}

// syscallBound times `dd bs=1` in one sandbox of each daemon, in turn.
func syscallBound(ctx context.Context, envs [2]*Env, cfg HardeningConfig) (HardeningSyscall, error) {
	var ids [2]string
	for i, e := range envs {
		sb, err := e.Client.Create(ctx, e.CreateRequest())
		if err != nil {
			return HardeningSyscall{}, fmt.Errorf("%s: create: %w", side(cfg.Feature, i), err)
		}
		ids[i] = sb.GetId()
		defer e.Client.Delete(context.WithoutCancel(ctx), sb.GetId())
	}
	argv := []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=" + strconv.Itoa(cfg.Syscalls)}
	var t [2][]float64
	for i := range cfg.Runs + 1 {
		for _, s := range abba(i) {
			start := time.Now()
			res, err := envs[s].Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: ids[s], Argv: argv})
			if err == nil && res.GetExitCode() != 0 {
				err = fmt.Errorf("dd: exit %d: %s", res.GetExitCode(), res.GetStderr())
			}
			if err != nil {
				return HardeningSyscall{}, fmt.Errorf("%s: %w", side(cfg.Feature, s), err)
			}
			if i > 0 { // the first round warms up
				t[s] = append(t[s], msOf(time.Since(start)))
			}
		}
	}
	slices.Sort(t[0])
	slices.Sort(t[1])
	a, b := Percentile(t[0], 50), Percentile(t[1], 50)
	calls := 2 * cfg.Syscalls
	return HardeningSyscall{Calls: calls, WithP50: a, WithoutP50: b, RatioP50: a / b,
		NsPerCall: (a - b) * 1e6 / float64(calls)}, nil
}

func side(feature string, i int) string {
	what := "the filter"
	if feature == "userns" {
		what = "user namespaces"
	}
	if i == 0 {
		return "daemon with " + what
	}
	return "daemon without " + what
}

// Table prints the report.
func (r *HardeningReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "hardening (%s): %d create -> exec `true` -> delete cycles per daemon, alternating\n\n", r.Feature, r.Cycles)
	t := newTable("METRIC", "WITH P50 ms", "WITH P99 ms", "WITHOUT P50 ms", "WITHOUT P99 ms", "WITH/WITHOUT P50", "PAIR MEDIAN")
	for _, row := range r.Rows {
		t.add(row.Metric, ms(row.WithP50), ms(row.WithP99), ms(row.WithoutP50), ms(row.WithoutP99),
			strconv.FormatFloat(row.RatioP50, 'f', 3, 64), strconv.FormatFloat(row.PairRatioMedian, 'f', 3, 64))
	}
	t.add(fmt.Sprintf("dd bs=1 (%d calls)", r.Sys.Calls), ms(r.Sys.WithP50), "", ms(r.Sys.WithoutP50), "",
		strconv.FormatFloat(r.Sys.RatioP50, 'f', 3, 64), fmt.Sprintf("%+.1f ns/call", r.Sys.NsPerCall))
	if err := t.write(w); err != nil {
		return err
	}
	writeNotes(w, r.Notes)
	return nil
}

// ErrHardeningNeedsPrivate: the comparison starts both daemons itself.
var ErrHardeningNeedsPrivate = errors.New("bench hardening starts its own two daemons: do not pass --addr")

package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/cgroups"
)

// HibernateConfig configures `warren bench hibernate`.
type HibernateConfig struct {
	Rounds        int // freeze+thaw rounds
	ReclaimRounds int // pause-with-reclaim rounds (each refills the page cache first)
	AnonMiB       int // anonymous memory the sandbox holds
	CacheMiB      int // page cache it reads before each reclaim
	Peers         bool
	// CheckpointRounds of hibernate and restore (0: none); Forks is how
	// many copies the fork case makes (0: no fork case). Both need CRIU
	// (CRIUPath).
	CheckpointRounds int
	Forks            int
	CRIUPath         string
	// UserNS measures a sandbox in a user namespace (the daemon's
	// default) instead of one without.
	UserNS bool
	// ReplaySteps of a trajectory log recorded before the checkpoints and
	// replayed Replays times after them (0: no replay case).
	ReplaySteps, Replays int
}

// HibernateReport is the result of `warren bench hibernate`.
type HibernateReport struct {
	Benchmark string         `json:"benchmark"`
	Daemon    string         `json:"daemon"`
	Cgroups   string         `json:"cgroups"` // v1, hybrid or v2
	SwapBytes uint64         `json:"swap_bytes"`
	AnonMiB   int            `json:"anon_mib"`
	CacheMiB  int            `json:"cache_mib"`
	UserNS    bool           `json:"userns"`
	Results   []HibernateRow `json:"results"`
	Notes     []string       `json:"notes,omitempty"`
}

// HibernateRow is one case and system: latency, and for reclaiming
// cases the memory given back (p50 of the rounds).
type HibernateRow struct {
	Case   string `json:"case"`
	System string `json:"system"`
	Summary
	BeforeMiB *float64 `json:"before_mib,omitempty"`
	// ArtifactMiB: the checkpoint's size on disk (p50).
	ArtifactMiB *float64 `json:"artifact_mib,omitempty"`
	AfterMiB    *float64 `json:"after_mib,omitempty"`
	FreedMiB    *float64 `json:"freed_mib,omitempty"`
	TargetMs    float64  `json:"target_ms,omitempty"`
}

// RunHibernate measures pausing in place on one sandbox holding
// cfg.AnonMiB of anonymous memory and cfg.CacheMiB of page cache:
// freeze+thaw (Pause without reclaim, then Resume, through the API), and
// Pause with reclaim (its latency and the memory it gave back). The peer
// is the floor: the same cgroup frozen and thawed (and reclaimed) by
// writing its files directly, without the daemon or the API; it needs
// the private daemon (its cgroup parent).
func RunHibernate(ctx context.Context, env *Env, cfg HibernateConfig) (*HibernateReport, error) {
	swap, _ := cgroups.SwapTotal()
	rep := &HibernateReport{Benchmark: "hibernate", Daemon: env.describe(), Cgroups: cgroups.Mode(), SwapBytes: swap,
		AnonMiB: cfg.AnonMiB, CacheMiB: cfg.CacheMiB, UserNS: cfg.UserNS}
	req := env.CreateRequest()
	req.Resources = &warrenv1.Resources{MemoryBytes: int64(cfg.AnonMiB*2+cfg.CacheMiB+256) << 20}
	// Explicit either way, so that runs compare: without a user
	// namespace unless asked (the numbers in docs/BENCHMARKS.md before
	// user-namespace sandboxes could hibernate).
	req.UserNamespace = &cfg.UserNS
	sb, err := env.Client.Create(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	id := sb.GetId()
	defer func() { _ = env.Client.Delete(context.WithoutCancel(ctx), id) }()
	sh := func(script string) error {
		res, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"sh", "-c", script}, TimeoutMs: 600_000})
		if err != nil {
			return err
		}
		if res.GetExitCode() != 0 {
			return fmt.Errorf("%q: exit %d: %s", script, res.GetExitCode(), res.GetStderr())
		}
		return nil
	}
	env.logf("hibernate: sandbox %s: %d MiB of anonymous memory, %d MiB file", id, cfg.AnonMiB, cfg.CacheMiB)
	// The shell keeps the variable: cfg.AnonMiB of its heap, touched.
	if _, err := env.Client.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"sh", "-c",
		fmt.Sprintf("x=$(head -c %d /dev/zero | tr '\\0' a); touch /tmp/held; while :; do sleep 1000; done", cfg.AnonMiB<<20)}}); err != nil {
		return nil, fmt.Errorf("start the memory holder: %w", err)
	}
	if err := sh(fmt.Sprintf("head -c %d /dev/zero > /cache && sync && while [ ! -e /tmp/held ]; do sleep 0.05; done", cfg.CacheMiB<<20)); err != nil {
		return nil, err
	}
	fill := func() error { return sh("cat /cache > /dev/null") }
	if err := fill(); err != nil {
		return nil, err
	}

	var grp cgroups.Group
	if cfg.Peers && env.cgroupParent != "" {
		if grp, err = cgroups.Load(env.cgroupParent, id); err != nil {
			return nil, fmt.Errorf("load the sandbox's cgroup for the peer: %w", err)
		}
	}

	// Freeze+thaw, the API against the raw cgroup, alternating rounds so
	// that both see the same conditions.
	env.logf("hibernate: freeze+thaw, %d rounds", cfg.Rounds)
	var api, apiPause, apiResume, raw []time.Duration
	for range cfg.Rounds {
		t0 := time.Now()
		if _, err := env.Client.Pause(ctx, id, false); err != nil {
			return nil, fmt.Errorf("pause: %w", err)
		}
		t1 := time.Now()
		if _, err := env.Client.Resume(ctx, id); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		t2 := time.Now()
		api, apiPause, apiResume = append(api, t2.Sub(t0)), append(apiPause, t1.Sub(t0)), append(apiResume, t2.Sub(t1))
		if grp != nil {
			t0 := time.Now()
			if err := grp.Freeze(); err != nil {
				return nil, fmt.Errorf("raw freeze: %w", err)
			}
			if err := grp.Thaw(); err != nil {
				return nil, fmt.Errorf("raw thaw: %w", err)
			}
			raw = append(raw, time.Since(t0))
		}
	}
	rep.Results = append(rep.Results,
		HibernateRow{Case: "freeze+thaw", System: "warren", Summary: Summarize(api), TargetMs: 20},
		HibernateRow{Case: "pause (no reclaim)", System: "warren", Summary: Summarize(apiPause)},
		HibernateRow{Case: "resume", System: "warren", Summary: Summarize(apiResume)})
	if grp != nil {
		rep.Results = append(rep.Results, HibernateRow{Case: "freeze+thaw", System: "raw cgroup", Summary: Summarize(raw)})
	}

	// One round not counted: the file's pages start on the active list
	// (written, then read), and the first reclaim also deactivates them
	// (~160 ms here, whichever system goes first); later rounds find
	// them where a cache read once leaves them.
	if err := fill(); err != nil {
		return nil, err
	}
	if _, err := env.Client.Pause(ctx, id, true); err != nil {
		return nil, fmt.Errorf("pause with reclaim: %w", err)
	}
	if _, err := env.Client.Resume(ctx, id); err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	env.logf("hibernate: pause with reclaim, %d rounds", cfg.ReclaimRounds)
	var rec, rawRec []time.Duration
	var before, after, rawBefore, rawAfter []float64
	for range cfg.ReclaimRounds {
		if err := fill(); err != nil {
			return nil, err
		}
		t0 := time.Now()
		res, err := env.Client.Pause(ctx, id, true)
		if err != nil {
			return nil, fmt.Errorf("pause with reclaim: %w", err)
		}
		rec = append(rec, time.Since(t0))
		before, after = append(before, mibF(res.GetBefore().GetBytes())), append(after, mibF(res.GetAfter().GetBytes()))
		if _, err := env.Client.Resume(ctx, id); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		if grp != nil {
			if err := fill(); err != nil {
				return nil, err
			}
			t0 := time.Now()
			if err := grp.Freeze(); err != nil {
				return nil, err
			}
			m0, err := grp.Memory()
			if err != nil {
				_ = grp.Thaw()
				return nil, err
			}
			if err := grp.Reclaim(); err != nil {
				_ = grp.Thaw()
				return nil, err
			}
			m1, err := grp.Memory()
			rawRec = append(rawRec, time.Since(t0))
			if terr := grp.Thaw(); err != nil || terr != nil {
				return nil, fmt.Errorf("raw reclaim: %v %v", err, terr)
			}
			rawBefore, rawAfter = append(rawBefore, mibF(m0.Usage)), append(rawAfter, mibF(m1.Usage))
		}
	}
	rep.Results = append(rep.Results, reclaimRow("warren", rec, before, after))
	if grp != nil {
		rep.Results = append(rep.Results, reclaimRow("raw cgroup", rawRec, rawBefore, rawAfter))
	}
	// The log is recorded before the checkpoints and replayed after
	// them, as a rollout resumed from a hibernated sandbox would.
	lg := replayLog{env: env, id: id, session: "bench-replay", steps: cfg.ReplaySteps}
	var recorded time.Duration
	if cfg.ReplaySteps > 0 {
		env.logf("hibernate: recording a %d-step trajectory log", cfg.ReplaySteps)
		if recorded, err = lg.record(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.CheckpointRounds > 0 || cfg.Forks > 0 {
		rows, notes, err := checkpointRows(ctx, env, cfg, id, sh)
		if err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, rows...)
		rep.Notes = append(rep.Notes, notes...)
	}
	if cfg.ReplaySteps > 0 {
		rows, err := replayRows(ctx, lg, cfg.Replays, recorded)
		if err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, rows...)
		rep.Notes = append(rep.Notes, fmt.Sprintf("replay: a %d-step log of execs (each appends a line to a file) recorded before the checkpoints and the same calls made again after them: through the Go SDK's rollout (one read of the session's log, then each call answered from it), and each sent to the daemon, which answers from the log; the file has each line once after (nothing ran again)", cfg.ReplaySteps))
	}
	rep.Notes = append(rep.Notes,
		"warren: Pause and Resume through the Go client, request to reply; freeze+thaw is the two calls back to back",
		"raw cgroup: the sandbox's own cgroup frozen, waited on until frozen and thawed (and reclaimed) by writing its files from the benchmark: the kernel's floor, without daemon or API",
		"pause with reclaim: the page cache is refilled (cat of the file) before every round, after one round not counted; before/after are the cgroup's whole charge",
		fmt.Sprintf("cgroups %s; node swap %d bytes: %s", rep.Cgroups, swap, swapNote(swap)))
	return rep, nil
}

// replayRows replays lg n times each way, then checks that nothing ran.
func replayRows(ctx context.Context, lg replayLog, n int, recorded time.Duration) ([]HibernateRow, error) {
	lg.env.logf("hibernate: replaying the log, %d times each way", n)
	var ro, srv []time.Duration
	for range n {
		took, err := lg.replayRollout(ctx, nil)
		if err != nil {
			return nil, err
		}
		ro = append(ro, took)
		if took, err = lg.replayServer(ctx); err != nil {
			return nil, err
		}
		srv = append(srv, took)
	}
	if err := lg.ranOnce(ctx); err != nil {
		return nil, err
	}
	steps := strconv.Itoa(lg.steps)
	return []HibernateRow{
		{Case: "record " + steps + " steps (live)", System: "warren", Summary: Summarize([]time.Duration{recorded})},
		{Case: "replay of the " + steps + "-step log", System: "Go rollout", Summary: Summarize(ro), TargetMs: 100},
		{Case: "replay of the " + steps + "-step log", System: "daemon", Summary: Summarize(srv)},
	}, nil
}

func swapNote(swap uint64) string {
	if swap == 0 {
		return "anonymous memory cannot be given back, only page cache"
	}
	return "anonymous memory is pushed to swap too"
}

func mibF(b uint64) float64 { return float64(b) / (1 << 20) }

func reclaimRow(system string, ds []time.Duration, before, after []float64) HibernateRow {
	p50 := func(v []float64) *float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		x := round(Percentile(s, 50), 1)
		return &x
	}
	freed := make([]float64, len(before))
	for i := range before {
		freed[i] = before[i] - after[i]
	}
	return HibernateRow{Case: "pause with reclaim", System: system, Summary: Summarize(ds),
		BeforeMiB: p50(before), AfterMiB: p50(after), FreedMiB: p50(freed)}
}

// Table prints the hibernate report.
func (r *HibernateReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "pause, hibernate, restore, fork (daemon: %s; %d MiB anonymous + %d MiB page cache; cgroups %s; swap %d bytes)\n\n",
		r.Daemon, r.AnonMiB, r.CacheMiB, r.Cgroups, r.SwapBytes)
	t := newTable("CASE", "SYSTEM", "N", "P50 ms", "P99 ms", "MAX ms", "TARGET", "BEFORE MiB", "AFTER MiB", "FREED MiB", "ARTIFACT MiB")
	opt := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatFloat(*v, 'f', 1, 64)
	}
	for _, row := range r.Results {
		target := "-"
		if row.TargetMs > 0 {
			target = "<= " + ms(row.TargetMs)
		}
		t.add(row.Case, row.System, strconv.Itoa(row.N), ms(row.P50), ms(row.P99), ms(row.Max), target,
			opt(row.BeforeMiB), opt(row.AfterMiB), opt(row.FreedMiB), opt(row.ArtifactMiB))
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	writeNotes(w, r.Notes)
	return nil
}

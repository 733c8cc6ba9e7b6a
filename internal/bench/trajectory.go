package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TrajectoryConfig configures `warren bench trajectory`.
type TrajectoryConfig struct {
	Steps   int // steps of the replayed log
	Replays int // times the whole log is replayed
	N       int // measured exec rounds of the recording cost
	Warmup  int
}

// TrajectoryReport is the result of `warren bench trajectory`.
type TrajectoryReport struct {
	Benchmark string `json:"benchmark"`
	Daemon    string `json:"daemon"`
	Steps     int    `json:"steps"`
	// RecordMs is the time to run the steps live (recorded).
	RecordMs float64 `json:"record_ms"`
	// ReplayTotalMs are the totals of each replay of the whole log,
	// through client.Rollout: one read of the session's log, then each
	// call answered from it (its request hashed and compared).
	ReplayTotalMs []float64 `json:"replay_total_ms"`
	// ServerReplayTotalMs: each call sent to the daemon, which replays
	// it (one API round trip per step).
	ServerReplayTotalMs []float64 `json:"server_replay_total_ms"`
	ServerReplayMedian  float64   `json:"server_replay_total_median_ms"`
	ReplayCallP50       float64   `json:"replay_call_p50_ms"`
	ReplayCallP99       float64   `json:"replay_call_p99_ms"`
	LogBytes            int64     `json:"log_bytes"`
	// Exec `true` with and without the log (ABBA rounds, one sandbox of
	// each kind on the same daemon).
	ExecLogged   Paired   `json:"exec_logged_vs_unlogged"`
	ExecRounds   int      `json:"exec_rounds"`
	TargetMs     float64  `json:"replay_target_ms"`
	Notes        []string `json:"notes,omitempty"`
	ReplayMedian float64  `json:"replay_total_median_ms"`
}

// RunTrajectory records a Steps-step rollout (each step appends a line to
// a file), replays it Replays times, and measures the per-exec cost of
// recording: exec `true` into a sandbox with the log against one created
// with no_trajectory, in alternating rounds.
func RunTrajectory(ctx context.Context, env *Env, cfg TrajectoryConfig) (*TrajectoryReport, error) {
	rep := &TrajectoryReport{Benchmark: "trajectory", Daemon: env.describe(), Steps: cfg.Steps, ExecRounds: cfg.N, TargetMs: 100}
	rep.Notes = append(rep.Notes,
		"replay: the same Exec calls (session, seq 1..steps) made again, sequentially, through client.Rollout (one ReadTrajectory of the session, then each request hashed and compared with its step); nothing runs",
		"server replay: the same calls each sent to the daemon, which answers from the log (one API round trip per step)",
		"exec: Exec(argv [\"true\"]) round trip; logged = the default (begin frame + fdatasync'ed end frame per exec), unlogged = a sandbox created with no_trajectory; ABBA rounds")
	logged, err := env.Client.Create(ctx, env.CreateRequest())
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	unreq := env.CreateRequest()
	unreq.NoTrajectory = true
	unlogged, err := env.Client.Create(ctx, unreq)
	if err != nil {
		_ = env.Client.Delete(ctx, logged.GetId())
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = env.Client.Delete(dctx, logged.GetId())
		_ = env.Client.Delete(dctx, unlogged.GetId())
	}()
	lg := replayLog{env: env, id: logged.GetId(), session: "bench", steps: cfg.Steps}
	env.logf("trajectory: recording %d steps", cfg.Steps)
	took, err := lg.record(ctx)
	if err != nil {
		return nil, err
	}
	rep.RecordMs = msOf(took)
	var calls []float64
	for r := range cfg.Replays {
		env.logf("trajectory: replay %d of %d", r+1, cfg.Replays)
		took, err := lg.replayRollout(ctx, &calls)
		if err != nil {
			return nil, err
		}
		rep.ReplayTotalMs = append(rep.ReplayTotalMs, round(msOf(took), 2))
	}
	slices.Sort(calls)
	rep.ReplayCallP50, rep.ReplayCallP99 = round(Percentile(calls, 50), 4), round(Percentile(calls, 99), 4)
	rep.ReplayMedian = Percentile(slices.Sorted(slices.Values(rep.ReplayTotalMs)), 50)
	for r := range cfg.Replays {
		env.logf("trajectory: server replay %d of %d", r+1, cfg.Replays)
		took, err := lg.replayServer(ctx)
		if err != nil {
			return nil, err
		}
		rep.ServerReplayTotalMs = append(rep.ServerReplayTotalMs, round(msOf(took), 2))
	}
	rep.ServerReplayMedian = Percentile(slices.Sorted(slices.Values(rep.ServerReplayTotalMs)), 50)
	if err := lg.ranOnce(ctx); err != nil {
		return nil, err
	}
	page, err := env.Client.ReadTrajectory(ctx, &warrenv1.ReadTrajectoryRequest{SandboxId: logged.GetId(), PageSize: 1})
	if err != nil {
		return nil, err
	}
	rep.LogBytes = page.GetLogBytes()

	env.logf("trajectory: exec true, logged vs unlogged, %d rounds", cfg.N)
	execOn := func(id string) Iteration {
		return func(ctx context.Context, _ int) ([]time.Duration, error) {
			t0 := time.Now()
			if _, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"true"}}); err != nil {
				return nil, err
			}
			return []time.Duration{time.Since(t0)}, nil
		}
	}
	s, err := Alternate(ctx, [2]Iteration{execOn(logged.GetId()), execOn(unlogged.GetId())}, [2]string{"logged", "unlogged"}, cfg.Warmup, cfg.N)
	if err != nil {
		return nil, err
	}
	rep.ExecLogged = ComparePaired(s[0], s[1], 0)
	return rep, nil
}

// replayLog is a rollout's log for the replay cases (bench trajectory,
// bench hibernate): steps Exec calls of one session on sandbox id, each
// appending a line to /tmp/trajectory, which is not idempotent: a replay
// that ran anything would show in the file.
type replayLog struct {
	env         *Env
	id, session string
	steps       int
}

func (l replayLog) step(i int) *warrenv1.ExecRequest {
	return &warrenv1.ExecRequest{SandboxId: l.id, SessionId: l.session, Seq: uint64(i + 1),
		Shell: "echo step-" + strconv.Itoa(i) + " >> /tmp/trajectory"}
}

// record runs the steps live (recorded).
func (l replayLog) record(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	for i := range l.steps {
		if _, err := l.env.Client.Exec(ctx, l.step(i)); err != nil {
			return 0, fmt.Errorf("record step %d: %w", i+1, err)
		}
	}
	return time.Since(t0), nil
}

// replayRollout makes the same calls again through client.Rollout (one
// read of the session's log, then each call answered from it), adding
// each call's time to calls.
func (l replayLog) replayRollout(ctx context.Context, calls *[]float64) (time.Duration, error) {
	t0 := time.Now()
	ro, err := l.env.Client.NewRollout(ctx, l.id, l.session)
	if err != nil {
		return 0, err
	}
	for i := range l.steps {
		c0 := time.Now()
		res, err := ro.Exec(ctx, l.step(i))
		if err != nil {
			return 0, fmt.Errorf("replay step %d: %w", i+1, err)
		}
		if !res.GetReplayed() {
			return 0, fmt.Errorf("replay step %d ran live", i+1)
		}
		if calls != nil {
			*calls = append(*calls, msOf(time.Since(c0)))
		}
	}
	return time.Since(t0), nil
}

// replayServer sends each call to the daemon, which answers it from the
// log (one API round trip per step).
func (l replayLog) replayServer(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	for i := range l.steps {
		res, err := l.env.Client.Exec(ctx, l.step(i))
		if err != nil {
			return 0, fmt.Errorf("server replay step %d: %w", i+1, err)
		}
		if !res.GetReplayed() {
			return 0, fmt.Errorf("server replay step %d ran live", i+1)
		}
	}
	return time.Since(t0), nil
}

// ranOnce: the file has each step's line once (the replays ran nothing).
func (l replayLog) ranOnce(ctx context.Context) error {
	res, err := l.env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: l.id, Shell: "wc -l < /tmp/trajectory"})
	if err != nil || string(res.GetStdout()) != strconv.Itoa(l.steps)+"\n" {
		return fmt.Errorf("after replays the file has %q lines, want %d (%v)", res.GetStdout(), l.steps, err)
	}
	return nil
}

// Table prints the trajectory report.
func (r *TrajectoryReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "trajectory log (daemon: %s)\n\n", r.Daemon)
	t := newTable("WHAT", "VALUE")
	t.add("steps recorded (live)", strconv.Itoa(r.Steps))
	t.add("record, total ms", ms(r.RecordMs))
	t.add("replay of the whole log, total ms (median)", ms(r.ReplayMedian)+fmt.Sprintf(" (target <= %g)", r.TargetMs))
	t.add("replay totals ms", fmt.Sprint(r.ReplayTotalMs))
	t.add("replayed call p50 / p99 µs", fmt.Sprintf("%.1f / %.1f", r.ReplayCallP50*1000, r.ReplayCallP99*1000))
	t.add("server replay, total ms (median)", ms(r.ServerReplayMedian))
	t.add("server replay totals ms", fmt.Sprint(r.ServerReplayTotalMs))
	t.add("log bytes", strconv.FormatInt(r.LogBytes, 10))
	p := r.ExecLogged
	t.add("exec true logged p50 / p99 ms", ms(p.NumP50)+" / "+ms(p.NumP99))
	t.add("exec true unlogged p50 / p99 ms", ms(p.DenP50)+" / "+ms(p.DenP99))
	t.add("logged / unlogged p50 (median pair ratio)", fmt.Sprintf("%.3f (%.3f)", p.RatioP50, p.PairRatioMedian))
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	writeNotes(w, r.Notes)
	return nil
}

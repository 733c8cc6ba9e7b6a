package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// RestartConfig configures `warren bench restart`.
type RestartConfig struct {
	N               int // live sandboxes, each with one background process
	Rounds          int // restarts per stop mode
	Execs           int // execs timed right after each restart
	ExecConcurrency int
	SampleProcs     int // sandboxes whose ListProcesses is part of "ready"
	Concurrency     int // creates in flight
	Peers           bool
}

// RestartReport is the result of `warren bench restart`.
type RestartReport struct {
	Benchmark string       `json:"benchmark"`
	Daemon    string       `json:"daemon"`
	Sandboxes int          `json:"sandboxes"`
	Processes int          `json:"processes"`
	Rounds    int          `json:"rounds"`
	Nofile    uint64       `json:"rlimit_nofile"`
	CreateS   float64      `json:"create_s"`
	Results   []RestartRow `json:"results"`
	Notes     []string     `json:"notes,omitempty"`
}

// RestartRow is one stop mode (or the peer) over all rounds.
type RestartRow struct {
	Mode string `json:"mode"`
	// Stop: from the signal to the old daemon's exit.
	Stop Summary `json:"stop"`
	// Serving: from the exec of `warren serve` to the first Version reply.
	Serving Summary `json:"serving"`
	// Running: to a List of every sandbox showing all of them RUNNING.
	Running Summary `json:"running"`
	// Ready: to ListProcesses of the sample showing its processes running.
	Ready Summary `json:"ready"`
	// Exec: `true` round trips right after Ready, pooled over the rounds.
	Exec Summary `json:"exec"`
	// ProcsRunning is the least number of background processes listed
	// running in any round (checked after the execs), of Processes.
	ProcsRunning int `json:"procs_running_min"`
	// DaemonFds is the most fds the restarted daemon held, counted after
	// the checks of a round.
	DaemonFds int `json:"daemon_fds_max,omitempty"`
	// ServingVsEmpty is Serving p50 / the empty daemon's Serving p50.
	ServingVsEmpty *float64 `json:"serving_vs_empty,omitempty"`
}

const (
	modeKill9    = "kill -9"
	modeGraceful = "SIGTERM"
	modeEmpty    = "empty state (peer)"
)

// RunRestart creates cfg.N sandboxes with one background process each,
// then restarts the private daemon cfg.Rounds times per stop mode (kill
// -9, SIGTERM) and times how soon it serves again, and exec right after.
// The peer is the same binary started on an empty state directory in the
// same run: what a restart costs with nothing to adopt.
func RunRestart(ctx context.Context, env *Env, cfg RestartConfig, nofile uint64) (*RestartReport, error) {
	if !env.Private {
		return nil, errors.New("bench restart stops and starts the daemon: it needs the private one (no --addr)")
	}
	rep := &RestartReport{Benchmark: "restart", Daemon: env.describe(), Sandboxes: cfg.N, Processes: cfg.N, Rounds: cfg.Rounds, Nofile: nofile}
	rep.Notes = append(rep.Notes,
		"serving: from the exec of `warren serve` to its first Version reply (polled every 2 ms, a new connection each time)",
		"running: to a List showing every sandbox RUNNING; ready: to ListProcesses of "+strconv.Itoa(min(cfg.SampleProcs, cfg.N))+" random sandboxes (8 at a time) each showing its process running",
		fmt.Sprintf("exec: %d Exec(true) into random sandboxes, %d at a time, right after ready, pooled over the rounds", cfg.Execs, cfg.ExecConcurrency),
		"procs_running_min: after the execs, ListProcesses of every sandbox; the fewest background processes found running in a round; daemon_fds_max: the restarted daemon's open fds then, the most of any round",
		"empty state (peer): the same binary and flags on an empty state directory, started in each round; serving_vs_empty = serving p50 / its serving p50")
	// The daemon held 3 fds per sandbox with a background process (the
	// init's pidfd, its pinned root, the process's waiter connection):
	// 9,615 in all at 3,200. The root is now pinned only by a delete, and
	// the pidfd is gone where sandbox groups have a cgroup2 directory
	// (container/monitor.go), not on pure v1 hosts. 4 per sandbox leaves
	// room for the calls.
	if need := uint64(4*cfg.N + 1024); nofile < need {
		return nil, fmt.Errorf("RLIMIT_NOFILE is %d, the daemon needs about %d for %d sandboxes: raise the hard limit (ulimit -Hn) or lower --n", nofile, need, cfg.N)
	}
	ids, err := createWithProcesses(ctx, env, cfg)
	if err != nil {
		return nil, err
	}
	rep.CreateS = ids.wall
	rows := map[string]*restartSamples{}
	for _, m := range []string{modeKill9, modeGraceful, modeEmpty} {
		rows[m] = &restartSamples{procsMin: -1}
	}
	for r := range cfg.Rounds {
		for _, mode := range []string{modeKill9, modeGraceful} {
			env.logf("restart: round %d/%d, %s", r+1, cfg.Rounds, mode)
			if err := restartOnce(ctx, env, cfg, ids.ids, mode, rows[mode]); err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", r+1, mode, err)
			}
		}
		if cfg.Peers {
			d, err := startEmpty(ctx, env, r)
			if err != nil {
				return nil, fmt.Errorf("round %d, empty daemon: %w", r+1, err)
			}
			rows[modeEmpty].serving = append(rows[modeEmpty].serving, d)
		}
	}
	var empty float64
	if cfg.Peers {
		empty = Summarize(rows[modeEmpty].serving).P50
	}
	modes := []string{modeKill9, modeGraceful}
	if cfg.Peers {
		modes = append(modes, modeEmpty)
	}
	for _, m := range modes {
		s := rows[m]
		row := RestartRow{Mode: m, Stop: Summarize(s.stop), Serving: Summarize(s.serving), Running: Summarize(s.running),
			Ready: Summarize(s.ready), Exec: Summarize(s.exec), ProcsRunning: max(s.procsMin, 0), DaemonFds: s.fdsMax}
		if m != modeEmpty {
			row.ServingVsEmpty = ratio(row.Serving.P50, empty)
		}
		rep.Results = append(rep.Results, row)
	}
	return rep, nil
}

type restartSamples struct {
	stop, serving, running, ready, exec []time.Duration
	procsMin, fdsMax                    int
}

type createdIDs struct {
	ids  []string
	wall float64
}

// createWithProcesses creates cfg.N sandboxes, each with a background
// process that prints a line and sleeps, cfg.Concurrency at a time.
func createWithProcesses(ctx context.Context, env *Env, cfg RestartConfig) (createdIDs, error) {
	env.logf("restart: creating %d sandboxes with one background process each (%d at a time)", cfg.N, cfg.Concurrency)
	var (
		mu    sync.Mutex
		ids   []string
		first error
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	t0 := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(cfg.N) {
				id, err := createOneWithProcess(ctx, env)
				mu.Lock()
				if id != "" {
					ids = append(ids, id)
				}
				if err != nil && first == nil {
					first = err
				}
				stop := first != nil
				n := len(ids)
				mu.Unlock()
				if stop {
					return
				}
				if n%500 == 0 {
					env.logf("restart: %d sandboxes", n)
				}
			}
		}()
	}
	wg.Wait()
	return createdIDs{ids: ids, wall: round(time.Since(t0).Seconds(), 2)}, first
}

func createOneWithProcess(ctx context.Context, env *Env) (string, error) {
	sb, err := env.Client.Create(ctx, env.CreateRequest())
	if err != nil {
		return "", fmt.Errorf("create sandbox: %w", err)
	}
	_, err = env.Client.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(),
		Argv: []string{"sh", "-c", "echo started; exec sleep 100000"}})
	if err != nil {
		return sb.GetId(), fmt.Errorf("start background process in %s: %w", sb.GetId(), err)
	}
	return sb.GetId(), nil
}

// restartOnce stops the daemon by mode, starts it again and records the
// times of one round.
func restartOnce(ctx context.Context, env *Env, cfg RestartConfig, ids []string, mode string, s *restartSamples) error {
	sig := syscall.SIGKILL
	if mode == modeGraceful {
		sig = syscall.SIGTERM
	}
	exited := env.exited
	t0 := time.Now()
	if err := env.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal daemon: %w", err)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		return errors.New("the daemon did not exit within 60 s")
	}
	s.stop = append(s.stop, time.Since(t0))
	env.Client.Close()

	t0 = time.Now()
	if err := env.execDaemon(); err != nil {
		return err
	}
	cl, serving, err := waitServing(ctx, t0, env.Addr, env.exited, env.daemonLogTail)
	if err != nil {
		return err
	}
	env.Client = cl
	s.serving = append(s.serving, serving)

	for {
		sbs, err := cl.List(ctx, env.Labels)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		if countRunning(sbs) >= len(ids) {
			break
		}
		if time.Since(t0) > 2*time.Minute {
			return fmt.Errorf("%d of %d sandboxes RUNNING 2 min after the restart", countRunning(sbs), len(ids))
		}
		time.Sleep(2 * time.Millisecond)
	}
	s.running = append(s.running, time.Since(t0))

	sample := pick(ids, cfg.SampleProcs)
	if err := forEach(ctx, sample, 8, func(id string) error {
		for {
			ps, err := cl.ListProcesses(ctx, id)
			if err != nil {
				return fmt.Errorf("list processes of %s: %w", id, err)
			}
			if countProcsRunning(ps) >= 1 {
				return nil
			}
			if time.Since(t0) > 2*time.Minute {
				return fmt.Errorf("sandbox %s: no background process running 2 min after the restart", id)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}); err != nil {
		return err
	}
	s.ready = append(s.ready, time.Since(t0))

	execs := make([]time.Duration, cfg.Execs)
	var i atomic.Int64
	targets := make([]string, cfg.Execs)
	for k := range targets {
		targets[k] = ids[rand.IntN(len(ids))]
	}
	if err := forEach(ctx, targets, cfg.ExecConcurrency, func(id string) error {
		t := time.Now()
		res, err := cl.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"true"}})
		execs[i.Add(1)-1] = time.Since(t)
		if err != nil {
			return fmt.Errorf("exec in %s: %w", id, err)
		}
		if res.GetExitCode() != 0 {
			return fmt.Errorf("exec true in %s: exit %d", id, res.GetExitCode())
		}
		return nil
	}); err != nil {
		return err
	}
	s.exec = append(s.exec, execs...)

	var running atomic.Int64
	if err := forEach(ctx, ids, 8, func(id string) error {
		ps, err := cl.ListProcesses(ctx, id)
		if err != nil {
			return fmt.Errorf("list processes of %s: %w", id, err)
		}
		running.Add(int64(countProcsRunning(ps)))
		return nil
	}); err != nil {
		return err
	}
	if n := int(running.Load()); s.procsMin < 0 || n < s.procsMin {
		s.procsMin = n
	}
	if ents, err := os.ReadDir("/proc/" + strconv.Itoa(env.DaemonPid) + "/fd"); err == nil {
		s.fdsMax = max(s.fdsMax, len(ents))
	}
	if n := int(running.Load()); n < len(ids) {
		env.logf("restart: only %d of %d background processes running after the %s restart", n, len(ids), mode)
	}
	return nil
}

// waitServing polls Version every 2 ms with a new client (no pooled
// connection from before the restart) until the daemon answers; the time
// is counted from t0, the exec of the daemon.
func waitServing(ctx context.Context, t0 time.Time, addr string, exited <-chan struct{}, tail func() string) (*client.Client, time.Duration, error) {
	for {
		cl, err := client.New(addr, client.WithUserAgent("warren-bench"))
		if err != nil {
			return nil, 0, err
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = cl.Version(cctx)
		cancel()
		if err == nil {
			return cl, time.Since(t0), nil
		}
		cl.Close()
		select {
		case <-exited:
			return nil, 0, fmt.Errorf("daemon exited after its restart: %s", tail())
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
		if time.Since(t0) > 2*time.Minute {
			return nil, 0, fmt.Errorf("daemon not serving 2 min after its restart: %v: %s", err, tail())
		}
	}
}

// startEmpty starts the same daemon binary with the same flags on fresh,
// empty directories, times it to its first Version reply and stops it.
func startEmpty(ctx context.Context, env *Env, round int) (time.Duration, error) {
	dir := filepath.Join(env.Tmp, "empty-"+strconv.Itoa(round))
	sock := filepath.Join(dir, "warren.sock")
	cg := env.cgroupParent + "-empty"
	args := slices.Clone(env.daemonArgs)
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--state-dir":
			args[i+1] = filepath.Join(dir, "state")
		case "--run-dir":
			args[i+1] = filepath.Join(dir, "run")
		case "--socket":
			args[i+1] = sock
		case "--cgroup-parent":
			args[i+1] = cg
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	logPath := filepath.Join(dir, "daemon.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command(env.daemonExe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	env.logf("restart: round %d, empty-state daemon", round+1)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tail := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	cl, d, err := waitServing(ctx, t0, "unix://"+sock, exited, tail)
	if err == nil {
		cl.Close()
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	removeCgroupParent(cg)
	if err != nil {
		return 0, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return 0, err
	}
	return d, nil
}

func removeCgroupParent(name string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", name))
	for _, d := range dirs {
		_ = syscall.Rmdir(d)
	}
}

func countRunning(sbs []*warrenv1.Sandbox) int {
	n := 0
	for _, s := range sbs {
		if s.GetState() == warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
			n++
		}
	}
	return n
}

func countProcsRunning(ps []*warrenv1.ProcessInfo) int {
	n := 0
	for _, p := range ps {
		if p.GetRunning() {
			n++
		}
	}
	return n
}

// pick returns n distinct random elements of ids (all when n >= len).
func pick(ids []string, n int) []string {
	if n >= len(ids) {
		return ids
	}
	out := slices.Clone(ids)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out[:n]
}

// forEach runs fn on every item, conc at a time, and returns the first
// error (the rest still run).
func forEach(ctx context.Context, items []string, conc int, fn func(string) error) error {
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		work  = make(chan string)
	)
	for range max(1, conc) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				if err := fn(it); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, it := range items {
		if ctx.Err() != nil {
			break
		}
		work <- it
	}
	close(work)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// Table prints the restart report.
func (r *RestartReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "daemon restart with %d live sandboxes and %d background processes (daemon: %s; %d rounds; created in %.1f s; RLIMIT_NOFILE %d)\n\n",
		r.Sandboxes, r.Processes, r.Daemon, r.Rounds, r.CreateS, r.Nofile)
	t := newTable("STOP", "N", "STOP P50 ms", "SERVING P50", "SERVING P99", "RUNNING P50", "READY P50", "READY P99", "EXEC P50", "EXEC P99", "PROCS RUNNING", "DAEMON FDS", "SERVING / EMPTY")
	for _, row := range r.Results {
		procs, fds := "-", "-"
		if row.Mode != modeEmpty {
			procs, fds = fmt.Sprintf("%d/%d", row.ProcsRunning, r.Processes), strconv.Itoa(row.DaemonFds)
		}
		t.add(row.Mode, strconv.Itoa(row.Serving.N), ms(row.Stop.P50), ms(row.Serving.P50), ms(row.Serving.P99), ms(row.Running.P50),
			ms(row.Ready.P50), ms(row.Ready.P99), ms(row.Exec.P50), ms(row.Exec.P99), procs, fds, ratioStr(row.ServingVsEmpty))
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	writeNotes(w, r.Notes)
	return nil
}

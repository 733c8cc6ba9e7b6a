package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// checkpointRows times, on the sandbox of RunHibernate (its anonymous
// memory held by a background shell, its page cache file on disk):
// Hibernate, Resume of the hibernated sandbox, and restore to the first
// exec, cfg.CheckpointRounds times; then a Fork of cfg.Forks copies of the
// hibernated sandbox. The peer is bare CRIU on a process holding the same
// anonymous memory, outside any sandbox: dump and restore by its command
// line (the floor the issue names).
func checkpointRows(ctx context.Context, env *Env, cfg HibernateConfig, id string, sh func(string) error) ([]HibernateRow, []string, error) {
	var rows []HibernateRow
	var notes []string
	// noteEager says, once, that rows named lazy restored eagerly.
	noteEager := func(why string) {
		if n := eagerNote(why); why != "" && !slices.Contains(notes, n) {
			notes = append(notes, n)
		}
	}
	if cfg.CheckpointRounds > 0 {
		env.logf("hibernate: checkpoint and restore, %d rounds (eager and lazy memory alternating)", cfg.CheckpointRounds)
		var hib, ckpt []time.Duration
		restore, firstExec, filled := map[bool][]time.Duration{}, map[bool][]time.Duration{}, []time.Duration{}
		var art []float64
		for r := range cfg.CheckpointRounds {
			lazy := r%2 == 1
			t0 := time.Now()
			h, err := env.Client.Hibernate(ctx, id)
			if err != nil {
				return nil, nil, fmt.Errorf("hibernate: %w", err)
			}
			hib = append(hib, time.Since(t0))
			ckpt = append(ckpt, time.Duration(h.GetCheckpointUs())*time.Microsecond)
			art = append(art, mibF(h.GetBytes()))
			t1 := time.Now()
			res, err := env.Client.ResumeLazy(ctx, id, lazy)
			if err != nil {
				return nil, nil, fmt.Errorf("restore (lazy %v): %w", lazy, err)
			}
			restore[lazy] = append(restore[lazy], time.Since(t1))
			noteEager(res.GetEagerReason())
			if err := sh("true"); err != nil {
				return nil, nil, fmt.Errorf("exec after restore: %w", err)
			}
			firstExec[lazy] = append(firstExec[lazy], time.Since(t1))
			if lazy {
				// The next hibernation would wait for the fill anyway.
				if err := env.waitLazyFilled(ctx, []string{id}); err != nil {
					return nil, nil, err
				}
				filled = append(filled, time.Since(t1))
			}
		}
		slices.Sort(art)
		a := round(Percentile(art, 50), 1)
		rows = append(rows,
			HibernateRow{Case: "hibernate (checkpoint to disk)", System: "warren", Summary: Summarize(hib), TargetMs: 500, ArtifactMiB: &a},
			HibernateRow{Case: "  of which CRIU dump", System: "warren", Summary: Summarize(ckpt)},
			HibernateRow{Case: "restore", System: "warren", Summary: Summarize(restore[false])},
			HibernateRow{Case: "restore to first exec", System: "warren", Summary: Summarize(firstExec[false]), TargetMs: 250})
		if len(restore[true]) > 0 {
			rows = append(rows,
				HibernateRow{Case: "restore (lazy)", System: "warren", Summary: Summarize(restore[true])},
				HibernateRow{Case: "restore to first exec (lazy)", System: "warren", Summary: Summarize(firstExec[true]), TargetMs: 250})
			if len(filled) > 0 {
				rows = append(rows, HibernateRow{Case: "  lazy: until all memory is back", System: "warren", Summary: Summarize(filled)})
			}
		}
		if cfg.Peers {
			dump, rest, size, err := bareCRIU(ctx, cfg)
			if err != nil {
				notes = append(notes, "bare CRIU peer failed: "+err.Error())
			} else {
				slices.Sort(size)
				a := round(Percentile(size, 50), 1)
				rows = append(rows,
					HibernateRow{Case: "hibernate (checkpoint to disk)", System: "bare criu", Summary: Summarize(dump), ArtifactMiB: &a},
					HibernateRow{Case: "restore", System: "bare criu", Summary: Summarize(rest)})
			}
		}
		notes = append(notes,
			"hibernate: Hibernate through the API, request to reply (CRIU's dump of the whole sandbox tree, the writable layer moved into the checkpoint, the sandbox's resources released, the record synced); restore: Resume of the hibernated sandbox; restore to first exec: Resume and then an exec of `true`",
			"bare criu: `criu dump -t PID -D DIR` and `criu restore -d -D DIR` of a (stopped) shell holding the same anonymous memory, run outside any sandbox, by command line: the floor")
	}
	if cfg.Forks > 0 {
		for _, lazy := range []bool{false, true} {
			row, each, filled, why, err := forkRound(ctx, env, cfg, id, lazy)
			if err != nil {
				return nil, nil, err
			}
			noteEager(why)
			rows = append(rows, row, each)
			if filled != nil {
				rows = append(rows, *filled)
			}
		}
		notes = append(notes, fmt.Sprintf("fork of %d: one Fork call on the hibernated sandbox, request to reply; each fork restores the checkpoint onto a fresh copy-on-write layer over the shared one", cfg.Forks),
			"lazy: the restore (ResumeRequest/ForkRequest lazy_pages) maps the memory and a CRIU lazy-pages server per sandbox copies the pages in as they are touched and the rest in the background; 'until all memory is back' waits, from the call's start, until every server exited (its process polled every 5 ms)")
	}
	return rows, notes, nil
}

// bareCRIU dumps and restores, cfg.CheckpointRounds times, a shell
// holding cfg.AnonMiB of anonymous memory, with CRIU's command line.
func bareCRIU(ctx context.Context, cfg HibernateConfig) (dump, restore []time.Duration, size []float64, err error) {
	criu := cfg.CRIUPath
	if criu == "" {
		criu = "/opt/warren/criu/bin/criu"
	}
	tmp, err := os.MkdirTemp("", "warren-bench-criu-")
	if err != nil {
		return nil, nil, nil, err
	}
	defer os.RemoveAll(tmp)
	ready := filepath.Join(tmp, "ready")
	cmd := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("x=$(head -c %d /dev/zero | tr '\\0' a); touch %s; kill -STOP $$", cfg.AnonMiB<<20, ready))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			return nil, nil, nil, fmt.Errorf("the memory holder did not start")
		}
	}
	kill := func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }
	for r := range cfg.CheckpointRounds {
		dir := filepath.Join(tmp, "img"+strconv.Itoa(r))
		if err := os.Mkdir(dir, 0o700); err != nil {
			kill()
			return nil, nil, nil, err
		}
		t0 := time.Now()
		if out, err := exec.CommandContext(ctx, criu, "dump", "-t", strconv.Itoa(pid), "-D", dir).CombinedOutput(); err != nil {
			kill()
			return nil, nil, nil, fmt.Errorf("criu dump: %v: %s", err, lastLine(out))
		}
		dump = append(dump, time.Since(t0))
		bytes, _ := treeSize(dir)
		size = append(size, mibF(uint64(bytes)))
		// The restore needs the pid back: wait until the dumped (and
		// killed) process is reaped, not timed.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil) // if it is ours (a subreaper's)
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
				break
			}
		}
		t1 := time.Now()
		if out, err := exec.CommandContext(ctx, criu, "restore", "-d", "-D", dir).CombinedOutput(); err != nil {
			return nil, nil, nil, fmt.Errorf("criu restore: %v: %s", err, firstError(out))
		}
		restore = append(restore, time.Since(t1))
		_ = os.RemoveAll(dir)
	}
	kill()
	return dump, restore, size, nil
}

// firstError is CRIU's first "Error" line that is not its complaint
// about RLIMIT_NOFILE (harmless here), else its last line.
func firstError(b []byte) string {
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Error") && !strings.Contains(l, "RLIMIT_NOFILE") {
			return strings.TrimSpace(l)
		}
	}
	return lastLine(b)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// eagerNote says that the rows named lazy were not: the daemon's reason.
func eagerNote(why string) string {
	return "the '(lazy)' rows restored the memory whole, as the daemon said: " + why
}

// forkRound hibernates the sandbox and forks it cfg.Forks times, eagerly
// or lazily, then deletes the forks and resumes it; eagerWhy is the
// daemon's reason where lazily was asked and it restored eagerly.
func forkRound(ctx context.Context, env *Env, cfg HibernateConfig, id string, lazy bool) (row, each HibernateRow, filled *HibernateRow, eagerWhy string, err error) {
	name := fmt.Sprintf("fork of %d", cfg.Forks)
	if lazy {
		name += " (lazy)"
	}
	env.logf("hibernate: %s", name)
	if _, err := env.Client.Hibernate(ctx, id); err != nil {
		return row, each, nil, "", fmt.Errorf("hibernate before the fork: %w", err)
	}
	t0 := time.Now()
	f, err := env.Client.Fork(ctx, &warrenv1.ForkRequest{Id: id, Count: int32(cfg.Forks), Labels: env.Labels, LazyPages: &lazy})
	if err != nil {
		return row, each, nil, "", fmt.Errorf("%s: %w", name, err)
	}
	total := time.Since(t0)
	var ids []string
	for _, sb := range f.GetSandboxes() {
		ids = append(ids, sb.GetId())
	}
	if lazy {
		if err := env.waitLazyFilled(ctx, ids); err != nil {
			return row, each, nil, "", err
		}
		filled = &HibernateRow{Case: "  lazy: until all forks' memory is back", System: "warren", Summary: Summarize([]time.Duration{time.Since(t0)})}
	}
	var per []time.Duration
	for _, us := range f.GetRestoreUs() {
		per = append(per, time.Duration(us)*time.Microsecond)
	}
	for _, sid := range ids {
		_ = env.Client.Delete(context.WithoutCancel(ctx), sid)
	}
	if _, err := env.Client.ResumeLazy(ctx, id, false); err != nil {
		return row, each, nil, "", fmt.Errorf("restore after the fork: %w", err)
	}
	row = HibernateRow{Case: name, System: "warren", Summary: Summarize([]time.Duration{total}), TargetMs: 2000}
	each = HibernateRow{Case: "  each fork's restore", System: "warren", Summary: Summarize(per)}
	return row, each, filled, f.GetEagerReason(), nil
}

// waitLazyFilled polls until no CRIU lazy-pages server reads the images
// of the sandboxes ids (found by its command line, which names them: it
// joins the sandbox's cgroup only after the restore returned).
func (e *Env) waitLazyFilled(ctx context.Context, ids []string) error {
	for deadline := time.Now().Add(2 * time.Minute); ; {
		busy := false
		ents, _ := os.ReadDir("/proc")
		for _, p := range ents {
			b, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
			if err != nil || !strings.Contains(string(b), "\x00lazy-pages\x00") {
				continue
			}
			for _, id := range ids {
				if strings.Contains(string(b), "/sandboxes/"+id+"/lazy-images") {
					busy = true
				}
			}
		}
		if !busy {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lazy-pages servers still running after 2 minutes")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// FnCallConfig configures `warren bench fncall`.
type FnCallConfig struct {
	N           int
	Warmup      int
	Concurrency []int
	Peers       bool // fork+exec, unshare+chroot, crun run
	// PythonImage and CCImage name images made by scripts/fn-images.sh
	// (an image of the daemon, or the root directory itself, which is
	// imported for the run): with one, the python3 -c pass row, and the
	// compile-then-run row.
	PythonImage, CCImage string
}

// FnCallReport is the result of `warren bench fncall`.
type FnCallReport struct {
	Benchmark string           `json:"benchmark"`
	Daemon    string           `json:"daemon"`
	Warmup    int              `json:"warmup"`
	Workloads []FnCallWorkload `json:"workloads"`
	Notes     []string         `json:"notes,omitempty"`
}

// FnCallWorkload is one program's rows.
type FnCallWorkload struct {
	Program string `json:"program"`
	Results []Row  `json:"results"`
	// PerS and OverheadP50 are Warren's fncall rows' by concurrency:
	// jobs per second, and its p50 minus bare fork+exec's (ms).
	PerS        map[string]float64 `json:"per_s"`
	OverheadP50 map[string]float64 `json:"overhead_p50_ms"`
}

// fnProgram is a workload: the argv in the image (and on the rootfs the
// peers run), and for Warren an input file that carries the binary.
type fnProgram struct {
	name  string
	argv  []string
	host  string // the program's host path, for bare fork+exec
	files []*warrenv1.RunFile
	// steps > 1 runs the program that many times per job: one Run of
	// that many steps, that many Execs, that many fork+execs.
	steps int
	// A workload in an image of its own: image (not env.Image), job (the
	// Run's steps), hostRun (one fork+exec peer iteration: the same work
	// on the host), and chroot (argv for unshare+chroot in rootfs, with
	// stdin; none without a rootfs).
	image   string
	job     []*warrenv1.RunStep
	hostRun func(ctx context.Context, worker int) error
	rootfs  string
	chroot  []string
	stdin   []byte
}

// RunFnCall measures Run of one-step jobs in the fncall backend (client ->
// daemon -> pooled environment's agent -> fork/exec -> reset -> result)
// against bare fork+exec, unshare+chroot and crun run per run, and the
// exec-per-step path (Exec into one running sandbox).
func RunFnCall(ctx context.Context, env *Env, cfg FnCallConfig) (*FnCallReport, error) {
	rep := &FnCallReport{Benchmark: "fncall", Daemon: env.describe(), Warmup: cfg.Warmup}
	rep.Notes = append(rep.Notes,
		"warren fncall: Run of a one-step job through the client SDK: a pooled environment (a container sandbox: namespaces, cgroup, overlay root, seccomp, user namespace as the node's default), the step, kill-all and reset (work and scratch directories emptied), result; per_s = completed jobs / wall time",
		"warren exec: Exec of the program into one running sandbox (the exec-per-step path a job would take without the JOB frame), no reset; with 10 steps per job, 10 Execs one after another against one Run of 10 steps",
		"fork+exec: os.StartProcess + Wait of the same static binary on the host, no isolation (the floor); overhead_p50_ms = warren fncall p50 - fork+exec p50",
		"the machine is shared with other engineers' test runs: numbers vary from run to run")
	bb := filepath.Join(env.Rootfs, "bin", "busybox")
	progs := []fnProgram{{name: "/bin/true", argv: []string{"/bin/true"}, host: bb},
		{name: "10 x /bin/true per job", argv: []string{"/bin/true"}, host: bb, steps: 10}}
	if c, err := buildSmallC(ctx, env); err != nil {
		rep.Notes = append(rep.Notes, "small C program skipped: "+err.Error())
	} else {
		progs = append(progs, c)
		rep.Notes = append(rep.Notes, "small C program: a static musl binary summing 1..1e5; Warren gets it as an input file of every job (written to /w, then run: a judge's case), the peers run it from their root")
	}
	langs, cleanup, err := fnLanguages(ctx, env, cfg)
	defer cleanup()
	if err != nil {
		return nil, err
	}
	progs = append(progs, langs...)
	if cfg.PythonImage != "" {
		rep.Notes = append(rep.Notes, pythonImageNote)
	}
	if cfg.CCImage != "" {
		rep.Notes = append(rep.Notes, ccImageNote)
	}
	if cfg.PythonImage == "" || cfg.CCImage == "" {
		rep.Notes = append(rep.Notes, "python3 -c pass and compile-then-run rows need --python-image and --cc-image (scripts/fn-images.sh builds them from the host's python3 and gcc)")
	}
	for _, p := range progs {
		w, err := runFnWorkload(ctx, env, cfg, p)
		if err != nil {
			return nil, err
		}
		rep.Workloads = append(rep.Workloads, w)
	}
	return rep, nil
}

func runFnWorkload(ctx context.Context, env *Env, cfg FnCallConfig, p fnProgram) (FnCallWorkload, error) {
	w := FnCallWorkload{Program: p.name, PerS: map[string]float64{}, OverheadP50: map[string]float64{}}
	argv := p.argv
	if len(p.files) > 0 {
		argv = []string{"./" + p.files[0].GetName()}
	}
	req := &warrenv1.RunRequest{Image: env.Image, Steps: []*warrenv1.RunStep{{Argv: argv, Files: p.files}}}
	for range p.steps - 1 {
		req.Steps = append(req.Steps, &warrenv1.RunStep{Argv: argv})
	}
	if p.job != nil {
		req = &warrenv1.RunRequest{Image: p.image, Steps: p.job}
	}
	iter := func(ctx context.Context, _ int) ([]time.Duration, error) {
		t0 := time.Now()
		res, err := env.Client.Run(ctx, req)
		d := time.Since(t0)
		if err != nil {
			return nil, err
		}
		if len(res.GetSteps()) != len(req.Steps) {
			return nil, fmt.Errorf("run %s: %d of %d steps ran", p.name, len(res.GetSteps()), len(req.Steps))
		}
		for _, s := range res.GetSteps() {
			if s.GetStatus() != warrenv1.RunStatus_RUN_STATUS_ACCEPTED {
				return nil, fmt.Errorf("run %s: %v %s %q", p.name, s.GetStatus(), s.GetError(), s.GetStderr())
			}
		}
		return []time.Duration{d}, nil
	}
	var rows []Row
	for _, c := range cfg.Concurrency {
		env.logf("fncall %s: warren, concurrency %d, %d jobs (+%d warm-up)", p.name, c, cfg.N, cfg.Warmup)
		rows = append(rows, rowFrom("warren", c, Loop(ctx, cfg.N, cfg.Warmup, c, 1, iter)))
		if err := ctx.Err(); err != nil {
			return w, err
		}
	}
	if cfg.Peers {
		for _, pr := range fnPeers(env, p) {
			rows = append(rows, runPeer(ctx, env, pr, cfg.N, cfg.Warmup, cfg.Concurrency, 1, nil)...)
			if err := ctx.Err(); err != nil {
				return w, err
			}
		}
	}
	w.Results = orderRows(rows, cfg.Concurrency)
	addRatios(w.Results)
	for _, r := range w.Results {
		if r.System != "warren" {
			continue
		}
		k := strconv.Itoa(r.Concurrency)
		w.PerS[k] = r.PerS
		for _, b := range w.Results {
			if b.System == "fork+exec" && b.Concurrency == r.Concurrency && b.N > 0 {
				w.OverheadP50[k] = round(r.P50-b.P50, 3)
			}
		}
	}
	return w, nil
}

// fnPeers run p once per iteration: bare, in fresh namespaces, in a fresh
// crun container, and through Warren's exec into a running sandbox.
func fnPeers(env *Env, p fnProgram) []*peer {
	if p.hostRun != nil {
		return fnLanguagePeers(p)
	}
	hostArgv := p.argv
	if p.host != "" && p.files == nil {
		hostArgv = []string{p.host, "true"} // busybox by path: no PATH lookup, no symlink
	} else if p.host != "" {
		hostArgv = []string{p.host}
	}
	peers := []*peer{{
		system: "fork+exec",
		setup:  func(ctx context.Context) error { return exec.CommandContext(ctx, hostArgv[0], hostArgv[1:]...).Run() },
		iter: func(ctx context.Context, _ int) ([]time.Duration, error) {
			t0 := time.Now()
			for range max(p.steps, 1) {
				proc, err := os.StartProcess(hostArgv[0], hostArgv, &os.ProcAttr{})
				if err != nil {
					return nil, err
				}
				st, err := proc.Wait()
				if err != nil || !st.Success() {
					return nil, fmt.Errorf("%s: %v %v", p.name, err, st)
				}
			}
			return []time.Duration{time.Since(t0)}, nil
		},
	}}
	if p.files != nil {
		// The exec path needs the binary in the image.
		return append(peers, fnRunPeers(env, p)...)
	}
	var sbID string
	peers = append(peers, &peer{
		system: "warren exec",
		setup: func(ctx context.Context) error {
			sb, err := env.Client.Create(ctx, env.CreateRequest())
			if err != nil {
				return err
			}
			sbID = sb.GetId()
			return nil
		},
		iter: func(ctx context.Context, _ int) ([]time.Duration, error) {
			t0 := time.Now()
			for range max(p.steps, 1) {
				res, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sbID, Argv: p.argv})
				if err != nil {
					return nil, err
				}
				if res.GetExitCode() != 0 {
					return nil, fmt.Errorf("exec %s: exit code %d", p.name, res.GetExitCode())
				}
			}
			return []time.Duration{time.Since(t0)}, nil
		},
		teardown: func() {
			if sbID != "" {
				dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				_ = env.Client.Delete(dctx, sbID)
			}
		},
	})
	if p.steps > 1 {
		// A container per step is not what a job is: the multi-step
		// comparison is the one frame against exec per step.
		return peers
	}
	return append(peers, fnRunPeers(env, p)...)
}

// fnRunPeers are crun run and unshare+chroot per run of p.
func fnRunPeers(env *Env, p fnProgram) []*peer {
	var peers []*peer
	for _, rp := range runPeers(env.Tmp, env.Rootfs) {
		if rp.system == "runc" {
			continue // crun is the faster OCI runtime here; the create benchmark has runc
		}
		if p.name != "/bin/true" {
			rp = retarget(env, rp, p.argv)
			if rp == nil {
				continue
			}
		}
		// runPeers' iterations report [run, run+cleanup]: keep the first.
		inner := rp.iter
		rp.iter = func(ctx context.Context, w int) ([]time.Duration, error) {
			d, err := inner(ctx, w)
			if err != nil {
				return nil, err
			}
			return d[:1], nil
		}
		if rp.system == "crun" {
			rp.system = "crun run"
		}
		peers = append(peers, rp)
	}
	return peers
}

// retarget points an unshare+chroot peer at argv; crun's bundle runs
// /bin/true only, so it is left out for other programs.
func retarget(env *Env, p *peer, argv []string) *peer {
	if p.system != "unshare+chroot" {
		return nil
	}
	args := unshareArgs(env.Rootfs, argv...)
	p.setup = func(ctx context.Context) error { return runCmd(ctx, "unshare", args...) }
	p.iter = func(ctx context.Context, _ int) ([]time.Duration, error) {
		t0 := time.Now()
		if err := runCmd(ctx, "unshare", args...); err != nil {
			return nil, err
		}
		d := time.Since(t0)
		return []time.Duration{d, d}, nil
	}
	return p
}

const smallC = `#include <stdio.h>
int main(void) { unsigned long s = 0; for (unsigned long i = 1; i <= 100000; i++) s += i; printf("%lu\n", s); return 0; }
`

// buildSmallC compiles the small C program statically with musl-gcc (or
// gcc) into the peers' root, and returns it as a workload.
func buildSmallC(ctx context.Context, env *Env) (fnProgram, error) {
	cc := ""
	for _, c := range []string{"musl-gcc", "gcc", "cc"} {
		if have(c) {
			cc = c
			break
		}
	}
	if cc == "" {
		return fnProgram{}, fmt.Errorf("no C compiler on this host")
	}
	src := filepath.Join(env.Tmp, "small.c")
	if err := os.WriteFile(src, []byte(smallC), 0o644); err != nil {
		return fnProgram{}, err
	}
	bin := filepath.Join(env.Rootfs, "bin", "fnbench-small")
	if err := runCmd(ctx, cc, "-static", "-O2", "-o", bin, src); err != nil {
		return fnProgram{}, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return fnProgram{}, err
	}
	return fnProgram{name: "small C (" + cc + " -static, " + strconv.Itoa(len(data)/1024) + " KiB)", argv: []string{"/bin/fnbench-small"}, host: bin,
		files: []*warrenv1.RunFile{{Name: "small", Data: data, Mode: 0o755}}}, nil
}

// Table prints the report.
func (r *FnCallReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "fncall: one-step jobs (daemon: %s, warm-up %d)\n", r.Daemon, r.Warmup)
	for _, wl := range r.Workloads {
		fmt.Fprintf(w, "\n%s\n\n", wl.Program)
		t := newTable("SYSTEM", "CONC", "N", "ERR", "P50 ms", "P99 ms", "MEAN ms", "PER S", "WARREN P50 / THIS", "WARREN PER S / THIS")
		for _, row := range wl.Results {
			rp50, rps := "", ""
			if row.System != "warren" {
				rp50, rps = "-", "-"
				for _, x := range wl.Results {
					if x.System == "warren" && x.Concurrency == row.Concurrency {
						k := peerKey(row.System)
						rp50, rps = ratioStr(x.Ratios["vs_"+k+"_p50"]), ratioStr(x.Ratios["vs_"+k+"_per_s"])
					}
				}
			}
			sys := row.System
			if sys == "warren" {
				sys = "warren fncall"
			}
			t.add(sys, strconv.Itoa(row.Concurrency), strconv.Itoa(row.N), strconv.Itoa(row.Errors),
				ms(row.P50), ms(row.P99), ms(row.Mean), num(row.PerS), rp50, rps)
		}
		if err := t.write(w); err != nil {
			return err
		}
		for _, c := range slicesSortedKeys(wl.OverheadP50) {
			fmt.Fprintf(w, "  concurrency %s: warren fncall p50 overhead over fork+exec %.3f ms, %.0f jobs/s\n", c, wl.OverheadP50[c], wl.PerS[c])
		}
		writeRowProblems(w, wl.Results)
	}
	fmt.Fprintln(w)
	writeNotes(w, r.Notes)
	return nil
}

func slicesSortedKeys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	})
	return out
}

const pythonImageNote = "python3 -c pass: in the python image (scripts/fn-images.sh python: the host's python3 and standard library, .pyc included); fork+exec runs the host's /usr/bin/python3, unshare+chroot the image's root directory (when given as one)"

const ccImageNote = "compile then run: one job of two steps in the cc image (scripts/fn-images.sh cc: the host's gcc, binutils and libc headers): cc -O2 of the small C program (shipped in with the job), then the binary; fork+exec does the same with the host's gcc, unshare+chroot with the image's root directory (when given as one; the source on stdin)"

// fnLanguages returns the python3 -c pass and compile-then-run workloads
// of cfg's images, importing an image given as a directory (removed by
// cleanup).
func fnLanguages(ctx context.Context, env *Env, cfg FnCallConfig) (progs []fnProgram, cleanup func(), err error) {
	var imported []string
	cleanup = func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, name := range imported {
			_ = env.Client.RemoveImage(dctx, name)
		}
	}
	resolve := func(kind, v string) (image, rootfs string, err error) {
		st, err := os.Stat(v)
		if err != nil || !st.IsDir() {
			return v, "", nil // an image of the daemon
		}
		name := fmt.Sprintf("bench-fn-%s-%d", kind, os.Getpid())
		env.logf("fncall: importing %s as image %s", v, name)
		if _, err := env.Client.ImportImage(ctx, name, v); err != nil {
			return "", "", fmt.Errorf("import %s: %w", v, err)
		}
		imported = append(imported, name)
		return name, v, nil
	}
	if cfg.PythonImage != "" {
		img, root, err := resolve("python", cfg.PythonImage)
		if err != nil {
			return nil, cleanup, err
		}
		argv := []string{"python3", "-c", "pass"}
		progs = append(progs, fnProgram{name: "python3 -c pass", image: img, job: []*warrenv1.RunStep{{Argv: argv}},
			hostRun: func(ctx context.Context, _ int) error { return runCmd(ctx, "/usr/bin/python3", "-c", "pass") },
			rootfs:  root, chroot: []string{"/usr/bin/python3", "-c", "pass"}})
	}
	if cfg.CCImage != "" {
		img, root, err := resolve("cc", cfg.CCImage)
		if err != nil {
			return nil, cleanup, err
		}
		src := filepath.Join(env.Tmp, "compile.c")
		if err := os.WriteFile(src, []byte(smallC), 0o644); err != nil {
			return nil, cleanup, err
		}
		progs = append(progs, fnProgram{name: "compile a small C program (cc -O2) then run it", image: img,
			job: []*warrenv1.RunStep{
				{Argv: []string{"cc", "-O2", "-o", "small", "small.c"}, Files: []*warrenv1.RunFile{{Name: "small.c", Data: []byte(smallC)}}},
				{Argv: []string{"./small"}},
			},
			hostRun: func(ctx context.Context, w int) error {
				bin := filepath.Join(env.Tmp, "compiled-"+strconv.Itoa(w))
				if err := runCmd(ctx, "cc", "-O2", "-o", bin, src); err != nil {
					return err
				}
				return runCmd(ctx, bin)
			},
			rootfs: root, chroot: []string{"/bin/sh", "-c", "f=$(mktemp -u /tmp/fnbench.XXXXXX) && cc -O2 -x c -o $f - && $f >/dev/null; r=$?; rm -f $f; exit $r"},
			stdin: []byte(smallC)})
	}
	return progs, cleanup, nil
}

// fnLanguagePeers are p's fork+exec on the host and, with a root
// directory, unshare+chroot into it.
func fnLanguagePeers(p fnProgram) []*peer {
	timed := func(f func(ctx context.Context, w int) error) Iteration {
		return func(ctx context.Context, w int) ([]time.Duration, error) {
			t0 := time.Now()
			if err := f(ctx, w); err != nil {
				return nil, err
			}
			return []time.Duration{time.Since(t0)}, nil
		}
	}
	peers := []*peer{{system: "fork+exec", setup: func(ctx context.Context) error { return p.hostRun(ctx, -1) }, iter: timed(p.hostRun)}}
	if p.rootfs != "" && have("unshare") && have("chroot") {
		run := func(ctx context.Context, _ int) error {
			cmd := exec.CommandContext(ctx, "unshare", unshareArgs(p.rootfs, p.chroot...)...)
			cmd.Stdin = bytes.NewReader(p.stdin)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("unshare+chroot %s: %w: %s", p.name, err, out)
			}
			return nil
		}
		peers = append(peers, &peer{system: "unshare+chroot", setup: func(ctx context.Context) error { return run(ctx, 0) }, iter: timed(run)})
	}
	return peers
}

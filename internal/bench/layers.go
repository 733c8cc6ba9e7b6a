package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	"github.com/warrenrl/warren/internal/tarx"
)

// LayersConfig configures `warren bench layers`.
type LayersConfig struct {
	N           int // sandboxes per phase
	SizeMB      int // workspace + toolkit size
	Concurrency int // sandboxes in flight
	// StateDir is the daemon's state directory, whose block device the
	// written bytes are read from (default: the private daemon's).
	StateDir string
}

// LayersReport is the result of `warren bench layers`.
type LayersReport struct {
	Benchmark   string `json:"benchmark"`
	Daemon      string `json:"daemon"`
	Image       string `json:"image"`
	Device      string `json:"device"`
	N           int    `json:"n"`
	Concurrency int    `json:"concurrency"`

	Content SynthInfo `json:"content"`
	// Build is the one-time cost of the two named layers (amortised over
	// every later run that uses them); Baseline and Warren are the two
	// ways of giving N sandboxes the content.
	Build    LayersPhase `json:"layer_build"`
	Baseline LayersPhase `json:"baseline"`
	Warren   LayersPhase `json:"warren"`

	// Baseline wall / Warren wall, baseline bytes / Warren bytes.
	Speedup        *float64 `json:"speedup"`
	WriteReduction *float64 `json:"write_reduction"`
	// The same with the one-time layer build added to Warren's side, as
	// if the layers served this one run only.
	SpeedupWithBuild        *float64 `json:"speedup_with_build"`
	WriteReductionWithBuild *float64 `json:"write_reduction_with_build"`
	// Every sandbox of both phases produced the same tool-call outputs.
	OutputsIdentical bool     `json:"outputs_identical"`
	Notes            []string `json:"notes,omitempty"`
}

// SynthInfo describes the generated workspace and toolkit.
type SynthInfo struct {
	Bytes          int64   `json:"bytes"`
	Files          int     `json:"files"`
	TextFiles      int     `json:"text_files"`
	BinaryFiles    int     `json:"binary_files"`
	WorkspaceBytes int64   `json:"workspace_bytes"`
	ToolkitBytes   int64   `json:"toolkit_bytes"`
	TarGzBytes     int64   `json:"tar_gz_bytes,omitempty"`
	GenerateS      float64 `json:"generate_s"`
	PackS          float64 `json:"pack_s,omitempty"`
}

// LayersPhase is one way of providing the content, measured from the
// first create to the last tool call done.
type LayersPhase struct {
	System string  `json:"system"`
	N      int     `json:"n"`
	Done   int     `json:"done"`
	Errors int     `json:"errors"`
	WallS  float64 `json:"wall_s"`
	// Bytes written to the state directory's device: /proc/diskstats
	// sectors written (x512) from after the pre-phase sync to after the
	// post-phase sync (so all of the phase's dirty data is counted).
	BytesWritten    int64   `json:"bytes_written"`
	BytesPerSandbox float64 `json:"bytes_per_sandbox,omitempty"`
	PeakWriteMiBps  float64 `json:"peak_write_mib_per_s"`
	// The final sync (not in wall_s) and deleting the sandboxes.
	SyncS   float64 `json:"sync_s"`
	DeleteS float64 `json:"delete_s,omitempty"`
	// Per sandbox: create, provisioning (baseline: upload and extract),
	// the tool-call sequence.
	CreateP50    float64 `json:"create_p50_ms,omitempty"`
	ProvisionP50 float64 `json:"provision_p50_ms,omitempty"`
	ProvisionP99 float64 `json:"provision_p99_ms,omitempty"`
	SequenceP50  float64 `json:"tool_calls_p50_ms,omitempty"`
	SequenceP99  float64 `json:"tool_calls_p99_ms,omitempty"`
	// The host's 1-minute load average at the end of the phase.
	Load1 float64 `json:"load1"`
	// Median duration of each tool call over the sandboxes.
	StepsP50 []Step   `json:"tool_call_p50_ms,omitempty"`
	Digests  []string `json:"output_digests,omitempty"`
	Note     string   `json:"note,omitempty"`
	Error    string   `json:"error,omitempty"`
}

// RunLayers runs the layer build, the baseline and the Warren phase.
func RunLayers(ctx context.Context, env *Env, cfg LayersConfig) (*LayersReport, error) {
	if cfg.Concurrency < 1 {
		cfg.Concurrency = 4
	}
	rep := &LayersReport{Benchmark: "layers", Daemon: env.describe(), Image: env.Image, N: cfg.N, Concurrency: cfg.Concurrency}
	dev, err := env.stateDevice(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	rep.Device = dev.Name

	syn, info, err := env.synth(ctx, cfg.SizeMB, true)
	if err != nil {
		return nil, err
	}
	rep.Content = info
	tarGz := filepath.Join(env.Tmp, "content.tar.gz")

	ws, tk := layerNames()
	defer env.removeLayers(ws, tk)
	env.logf("layers: building layers %s and %s (once)", ws, tk)
	rep.Build, err = measurePhase(dev, "layer build (once)", func() (int, error) {
		if err := env.buildLayer(ctx, ws, syn.WorkspaceDir); err != nil {
			return 0, err
		}
		if err := env.buildLayer(ctx, tk, syn.ToolkitDir); err != nil {
			return 0, err
		}
		return 1, nil
	})
	if err != nil {
		return nil, err
	}
	rep.Build.N = 1

	baseline := func(ctx context.Context) (string, time.Duration, time.Duration, error) {
		t0 := time.Now()
		sb, err := env.Client.Create(ctx, env.CreateRequest())
		if err != nil {
			return "", 0, 0, err
		}
		tc := time.Since(t0)
		f, err := os.Open(tarGz)
		if err != nil {
			return sb.GetId(), tc, 0, err
		}
		defer f.Close()
		t1 := time.Now()
		if err := env.Client.Upload(ctx, sb.GetId(), "/", f); err != nil {
			return sb.GetId(), tc, 0, fmt.Errorf("upload tar.gz: %w", err)
		}
		return sb.GetId(), tc, time.Since(t1), nil
	}
	warren := func(ctx context.Context) (string, time.Duration, time.Duration, error) {
		req := env.CreateRequest()
		req.Layers = []string{ws, tk}
		t0 := time.Now()
		sb, err := env.Client.Create(ctx, req)
		if err != nil {
			return "", 0, 0, err
		}
		return sb.GetId(), time.Since(t0), 0, nil
	}

	env.logf("layers: baseline: %d sandboxes, each gets the %s tar.gz uploaded and extracted (%d at a time)", cfg.N, mib(info.TarGzBytes), cfg.Concurrency)
	rep.Baseline = runLayersPhase(ctx, env, dev, cfg, "baseline: tar.gz extracted per sandbox", baseline)
	env.logf("layers: warren: %d sandboxes with --layer %s --layer %s", cfg.N, ws, tk)
	rep.Warren = runLayersPhase(ctx, env, dev, cfg, "warren: two shared named layers", warren)

	rep.Speedup = ratio(rep.Baseline.WallS, rep.Warren.WallS)
	rep.WriteReduction = ratio(float64(rep.Baseline.BytesWritten), float64(rep.Warren.BytesWritten))
	rep.SpeedupWithBuild = ratio(rep.Baseline.WallS, rep.Warren.WallS+rep.Build.WallS)
	rep.WriteReductionWithBuild = ratio(float64(rep.Baseline.BytesWritten), float64(rep.Warren.BytesWritten+rep.Build.BytesWritten))
	all := append(append([]string{}, rep.Baseline.Digests...), rep.Warren.Digests...)
	rep.OutputsIdentical = len(all) > 0 && rep.Baseline.Done == cfg.N && rep.Warren.Done == cfg.N
	for _, d := range all {
		if d != all[0] {
			rep.OutputsIdentical = false
		}
	}
	rep.Notes = append(rep.Notes,
		"baseline: each sandbox is created from the base image and gets the tarball through the archive upload endpoint (PUT /v1/sandboxes/{id}/archive, gzip), the equivalent of `docker cp` / Docker's put_archive that harnesses use to ship a repository into a container today; the daemon decompresses it and extracts every file into the sandbox's writable upper directory on disk",
		"warren: the same content as two named layers (EROFS blobs built once), mounted once per node and shared read-only by all sandboxes; only what the tool calls write reaches the upper directories",
		"wall_s: first create to last tool call done, concurrency sandboxes in flight; bytes: /proc/diskstats sectors written x 512 on the state directory's device, sync + drop_caches before each phase and a sync at its end (sync_s, not in wall_s) so the phase's dirty pages are counted; peak: the highest 100 ms sample",
		"layer build: a one-time cost per content version, amortised over every run and every sandbox that uses the layers; *_with_build count it against this single run",
		"load1 is the host's 1-minute load average at the end of each phase (2 cores here means CPU contention above 2): the tool calls are CPU-bound, so other work on the host stretches the Warren phase most",
		"tool call times: with more than one sandbox in flight, Warren's sandboxes run their calls at the same time (nothing else to wait for), the baseline's beside other sandboxes' uploads: compare per-call times at --concurrency 1",
		"list tree: a sandbox's first walk of its tree builds its overlay's dentries and inodes; the baseline's extraction went through the overlay and built them already, so \"list tree again\" is the like-for-like walk")
	if env.diskDir != "" {
		rep.Notes = append(rep.Notes, "the state directory is on a scratch ext4 of its own (sparse file, loop device with direct I/O, the host disk's read_ahead_kb): its counters hold this benchmark's writes only")
	} else {
		rep.Notes = append(rep.Notes, "the state directory's disk is shared with anything else running on the machine: its writes during a phase are counted too")
	}
	return rep, nil
}

// runLayersPhase creates N sandboxes with mk, runs the tool calls in each,
// and measures wall time and disk writes; it deletes them afterwards.
func runLayersPhase(ctx context.Context, env *Env, dev diskDevice, cfg LayersConfig, system string,
	mk func(ctx context.Context) (string, time.Duration, time.Duration, error)) LayersPhase {
	var (
		mu        sync.Mutex
		ids       []string
		creates   []time.Duration
		provs     []time.Duration
		seqs      []time.Duration
		steps     = make([][]time.Duration, len(toolCalls))
		digests   = map[string]int{}
		firstSeen []string
	)
	ph, err := measurePhase(dev, system, func() (int, error) {
		res := Loop(ctx, cfg.N, 0, cfg.Concurrency, 1, func(ctx context.Context, _ int) ([]time.Duration, error) {
			id, tc, tp, err := mk(ctx)
			if id != "" {
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
			if err != nil {
				return nil, err
			}
			sr, err := runToolCalls(ctx, env.Client, id, toolCalls)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			creates, provs, seqs = append(creates, tc), append(provs, tp), append(seqs, sr.Total)
			for i, d := range sr.Steps {
				steps[i] = append(steps[i], d)
			}
			if digests[sr.Digest] == 0 {
				firstSeen = append(firstSeen, sr.Digest)
			}
			digests[sr.Digest]++
			mu.Unlock()
			return []time.Duration{tc + tp + sr.Total}, nil
		})
		if res.FirstErr != nil {
			return res.Done, fmt.Errorf("%d of %d failed, first: %w", res.Errors, cfg.N, res.FirstErr)
		}
		return res.Done, nil
	})
	ph.N = cfg.N
	if err != nil {
		ph.Error = err.Error()
	}
	ph.Errors = cfg.N - ph.Done
	if ph.Done > 0 {
		ph.BytesPerSandbox = round(float64(ph.BytesWritten)/float64(ph.Done), 0)
	}
	ph.CreateP50 = round(Summarize(creates).P50, 1)
	if s := Summarize(provs); s.Max > 0 {
		ph.ProvisionP50, ph.ProvisionP99 = round(s.P50, 1), round(s.P99, 1)
	}
	s := Summarize(seqs)
	ph.SequenceP50, ph.SequenceP99 = round(s.P50, 1), round(s.P99, 1)
	for i, st := range steps {
		if len(st) > 0 {
			ph.StepsP50 = append(ph.StepsP50, Step{Name: toolCalls[i].Name, Ms: round(Summarize(st).P50, 1)})
		}
	}
	ph.Digests = firstSeen
	if len(firstSeen) > 1 {
		ph.Note = fmt.Sprintf("%d different tool-call outputs across sandboxes", len(firstSeen))
	}

	env.logf("layers: deleting %d sandboxes", len(ids))
	t0 := time.Now()
	if err := deleteIDs(context.WithoutCancel(ctx), env.Client, ids, cfg.Concurrency); err != nil {
		ph.Error = joinErr(ph.Error, "delete: "+err.Error())
	}
	ph.DeleteS = round(time.Since(t0).Seconds(), 3)
	unix.Sync()
	return ph
}

// measurePhase syncs and drops the page cache, then runs fn while
// sampling the device's writes, syncs again, and returns the phase with
// wall_s (fn only), bytes, peak rate and sync time. fn returns how many
// units it completed.
func measurePhase(dev diskDevice, system string, fn func() (int, error)) (LayersPhase, error) {
	ph := LayersPhase{System: system}
	if err := dropCaches(); err != nil {
		return ph, fmt.Errorf("drop caches (needs root): %w", err)
	}
	m, err := startDiskMeter(dev, 100*time.Millisecond)
	if err != nil {
		return ph, err
	}
	t0 := time.Now()
	done, ferr := fn()
	ph.WallS = round(time.Since(t0).Seconds(), 3)
	ph.Load1 = load1()
	ph.Done = done
	t1 := time.Now()
	unix.Sync()
	ph.SyncS = round(time.Since(t1).Seconds(), 3)
	b, peak, merr := m.Stop()
	ph.BytesWritten = b
	ph.PeakWriteMiBps = round(peak/(1<<20), 1)
	if merr != nil {
		ferr = errors.Join(ferr, merr)
	}
	return ph, ferr
}

// load1 reads the 1-minute load average (0 when unknown).
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func joinErr(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// layerNames returns this run's names of the two layers.
func layerNames() (string, string) {
	pid := strconv.Itoa(os.Getpid())
	return "bench-workspace-" + pid, "bench-toolkit-" + pid
}

// stateDevice finds the block device of the daemon's state directory.
func (e *Env) stateDevice(stateDir string) (diskDevice, error) {
	if stateDir == "" {
		if !e.Private {
			return diskDevice{}, fmt.Errorf("with --addr, pass --state-dir (the daemon's state directory, to read its disk's writes)")
		}
		stateDir = e.StateDir()
	}
	return deviceOf(stateDir)
}

// synth generates the workspace and toolkit below the scratch directory
// (and, with tarball, content.tar.gz of both).
func (e *Env) synth(ctx context.Context, sizeMB int, tarball bool) (*Synth, SynthInfo, error) {
	dir := filepath.Join(e.Tmp, "content")
	e.logf("generating a %d MiB workspace + toolkit in %s", sizeMB, dir)
	t0 := time.Now()
	s, err := GenerateSynth(ctx, dir, sizeMB)
	if err != nil {
		return nil, SynthInfo{}, fmt.Errorf("generate content: %w", err)
	}
	info := SynthInfo{Bytes: s.Bytes, Files: s.Files, TextFiles: s.TextFiles, BinaryFiles: s.BinaryFiles,
		WorkspaceBytes: s.WorkspaceB, ToolkitBytes: s.ToolkitB, GenerateS: round(time.Since(t0).Seconds(), 2)}
	if tarball {
		e.logf("packing it as content.tar.gz")
		t0 = time.Now()
		if info.TarGzBytes, err = s.WriteTarGz(ctx, filepath.Join(e.Tmp, "content.tar.gz")); err != nil {
			return nil, info, fmt.Errorf("pack content: %w", err)
		}
		info.PackS = round(time.Since(t0).Seconds(), 2)
	}
	return s, info, nil
}

// buildLayer makes dir the named layer name: by path on a local daemon,
// by upload otherwise.
func (e *Env) buildLayer(ctx context.Context, name, dir string) error {
	var err error
	if e.Client.IsUnix() {
		_, err = e.Client.BuildLayer(ctx, name, dir)
	} else {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarx.Create(ctx, "/", pw, dir)) }()
		_, err = e.Client.BuildLayerTar(ctx, name, pr)
		pr.Close()
	}
	if err != nil {
		return fmt.Errorf("build layer %s: %w", name, err)
	}
	return nil
}

// removeLayers removes this run's layers (after its sandboxes are gone).
func (e *Env) removeLayers(names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.DeleteAll(ctx, 8); err != nil {
		e.logf("delete sandboxes: %v", err)
	}
	for _, n := range names {
		if err := e.Client.RemoveLayer(ctx, n); err != nil && !client.IsNotFound(err) {
			e.logf("remove layer %s: %v", n, err)
		}
	}
}

func secs(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// Table prints the layers report.
func (r *LayersReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "layers: %d sandboxes share a %s workspace + toolkit (%d files, %d binaries; tar.gz %s), %d in flight, image %s\n",
		r.N, mib(r.Content.Bytes), r.Content.Files, r.Content.BinaryFiles, mib(r.Content.TarGzBytes), r.Concurrency, r.Image)
	fmt.Fprintf(w, "daemon: %s; writes measured on /dev/%s\n\n", r.Daemon, r.Device)
	t := newTable("PHASE", "SANDBOXES", "WALL s", "CREATE p50 ms", "UPLOAD+EXTRACT p50 ms", "TOOL CALLS p50 ms", "WRITTEN MiB", "MiB/SANDBOX", "PEAK WRITE MiB/s", "SYNC s", "DELETE s", "LOAD1")
	row := func(p LayersPhase, n string) {
		per := "-"
		if p.BytesPerSandbox > 0 && p.N > 1 {
			per = fmt.Sprintf("%.1f", p.BytesPerSandbox/(1<<20))
		}
		t.add(p.System, n, fmt.Sprintf("%.2f", p.WallS), ms(p.CreateP50), ms(p.ProvisionP50), ms(p.SequenceP50),
			fmt.Sprintf("%.1f", float64(p.BytesWritten)/(1<<20)), per, fmt.Sprintf("%.0f", p.PeakWriteMiBps),
			fmt.Sprintf("%.2f", p.SyncS), secs(p.DeleteS), fmt.Sprintf("%.1f", p.Load1))
	}
	row(r.Build, "-")
	row(r.Baseline, fmt.Sprintf("%d/%d", r.Baseline.Done, r.Baseline.N))
	row(r.Warren, fmt.Sprintf("%d/%d", r.Warren.Done, r.Warren.N))
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "speedup (baseline wall / warren wall):          %s   (target >= 5x; reference paper 1.76x)\n", ratioStr(r.Speedup))
	fmt.Fprintf(w, "write_reduction (baseline bytes / warren bytes): %s   (target >= 10x; reference paper 5.5x)\n", ratioStr(r.WriteReduction))
	fmt.Fprintf(w, "with the one-time layer build charged to this run: speedup %s, write reduction %s\n", ratioStr(r.SpeedupWithBuild), ratioStr(r.WriteReductionWithBuild))
	same := "yes"
	if !r.OutputsIdentical {
		same = "NO"
	}
	fmt.Fprintf(w, "tool-call outputs identical in all %d sandboxes: %s\n", r.Baseline.Done+r.Warren.Done, same)
	if len(r.Baseline.StepsP50) == len(r.Warren.StepsP50) && len(r.Warren.StepsP50) > 0 {
		var parts []string
		for i, b := range r.Baseline.StepsP50 {
			parts = append(parts, fmt.Sprintf("%s %.0f/%.0f", b.Name, b.Ms, r.Warren.StepsP50[i].Ms))
		}
		fmt.Fprintf(w, "tool call p50 ms, baseline/warren: %s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
	for _, p := range []LayersPhase{r.Build, r.Baseline, r.Warren} {
		if p.Note != "" {
			fmt.Fprintf(w, "note: %s: %s\n", p.System, p.Note)
		}
		if p.Error != "" {
			fmt.Fprintf(w, "error: %s: %s\n", p.System, p.Error)
		}
	}
	writeNotes(w, r.Notes)
	return nil
}

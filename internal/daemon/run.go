package daemon

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/fncall"
	"github.com/warrenrl/warren/internal/image"
)

// Run runs one job in the fncall backend (internal/fncall): a program's
// failure is a step status in the result, never an error.
func (m *Manager) Run(ctx context.Context, req *warrenv1.RunRequest) (_ *warrenv1.RunResult, err error) {
	defer m.observe("Run", &err)
	start := time.Now()
	if err := m.fnCheck(req.GetBackend(), req.GetImage()); err != nil {
		return nil, err
	}
	steps, err := runSteps(req.GetSteps())
	if err != nil {
		return nil, err
	}
	return m.runJob(ctx, req.GetImage(), steps, jobOptions(req.GetGpus()), start)
}

// jobOptions are a job's GPUs as fncall takes them.
func jobOptions(g *warrenv1.RunGpus) fncall.JobOptions {
	return fncall.JobOptions{GPUs: int(g.GetCount()), SharedGPUs: g.GetShared()}
}

// fnCheck validates what Run and RunBatch share.
func (m *Manager) fnCheck(backendName, image string) error {
	if backendName != "" && backendName != fncall.Name {
		return errdefs.Invalidf("backend %q runs no jobs: Run takes %q", backendName, fncall.Name)
	}
	if m.cfg.FnCall == nil {
		return errdefs.Unsupportedf("this node runs no %s backend", fncall.Name)
	}
	if image == "" {
		return errdefs.Invalidf("image is required")
	}
	return nil
}

// runJob runs one validated job.
func (m *Manager) runJob(ctx context.Context, image string, steps []backend.Step, o fncall.JobOptions, start time.Time) (*warrenv1.RunResult, error) {
	img, err := m.fnImage(ctx, image)
	if err != nil {
		m.metrics.ObserveFnJob("error", time.Since(start))
		return nil, err
	}
	res, err := m.cfg.FnCall.RunWith(ctx, img, steps, o)
	if err != nil {
		m.metrics.ObserveFnJob("error", time.Since(start))
		return nil, err
	}
	outcome := "error"
	if n := len(res.Steps); n > 0 {
		outcome = res.Steps[n-1].Status.String()
	}
	m.metrics.ObserveFnJob(outcome, time.Since(start))
	out := &warrenv1.RunResult{Steps: make([]*warrenv1.RunStepResult, len(res.Steps))}
	for i, s := range res.Steps {
		out.Steps[i] = runStepResult(s)
	}
	out.WallUs = time.Since(start).Microseconds()
	return out, nil
}

// MaxBatchJobs bounds RunBatchRequest.jobs.
const MaxBatchJobs = 10000

// RunBatch runs a batch of jobs, parallelism at once, and sends each
// result as it finishes. Every job is validated before the first runs.
func (m *Manager) RunBatch(ctx context.Context, req *warrenv1.RunBatchRequest, send func(*warrenv1.RunBatchItem) error) (err error) {
	defer m.observe("RunBatch", &err)
	if err := m.fnCheck(req.GetBackend(), req.GetImage()); err != nil {
		return err
	}
	if n := len(req.GetJobs()); n == 0 || n > MaxBatchJobs {
		return errdefs.Invalidf("a batch has 1 to %d jobs, not %d", MaxBatchJobs, n)
	}
	jobs := make([][]backend.Step, len(req.GetJobs()))
	for i, j := range req.GetJobs() {
		if jobs[i], err = runSteps(j.GetSteps()); err != nil {
			return errdefs.New(errdefs.Invalid, "job %d: %w", i, err)
		}
		if n, have := j.GetGpus().GetCount(), len(m.cfg.FnCall.GPUs()); n < 0 || int(n) > have {
			return errdefs.Invalidf("job %d asks for %d GPUs; this node has %d", i, n, have)
		}
	}
	par := int(req.GetParallelism())
	if par < 0 {
		return errdefs.Invalidf("parallelism must not be negative")
	}
	if par == 0 {
		par = 2 * runtime.NumCPU()
	}
	par = min(par, len(jobs), 256)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next    atomic.Int64
		sendMu  sync.Mutex
		sendErr error
		wg      sync.WaitGroup
	)
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(jobs) || ctx.Err() != nil {
					return
				}
				start := time.Now()
				item := &warrenv1.RunBatchItem{Index: int32(i)}
				res, err := m.runJob(ctx, req.GetImage(), jobs[i], jobOptions(req.GetJobs()[i].GetGpus()), start)
				if err != nil {
					item.Error, item.ErrorCategory = err.Error(), errdefs.CategoryOf(err).String()
				} else {
					item.Result = res
				}
				sendMu.Lock()
				if sendErr == nil {
					if sendErr = send(item); sendErr != nil {
						cancel() // the client is gone: stop the rest
					}
				}
				sendMu.Unlock()
			}
		}()
	}
	wg.Wait()
	if sendErr != nil {
		return sendErr
	}
	return ctx.Err()
}

// fnImage resolves an image for the fncall backend. The layers are taken
// (held, mounted) only for an image the service has no pool of yet: the
// pool holds them from its first call on.
func (m *Manager) fnImage(ctx context.Context, name string) (fncall.Image, error) {
	// Resolving reads the image's record and every layer's: ~100 µs a
	// call. An image's resolution is kept while its pool exists, until an
	// image or layer call of this daemon may have changed it (fnForget).
	m.fnMu.Lock()
	img, ok := m.fnImages[name]
	m.fnMu.Unlock()
	if ok && m.cfg.FnCall.Pooled(img.Key) {
		return img, nil
	}
	m.imgMu.RLock()
	defer m.imgMu.RUnlock()
	gen := m.fnGen.Load()
	rec, digests, err := m.images.Resolve(name, nil)
	if err != nil {
		return fncall.Image{}, withCategory(err, errdefs.Internal, "resolve image "+name)
	}
	userns := false
	if m.cfg.UserNSDefault {
		recs, err := m.layerRecords(digests)
		userns = err == nil && userNSFits(recs) == nil
	}
	img = fncall.Image{Name: name, Key: name + "@" + strings.Join(digests, ",") + map[bool]string{true: "+userns"}[userns], UserNS: userns}
	if rec.Config != nil {
		for k, v := range imageEnv(rec.Config, nil) {
			img.Env = append(img.Env, k+"="+v)
		}
		slices.Sort(img.Env)
	}
	m.fnPoolOf(name, img.Key)
	if m.cfg.FnCall.Pooled(img.Key) {
		m.fnRemember(name, img, gen)
		return img, nil
	}
	refs, release, err := m.images.LayerRefs(ctx, image.Image{Name: name, Layers: digests}, true)
	if err != nil {
		return fncall.Image{}, withCategory(err, errdefs.Internal, "resolve image "+name)
	}
	cached := img
	img.Layers, img.Release = specLayers(refs), release
	m.fnRemember(name, cached, gen)
	return img, nil
}

// fnRemember caches an image's resolution (without its layers, which its
// pool holds) unless fnForget ran since gen was read.
func (m *Manager) fnRemember(name string, img fncall.Image, gen uint64) {
	m.fnMu.Lock()
	defer m.fnMu.Unlock()
	if m.fnGen.Load() != gen {
		return
	}
	if m.fnImages == nil {
		m.fnImages = map[string]fncall.Image{}
	}
	m.fnImages[name] = img
}

// fnPoolOf records that image name now resolves to key, and closes the
// pool of what it resolved to before (the image was imported again), so
// that the old layers are let go.
func (m *Manager) fnPoolOf(name, key string) {
	m.fnMu.Lock()
	old := m.fnPools[name]
	if m.fnPools == nil {
		m.fnPools = map[string]string{}
	}
	m.fnPools[name] = key
	m.fnMu.Unlock()
	if old != "" && old != key {
		m.cfg.FnCall.Forget(old)
	}
}

// fnRemoved closes the pool of a removed image.
func (m *Manager) fnRemoved(name string) {
	if m.cfg.FnCall == nil {
		return
	}
	m.fnMu.Lock()
	old := m.fnPools[name]
	delete(m.fnPools, name)
	m.fnMu.Unlock()
	if old != "" {
		m.cfg.FnCall.Forget(old)
	}
}

// fnForget drops every cached resolution: images or layers may change.
func (m *Manager) fnForget() {
	m.fnMu.Lock()
	defer m.fnMu.Unlock()
	m.fnGen.Add(1)
	m.fnImages = nil
}

func runSteps(in []*warrenv1.RunStep) ([]backend.Step, error) {
	if len(in) == 0 {
		return nil, errdefs.Invalidf("a job needs at least one step")
	}
	out := make([]backend.Step, len(in))
	for i, s := range in {
		l := s.GetLimits()
		for _, v := range []int64{l.GetCpuMs(), l.GetWallMs(), l.GetMemoryBytes(), int64(l.GetProcesses()), l.GetOutputBytes(), l.GetFileSizeBytes(), int64(l.GetOpenFiles()), l.GetFileOutBytes(), l.GetDiskBytes()} {
			if v < 0 {
				return nil, errdefs.Invalidf("step %d: a negative limit", i)
			}
		}
		st := backend.Step{
			Argv:     s.GetArgv(),
			Stdin:    s.GetStdin(),
			Outputs:  s.GetOutputs(),
			Continue: s.GetContinueOnFailure(),
			Limits: backend.StepLimits{
				CPU:           time.Duration(l.GetCpuMs()) * time.Millisecond,
				Wall:          time.Duration(l.GetWallMs()) * time.Millisecond,
				MemoryBytes:   l.GetMemoryBytes(),
				Procs:         uint32(l.GetProcesses()),
				OutputBytes:   l.GetOutputBytes(),
				FileSizeBytes: l.GetFileSizeBytes(),
				OpenFiles:     uint32(l.GetOpenFiles()),
				FileOutBytes:  l.GetFileOutBytes(),
				DiskBytes:     l.GetDiskBytes(),
			},
		}
		keys := make([]string, 0, len(s.GetEnv()))
		for k := range s.GetEnv() {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return nil, errdefs.Invalidf("step %d: bad environment variable name %q", i, k)
			}
			st.Env = append(st.Env, k+"="+s.GetEnv()[k])
		}
		for _, f := range s.GetFiles() {
			fi := backend.FileIn{Name: f.GetName(), Mode: f.GetMode(), Data: f.GetData(), FromStep: -1}
			if f.GetFrom() != "" {
				fi.FromStep, fi.From = int(f.GetFromStep()), f.GetFrom()
			}
			st.Files = append(st.Files, fi)
		}
		out[i] = st
	}
	return out, nil
}

func runStepResult(s backend.StepResult) *warrenv1.RunStepResult {
	r := &warrenv1.RunStepResult{
		Status:          warrenv1.RunStatus(s.Status),
		ExitCode:        int32(s.ExitCode),
		Signal:          int32(s.Signal),
		CpuUs:           s.CPU.Microseconds(),
		WallUs:          s.Wall.Microseconds(),
		PeakMemoryBytes: int64(s.PeakMemoryBytes),
		Stdout:          s.Stdout,
		Stderr:          s.Stderr,
		StdoutTruncated: s.StdoutTruncated,
		StderrTruncated: s.StderrTruncated,
	}
	if s.Errno != 0 {
		r.Error = s.What + ": " + s.Errno.Error()
	}
	if s.Status == backend.StatusInternalError && s.What == "environment" {
		r.Error = "environment: the job's environment failed while this step ran (it was replaced; the steps after it did not run)"
	}
	for _, f := range s.Files {
		fr := &warrenv1.RunFileResult{Name: f.Name, Data: f.Data}
		if f.Err != 0 {
			fr.Error = errnoText(f.Err)
		}
		r.Files = append(r.Files, fr)
	}
	return r
}

func errnoText(e syscall.Errno) string {
	switch e {
	case syscall.ENOENT:
		return "missing"
	case syscall.EFBIG:
		return "larger than file_out_bytes"
	case syscall.EACCES:
		return "not a regular file of the work directory (a symlink, or unreadable)"
	}
	return e.Error()
}

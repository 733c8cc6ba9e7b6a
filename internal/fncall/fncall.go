package fncall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/rlimit"
)

// Name is the backend's name in the API.
const Name = "fncall"

// The job's user and its directories.
const (
	JobUID  = 1000
	JobGID  = 1000
	Workdir = "/w"
)

// scratchDirs are the places other than Workdir that JobUID can write in
// an image laid out as usual; the reset empties them.
var scratchDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// Defaults of a step's limits.
const (
	DefaultCPU          = 10 * time.Second
	DefaultMemoryBytes  = 256 << 20
	DefaultProcs        = 64
	DefaultOutputBytes  = 64 << 10
	DefaultFileSize     = 64 << 20
	DefaultOpenFiles    = 256
	DefaultFileOutBytes = 64 << 10
	// MaxResultBytes bounds what a job's steps may send back in all (two
	// streams' caps and the output files' of every step): one agent frame
	// carries it, and a request whose caps add up to more is refused.
	MaxResultBytes = 3 << 20
)

// Options configure the backend.
type Options struct {
	// Backend makes the environments: the container backend.
	Backend backend.Backend
	// MaxIdle caps the idle environments of one image (default 8).
	MaxIdle int
	// IdleTimeout empties an image's pool after that long without a call
	// (default 1 min).
	IdleTimeout time.Duration
	// PidsMax and MemoryBytes are each environment's cgroup limits outside
	// jobs (defaults 256 and 512 MiB); a job sets the memory limit of its
	// largest step.
	PidsMax     int64
	MemoryBytes int64
	// DiskBytes is the disk quota of a job whose steps ask none (0: none;
	// each file is still bounded by the file size limit).
	DiskBytes int64
	// NoSpare keeps no spare environment beyond the last second's peak
	// (tests that need consecutive jobs in one environment).
	NoSpare bool
	// GPUs are the node's GPUs (nil or none: jobs cannot ask for one).
	// The backend must allow their device nodes (container:
	// Options.Devices = GPUs.All()).
	GPUs   *NodeGPUs
	Logger *slog.Logger
}

// JobOptions are what a job asks of its environment beyond its steps.
type JobOptions struct {
	// GPUs is how many of the node's GPUs the job gets: their device
	// nodes in its /dev, with the driver's control nodes and files
	// (GPULibDir, GPUBinDir). Each runs one job at a time, unless every
	// job on it asks for SharedGPUs.
	GPUs       int
	SharedGPUs bool
}

// Image is what an environment is made from.
type Image struct {
	// Name is the image's name, for metrics ("" : the key).
	Name string
	// Key names the image's content (its name and layer digests): one
	// pool per key.
	Key    string
	Layers []backend.Layer
	// Env is every step's environment under the step's own.
	Env []string
	// UserNS puts the image's environments in user namespaces of their
	// own (the node's default, for images whose ids fit).
	UserNS bool
	// Rlimits and AllowSetuid are the environments' (backend.Spec): the
	// sandboxes of the backend on Create (sandbox.go) differ in them; a
	// Key names them too.
	Rlimits     []rlimit.Limit
	AllowSetuid bool
	// Etc are /etc files the environments are made with (backend.Spec):
	// the sandbox backend's, which become overwrites (cheaper than
	// making them: no copy-up, no new inode).
	Etc []etcfiles.File
	// Release is called once the pool no longer needs Layers (nil: none).
	Release func()
}

// Service runs jobs in pooled environments, one pool per image.
type Service struct {
	opts   Options
	log    *slog.Logger
	seq    atomic.Uint64
	mu     sync.Mutex
	pools  map[string]*pool
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup

	gpus *gpuSet // nil without GPUs

	// images holds each image's layers for all its pools (one per disk
	// quota), until the last of them closes.
	images map[string]*imageRef

	// Counters, for tests and metrics.
	created, destroyed, resetFailures, failed atomic.Uint64
}

// imageRef is an image's layers, shared by its pools.
type imageRef struct {
	key     string
	layers  []backend.Layer
	release func()
	pools   int
}

// New returns the service; it makes no environment before a call.
func New(opts Options) (*Service, error) {
	if opts.Backend == nil {
		return nil, errdefs.Invalidf("fncall: no backend")
	}
	if opts.MaxIdle <= 0 {
		opts.MaxIdle = 8
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = time.Minute
	}
	if opts.PidsMax <= 0 {
		opts.PidsMax = 256
	}
	if opts.MemoryBytes <= 0 {
		opts.MemoryBytes = 512 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DiskBytes < 0 {
		return nil, errdefs.Invalidf("fncall: negative disk quota")
	}
	if opts.DiskBytes > 0 {
		var err error
		if opts.DiskBytes, err = diskQuota(opts.DiskBytes); err != nil {
			return nil, err
		}
	}
	s := &Service{opts: opts, log: opts.Logger, pools: map[string]*pool{}, images: map[string]*imageRef{}, stop: make(chan struct{})}
	if opts.GPUs != nil && len(opts.GPUs.GPUs) > 0 {
		s.gpus = newGPUSet(opts.GPUs.GPUs)
	}
	s.wg.Add(1)
	go s.janitor()
	return s, nil
}

// Stats are the service's counters.
type Stats struct {
	Created, Destroyed, ResetFailures uint64
	// Failed counts environments destroyed because their job or reset
	// failed.
	Failed uint64
	Idle   int
}

// Stats reads the counters and the idle environments of every pool.
func (s *Service) Stats() Stats {
	st := Stats{Created: s.created.Load(), Destroyed: s.destroyed.Load(), ResetFailures: s.resetFailures.Load(), Failed: s.failed.Load()}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pools {
		p.mu.Lock()
		st.Idle += len(p.idle)
		p.mu.Unlock()
	}
	return st
}

// PoolStat is one pool's environments.
type PoolStat struct {
	Image               string // Image.Name, or the key
	DiskBytes           int64
	Idle, InUse, Making int
}

// Pools reports every open pool's environments.
func (s *Service) Pools() []PoolStat {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PoolStat, 0, len(s.pools))
	for _, p := range s.pools {
		name := p.img.Name
		if name == "" {
			name = p.img.Key
		}
		p.mu.Lock()
		out = append(out, PoolStat{Image: name, DiskBytes: p.disk, Idle: len(p.idle), InUse: p.inUse, Making: p.making})
		p.mu.Unlock()
	}
	return out
}

// Run runs job in an environment of img and returns its result: a
// program's failure is a step status, an error means an environment or
// Warren failed. img.Release is the pool's from the first call of its
// key on; a later call's is called at once.
func (s *Service) Run(ctx context.Context, img Image, job []backend.Step) (backend.JobResult, error) {
	return s.RunWith(ctx, img, job, JobOptions{})
}

// RunWith is Run with a job's options: a job that asks for GPUs waits
// until it can have them.
func (s *Service) RunWith(ctx context.Context, img Image, job []backend.Step, o JobOptions) (backend.JobResult, error) {
	j, disk, err := s.job(img, job, o)
	if err != nil {
		if img.Release != nil {
			img.Release()
		}
		return backend.JobResult{}, err
	}
	p, err := s.pool(img, disk, o.GPUs > 0)
	if err != nil {
		return backend.JobResult{}, err
	}
	var devs []backend.Device
	if o.GPUs > 0 {
		got, err := s.gpus.acquire(ctx, o.GPUs, o.SharedGPUs)
		if err != nil {
			return backend.JobResult{}, err
		}
		defer s.gpus.release(got, o.SharedGPUs)
		for _, i := range got {
			devs = append(devs, s.gpus.gpus[i].Device)
		}
	}
	// An environment that fails before it sent a step's result (it died
	// while idle, or during the first step) costs a second draw: a job
	// has no effect outside its environment, so running it again is safe.
	// One that fails after that, or on the second draw, makes the step it
	// was running an internal error (cut), after the steps that ended.
	for attempt := 0; ; attempt++ {
		e, err := p.draw(ctx)
		if err != nil {
			return backend.JobResult{}, err
		}
		if err := e.setDevices(devs); err != nil {
			p.discard(e)
			return backend.JobResult{}, err
		}
		res, err := e.run.RunJob(ctx, j)
		if err == nil && res.ResetErr == 0 {
			// The reset killed every process of the job: none holds the
			// GPUs' nodes open as they go.
			if err := e.setDevices(nil); err != nil {
				s.log.Warn("fncall: remove a job's GPU device nodes; replacing the environment", "env", e.sb.ID(), "err", err)
				p.discard(e)
				return res, nil
			}
			p.put(e)
			return res, nil
		}
		p.discard(e)
		if err == nil {
			s.resetFailures.Add(1)
			s.log.Warn("fncall: environment reset failed; replacing it", "env", e.sb.ID(), "err", res.ResetErr)
			return res, nil // the job ran; only the environment is lost
		}
		if ctx.Err() != nil {
			return res, errors.Join(ctx.Err(), err)
		}
		jobCut := errors.Is(err, backend.ErrJobCut)
		if jobCut && (len(res.Steps) > 0 || attempt == 1) {
			s.log.Warn("fncall: environment failed mid-job; replacing it", "env", e.sb.ID(), "err", err)
			return cut(j, res), nil
		}
		if attempt == 1 {
			return res, errdefs.Wrap(errdefs.Internal, err, "fncall environment "+e.sb.ID())
		}
		s.log.Warn("fncall: environment failed before a step's result; running the job in another", "env", e.sb.ID(), "err", err)
	}
}

// cut completes the result of a job whose environment failed after the
// steps in res ended: unless the last of them ended the job, the next step
// is an internal error (the environment failed running it; the steps
// after it did not run).
func cut(j backend.Job, res backend.JobResult) backend.JobResult {
	n := len(res.Steps)
	if n == len(j.Steps) || (n > 0 && res.Steps[n-1].Status != backend.StatusAccepted && !j.Steps[n-1].Continue) {
		return res // every step that would run ended: only the reset was lost
	}
	res.Steps = append(res.Steps, backend.StepResult{Status: backend.StatusInternalError, ExitCode: -1,
		What: "environment", Errno: syscall.ECONNRESET})
	return res
}

// MinDiskBytes is the smallest disk quota: the container backend's
// smallest disk of its own.
const MinDiskBytes = 16 << 20

// diskQuota rounds a quota up to a MiB (a pool per quota: few distinct
// sizes) and checks it.
func diskQuota(n int64) (int64, error) {
	if n < MinDiskBytes {
		return 0, errdefs.Invalidf("disk quota of %d bytes: at least %d", n, MinDiskBytes)
	}
	if n > 1<<50 {
		return 0, errdefs.Invalidf("disk quota of %d bytes: too large", n)
	}
	return (n + 1<<20 - 1) &^ (1<<20 - 1), nil
}

// job validates steps and fills in defaults; disk is the job's quota.
func (s *Service) job(img Image, steps []backend.Step, o JobOptions) (_ backend.Job, disk int64, _ error) {
	if len(steps) == 0 {
		return backend.Job{}, 0, errdefs.Invalidf("a job needs at least one step")
	}
	if o.GPUs < 0 {
		return backend.Job{}, 0, errdefs.Invalidf("a negative GPU count")
	}
	if have := len(s.GPUs()); o.GPUs > have {
		return backend.Job{}, 0, errdefs.Invalidf("the job asks for %d GPUs; this node has %d", o.GPUs, have)
	}
	for i, st := range steps {
		if st.Limits.DiskBytes < 0 {
			return backend.Job{}, 0, errdefs.Invalidf("step %d: negative disk quota", i)
		}
		disk = max(disk, st.Limits.DiskBytes)
	}
	if disk == 0 {
		disk = s.opts.DiskBytes
	} else {
		var err error
		if disk, err = diskQuota(disk); err != nil {
			return backend.Job{}, 0, err
		}
	}
	j := backend.Job{UID: JobUID, GID: JobGID, Workdir: Workdir, Wipe: scratchDirs, Steps: make([]backend.Step, len(steps))}
	var result int64
	for i, st := range steps {
		l := &st.Limits
		if l.CPU <= 0 {
			l.CPU = DefaultCPU
		}
		if l.Wall <= 0 {
			l.Wall = 2*l.CPU + time.Second
		}
		if l.MemoryBytes <= 0 {
			l.MemoryBytes = DefaultMemoryBytes
		}
		if l.Procs == 0 {
			l.Procs = DefaultProcs
		}
		if l.OutputBytes <= 0 {
			l.OutputBytes = DefaultOutputBytes
		}
		if l.FileSizeBytes <= 0 {
			l.FileSizeBytes = DefaultFileSize
		}
		if l.OpenFiles == 0 {
			l.OpenFiles = DefaultOpenFiles
		}
		if l.FileOutBytes <= 0 {
			l.FileOutBytes = DefaultFileOutBytes
		}
		result += 2*l.OutputBytes + int64(len(st.Outputs))*l.FileOutBytes
		if result > MaxResultBytes {
			return backend.Job{}, 0, errdefs.Invalidf("step %d: the job's output caps and output files may send back up to %d bytes, more than %d", i, result, MaxResultBytes)
		}
		if len(st.Argv) == 0 || st.Argv[0] == "" {
			return backend.Job{}, 0, errdefs.Invalidf("step %d: no command", i)
		}
		for _, f := range st.Files {
			if !nameOK(f.Name) {
				return backend.Job{}, 0, errdefs.Invalidf("step %d: file name %q: a relative path without . or .. components", i, f.Name)
			}
			if f.From != "" && (f.FromStep < 0 || f.FromStep >= i) {
				return backend.Job{}, 0, errdefs.Invalidf("step %d: file %q from step %d, which is not an earlier step", i, f.Name, f.FromStep)
			}
		}
		for _, o := range st.Outputs {
			if !nameOK(o) {
				return backend.Job{}, 0, errdefs.Invalidf("step %d: output file name %q: a relative path without . or .. components", i, o)
			}
		}
		env := dedupEnv(append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + Workdir, "TMPDIR=/tmp"}, img.Env...))
		if o.GPUs > 0 {
			env = gpuEnv(env)
		}
		st.Env = dedupEnv(append(env, st.Env...))
		j.Steps[i] = st
	}
	return j, disk, nil
}

// gpuEnv leads PATH and LD_LIBRARY_PATH with the GPU driver's directories.
func gpuEnv(env []string) []string {
	env = slices.Clone(env)
	lib := false
	for i, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			env[i] = "PATH=" + GPUBinDir + ":" + v
		}
		if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
			env[i], lib = "LD_LIBRARY_PATH="+GPULibDir+":"+v, true
		}
	}
	if !lib {
		env = append(env, "LD_LIBRARY_PATH="+GPULibDir)
	}
	return env
}

// dedupEnv keeps the last value of each name, in first-seen order.
func dedupEnv(env []string) []string {
	idx := map[string]int{}
	out := env[:0:0]
	for _, kv := range env {
		k := kv
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				k = kv[:i]
				break
			}
		}
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

func nameOK(n string) bool {
	if n == "" || n[0] == '/' || len(n) > 1024 {
		return false
	}
	start := 0
	for i := 0; i <= len(n); i++ {
		if i == len(n) || n[i] == '/' {
			c := n[start:i]
			if c == "" || c == "." || c == ".." {
				return false
			}
			for k := 0; k < len(c); k++ {
				if c[k] == 0 {
					return false
				}
			}
			start = i + 1
		}
	}
	return true
}

// Forget closes the pool of key, if there is one, in the background:
// its idle environments are destroyed, those in use when their jobs end,
// and its image's layers are released. A call that already holds the
// pool fails Unavailable (which clients retry).
func (s *Service) Forget(key string) {
	s.mu.Lock()
	var ps []*pool
	for k, p := range s.pools {
		if p.img.Key == key {
			delete(s.pools, k)
			ps = append(ps, p)
		}
	}
	// A call of key from now on brings the layers again.
	delete(s.images, key)
	s.wg.Add(len(ps))
	s.mu.Unlock()
	for _, p := range ps {
		go func() {
			defer s.wg.Done()
			p.close()
		}()
	}
}

// Pooled reports whether the service has a pool for key, which holds its
// image's layers: a caller then need not take them again for Run.
func (s *Service) Pooled(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.images[key]
	return ok
}

// unref drops a closed pool's hold on its image's layers, releasing them
// after the last pool of the image.
func (s *Service) unref(r *imageRef) {
	s.mu.Lock()
	r.pools--
	last := r.pools == 0
	if last && s.images[r.key] == r {
		delete(s.images, r.key)
	}
	s.mu.Unlock()
	if last && r.release != nil {
		r.release()
	}
}

// pool returns the pool of img's environments with a disk of disk bytes
// (0: on the node's disk), making it on the image's first call.
func (s *Service) pool(img Image, disk int64, gpu bool) (*pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if img.Release != nil {
			img.Release()
		}
		return nil, errdefs.Unavailablef("fncall: shutting down")
	}
	key := img.Key
	if disk > 0 {
		key += "\x00disk=" + strconv.FormatInt(disk, 10)
	}
	if gpu {
		// GPU environments have the driver's files and control nodes.
		key += "\x00gpu"
	}
	if p, ok := s.pools[key]; ok {
		if img.Release != nil {
			img.Release()
		}
		return p, nil
	}
	ref, ok := s.images[img.Key]
	if ok {
		// Another pool of the image holds its layers already (a caller
		// that knows, Pooled, brings none).
		if img.Release != nil {
			img.Release()
		}
		img.Layers = ref.layers
	} else {
		ref = &imageRef{key: img.Key, layers: img.Layers, release: img.Release}
		s.images[img.Key] = ref
	}
	ref.pools++
	img.Release = nil
	sum := sha256.Sum256([]byte(key))
	p := &pool{s: s, img: img, ref: ref, disk: disk, gpu: gpu, transient: strings.HasPrefix(img.Key, sandboxKeyPrefix), tag: hex.EncodeToString(sum[:4]), target: 1 + s.spare(), lastUse: time.Now()}
	p.cond = sync.NewCond(&p.mu)
	s.pools[key] = p
	return p, nil
}

// janitor adapts every pool's size once a second and empties the pools
// that have been idle for IdleTimeout.
func (s *Service) janitor() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		var gone []string
		for _, p := range s.pools {
			if p.tick(s.opts.IdleTimeout) && p.transient {
				gone = append(gone, p.img.Key)
			}
		}
		s.mu.Unlock()
		// A pool of the sandbox backend's is closed once empty and
		// unused for IdleTimeout: nothing else lets go of its layers
		// (Run's pools are closed when their image changes, fnRemoved).
		for _, k := range gone {
			s.Forget(k)
		}
	}
}

// Close destroys every environment and releases every image.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	pools := s.pools
	s.pools = nil
	s.mu.Unlock()
	close(s.stop)
	for _, p := range pools {
		p.close()
	}
	s.wg.Wait() // the janitor and pools being forgotten
	return nil
}

func (s *Service) newID(tag string) string {
	return fmt.Sprintf("fn-%s-%d-%d", tag, time.Now().UnixNano()%1e9, s.seq.Add(1))
}

func (s *Service) spare() int {
	if s.opts.NoSpare {
		return 0
	}
	return 1
}

// Drain destroys every idle environment and waits for those being made
// or destroyed: for tests that count the node's resources, in which a
// pool's spare environments (a cache) are not a leak.
func (s *Service) Drain() {
	s.mu.Lock()
	ps := make([]*pool, 0, len(s.pools))
	for _, p := range s.pools {
		ps = append(ps, p)
	}
	s.mu.Unlock()
	for _, p := range ps {
		p.drain()
	}
}

package fncall

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// env is one pooled environment.
type env struct {
	sb   backend.Sandbox
	run  backend.JobRunner
	devs bool // it has a job's GPU nodes
}

// setDevices gives the environment a job's GPU device nodes, or takes
// them back (nil).
func (e *env) setDevices(devs []backend.Device) error {
	if len(devs) == 0 && !e.devs {
		return nil
	}
	ds, ok := e.sb.(backend.DeviceSetter)
	if !ok {
		return errdefs.Unsupportedf("fncall: the environments' backend cannot give a job device nodes")
	}
	if err := ds.SetDevices(devs); err != nil {
		return err
	}
	e.devs = len(devs) > 0
	return nil
}

// pool is the environments of one image. Its states: an environment is
// idle (in idle), in use (drawn, counted in inUse), or being made
// (making); it leaves the pool destroyed, after a failed job or reset,
// when the pool shrinks, or when the pool closes.
type pool struct {
	s    *Service
	img  Image
	ref  *imageRef // the image's layers, which close lets go of
	disk int64     // each environment's disk quota (0: the node's disk)
	gpu  bool      // environments for GPU jobs (gpu.go)
	// transient: a pool of the sandbox backend's (sandbox.go), closed
	// once empty and unused for the idle timeout.
	transient bool
	tag       string
	mu        sync.Mutex
	cond      *sync.Cond // signalled when an environment becomes idle or a make fails

	idle   []*env
	inUse  int
	making int
	// refilling are those of making made in the background for the idle
	// list (refillLocked), which a waiting caller can take; the others
	// are callers' own.
	refilling int
	waiting   int // callers waiting for a refill
	peak      int // most in use at once since the last tick
	target    int // environments to keep, idle or in use: last second's peak in use, plus one spare
	lastUse   time.Time
	closed    bool
	wg        sync.WaitGroup // makes and destroys in the background
}

// draw takes an idle environment, or makes one when none is idle and
// none is being made for it to wait for.
func (p *pool) draw(ctx context.Context) (*env, error) {
	p.mu.Lock()
	p.lastUse = time.Now()
	for len(p.idle) == 0 && !p.closed {
		// Wait for an environment already being made (a refill) when
		// there is one for every caller waiting; otherwise make one: a
		// burst makes environments in parallel, a trickle takes refills.
		// Run's callers wait for the other callers' makes too, whose
		// environments come back after their jobs; a sandbox pool's
		// never come back, and only refills reach its idle list.
		coming := p.making
		if p.transient {
			coming = p.refilling
		}
		if coming > p.waiting {
			p.waiting++
			p.cond.Wait()
			p.waiting--
			continue
		}
		p.making++
		p.mu.Unlock()
		e, err := p.make(ctx)
		p.mu.Lock()
		p.making--
		if err != nil {
			p.cond.Broadcast()
			p.mu.Unlock()
			return nil, err
		}
		p.inUse++
		p.peak = max(p.peak, p.inUse)
		p.refillLocked()
		p.mu.Unlock()
		return e, nil
	}
	if p.closed {
		p.mu.Unlock()
		return nil, errdefs.Unavailablef("fncall: shutting down")
	}
	e := p.idle[len(p.idle)-1]
	p.idle = p.idle[:len(p.idle)-1]
	if e.sb.Exited().Err() != nil {
		// It died while idle (a sweep, the OOM killer): another.
		p.s.failed.Add(1)
		p.destroyLater(e)
		p.mu.Unlock()
		return p.draw(ctx)
	}
	p.inUse++
	p.peak = max(p.peak, p.inUse)
	p.refillLocked()
	p.mu.Unlock()
	return e, nil
}

// take draws an environment that leaves the pool for good (a sandbox of
// the backend on Create): the pool refills as for a draw, and counts it
// no longer.
func (p *pool) take(ctx context.Context) (*env, error) {
	e, err := p.draw(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse--
	p.refillLocked()
	return e, nil
}

// drain destroys the idle environments and waits for those being made or
// destroyed in the background, until none is left idle.
func (p *pool) drain() {
	for {
		p.mu.Lock()
		idle := p.idle
		p.idle = nil
		p.mu.Unlock()
		for _, e := range idle {
			p.destroy(e)
		}
		p.wg.Wait()
		p.mu.Lock()
		n := len(p.idle)
		p.mu.Unlock()
		if n == 0 {
			return
		}
	}
}

// refillLocked starts making environments in the background until those
// idle, in use and being made reach the target.
//
// At most one refill per CPU runs at a time: a create is CPU work, and at
// saturation more of them at once (a refill for every caller, beside the
// callers' own) only made each slower.
func (p *pool) refillLocked() {
	for !p.closed && len(p.idle)+p.making+p.inUse < p.target && len(p.idle)+p.making < p.s.opts.MaxIdle && p.refilling < runtime.NumCPU() {
		p.making++
		p.refilling++
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			e, err := p.make(context.Background())
			p.mu.Lock()
			defer p.mu.Unlock()
			p.making--
			p.refilling--
			if err != nil {
				p.s.log.Warn("fncall: make environment", "err", err)
				p.cond.Broadcast()
				return
			}
			p.idleLocked(e)
		}()
	}
}

// idleLocked adds e to the idle environments, or destroys it when the
// pool has enough or is closed.
func (p *pool) idleLocked(e *env) {
	// A caller waiting for one being made takes it whatever the target
	// (a tick or drain may have lowered it meanwhile): it would otherwise
	// wait for a signal that never comes.
	if p.closed || (p.waiting == 0 && (len(p.idle)+p.inUse >= p.target || len(p.idle) >= p.s.opts.MaxIdle)) {
		p.destroyLater(e)
		return
	}
	p.idle = append(p.idle, e)
	p.cond.Signal()
}

// put returns an environment after a job and its reset succeeded.
func (p *pool) put(e *env) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse--
	p.idleLocked(e)
}

// discard destroys an environment that failed, and refills.
func (p *pool) discard(e *env) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse--
	p.s.failed.Add(1)
	p.destroyLater(e)
	p.refillLocked()
}

func (p *pool) destroyLater(e *env) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.destroy(e)
	}()
}

func (p *pool) destroy(e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.sb.Destroy(ctx); err != nil {
		p.s.log.Error("fncall: destroy environment", "env", e.sb.ID(), "err", err)
	}
	p.s.destroyed.Add(1)
}

// make creates one environment of the pool's image.
func (p *pool) make(ctx context.Context) (*env, error) {
	o := p.s.opts
	var devs []backend.Device
	var mounts []backend.Mount
	if p.gpu {
		devs, mounts = o.GPUs.Control, o.GPUs.Mounts
	}
	sb, err := o.Backend.Create(ctx, backend.Spec{
		ID:          p.s.newID(p.tag),
		Hostname:    "fncall",
		Layers:      p.img.Layers,
		MemoryBytes: o.MemoryBytes,
		PidsMax:     o.PidsMax,
		UserNS:      p.img.UserNS,
		Rlimits:     p.img.Rlimits,
		AllowSetuid: p.img.AllowSetuid,
		Etc:         p.img.Etc,
		DiskBytes:   p.disk,
		Devices:     devs,
		Mounts:      mounts,
	})
	if err != nil {
		return nil, err
	}
	run, ok := sb.(backend.JobRunner)
	if !ok {
		_ = sb.Destroy(context.Background())
		return nil, errdefs.Unsupportedf("fncall: backend %s runs no jobs", o.Backend.Name())
	}
	p.s.created.Add(1)
	return &env{sb: sb, run: run}, nil
}

// tick adapts the target to the last second's peak (plus a spare, so that
// a caller beyond it does not wait for a create) and trims idle
// environments above it, or all of them once the pool has had no call
// for idleTimeout. The pool itself stays, holding its image's layers,
// until the service closes: a call racing its removal would need the
// layers again.
func (p *pool) tick(idleTimeout time.Duration) (unused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = p.peak + p.s.spare()
	p.peak = p.inUse
	keep := min(max(p.target-p.inUse, 0), p.s.opts.MaxIdle)
	if time.Since(p.lastUse) > idleTimeout {
		keep = 0
	}
	for len(p.idle) > keep {
		e := p.idle[0]
		p.idle = p.idle[1:]
		p.destroyLater(e)
	}
	return keep == 0 && p.inUse == 0 && p.making == 0 && time.Since(p.lastUse) > idleTimeout
}

// close destroys every idle environment, waits for those in the
// background, and lets go of the image's layers (released after the
// image's last pool). Environments in use are destroyed
// when they come back (put sees closed).
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.cond.Broadcast()
	p.mu.Unlock()
	for _, e := range idle {
		p.destroy(e)
	}
	p.wg.Wait()
	p.s.unref(p.ref)
}

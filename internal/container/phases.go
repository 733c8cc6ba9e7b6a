package container

import "time"

// phases times the steps of one create, for Options.ObservePhase: each
// mark ends the step begun at the previous one; flush reports them, only
// for a create that succeeded, so that failures do not skew the steps.
type phases struct {
	obs   func(string, time.Duration)
	last  time.Time
	steps []phaseTime
}

type phaseTime struct {
	name string
	d    time.Duration
}

func (b *Backend) newPhases() *phases {
	if b.opts.ObservePhase == nil {
		return &phases{}
	}
	return &phases{obs: b.opts.ObservePhase, last: time.Now(), steps: make([]phaseTime, 0, 8)}
}

func (p *phases) mark(name string) {
	if p.obs == nil {
		return
	}
	now := time.Now()
	p.steps = append(p.steps, phaseTime{name, now.Sub(p.last)})
	p.last = now
}

func (p *phases) flush() {
	for _, s := range p.steps {
		p.obs(s.name, s.d)
	}
}

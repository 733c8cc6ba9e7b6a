package placement

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/warrenrl/warren/internal/errdefs"
)

// NodeState is what a node reports (the gateway feeds reports in; it owns
// transport). Nodes returns it too, with the placer's reservations added.
type NodeState struct {
	Name             string
	CPUMillis        int64 // capacity
	MemoryBytes      int64 // capacity
	MaxSandboxes     int   // 0 = no cap
	AllocCPUMillis   int64 // sum of the live sandboxes' requests
	AllocMemoryBytes int64
	Sandboxes        int
	Load             float64        // run-queue per core, 1-minute
	Layers           []string       // layer digests mounted or cached on the node
	QoS              map[string]int // live sandboxes per QoS class ("ls", "be")
	LabelCounts      map[string]int // "key=value" -> live sandboxes carrying it (for anti-affinity)
	// Down is set in Nodes' answer for a node marked down; Update ignores it.
	Down bool
}

// Request is one sandbox to place.
type Request struct {
	CPUMillis, MemoryBytes int64
	QoS                    string
	Layers                 []string // the image's layer digests, in order
	// LayerSizes, when it has one entry per layer, weighs locality by
	// bytes instead of by layer count.
	LayerSizes []int64
	// AntiAffinity lists "key=value" labels the new sandbox carries and
	// that should spread: a node already running sandboxes with them
	// scores lower.
	AntiAffinity []string
}

// Options tune a Placer.
type Options struct {
	Overcommit float64 // CPU and memory over-commit ratio, e.g. 4; <= 0 means 1
	K          int     // best-of-K; <= 0 means DefaultK
	Seed       int64   // 0: runtime randomness; otherwise a deterministic sequence (for tests)
	// ScanAll scores every up node instead of sampling K: the exhaustive
	// baseline that benchmarks compare best-of-K against.
	ScanAll bool
}

// DefaultK is the number of random candidates per placement. Two choices
// already take the maximum load from log n/log log n to log log n (the
// power of two choices); three buy a margin for down nodes and
// anti-affinity at a cost of one more node lock.
const DefaultK = 3

// Score weights; doc.go explains the formula.
const (
	wFree = 1.0
	wLoad = 0.5
	wLoc  = 0.6
	wQoS  = 0.5
	wAnti = 2.0
	// spreadTarget: an image on fewer nodes than this gets no locality
	// preference, so its first placements land on different nodes.
	spreadTarget = 3
	// antiRounds bounds the extra sampling rounds spent looking for a node
	// without the request's anti-affinity labels.
	antiRounds = 16
	// reserveTries bounds the choose-then-reserve retries when a chosen
	// node filled up under a concurrent caller, before the fallback scan.
	reserveTries = 4
)

// Placer chooses nodes. Its methods are safe for concurrent use.
type Placer struct {
	overcommit float64
	k          int
	scanAll    bool
	seeded     bool
	rng        atomic.Uint64

	mu   sync.Mutex // serialises membership changes; readers use view
	view atomic.Pointer[view]
	idx  layerIndex
}

// view is an immutable snapshot of membership, replaced on each change so
// that placements read it without a lock.
type view struct {
	byName map[string]*node
	all    []*node
	up     []*node
}

// New returns an empty Placer.
func New(o Options) *Placer {
	p := &Placer{overcommit: o.Overcommit, k: o.K, scanAll: o.ScanAll, seeded: o.Seed != 0}
	if p.overcommit <= 0 {
		p.overcommit = 1
	}
	if p.k <= 0 {
		p.k = DefaultK
	}
	p.rng.Store(uint64(o.Seed))
	p.idx.m = map[string]*holders{}
	p.view.Store(&view{byName: map[string]*node{}})
	return p
}

// rand returns a random number: runtime randomness, or a splitmix64
// sequence when seeded (lock-free either way; sequential callers of a
// seeded Placer get the same choices every run).
func (p *Placer) rand() uint64 {
	if !p.seeded {
		return rand.Uint64()
	}
	z := p.rng.Add(0x9e3779b97f4a7c15)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (p *Placer) intn(n int) int { return int(p.rand() % uint64(n)) }

// Update records a node's report: it replaces the node's reported state and
// keeps the reservations made since the previous report (doc.go). A node
// that was down is up again; an unknown node joins.
func (p *Placer) Update(s NodeState) {
	n := p.view.Load().byName[s.Name]
	if n == nil || n.down.Load() {
		n = p.membership(s.Name, func(v *view) *node {
			n := v.byName[s.Name]
			if n == nil {
				n = newNode(s.Name)
				v.byName[s.Name] = n
			}
			n.down.Store(false)
			return n
		})
	}
	n.update(&p.idx, s)
}

// Down stops placements on a node (it keeps its entry and state); Update
// brings it back.
func (p *Placer) Down(name string) {
	p.membership(name, func(v *view) *node {
		if n := v.byName[name]; n != nil {
			n.down.Store(true)
		}
		return nil
	})
}

// Remove forgets a node.
func (p *Placer) Remove(name string) {
	n := p.membership(name, func(v *view) *node {
		n := v.byName[name]
		delete(v.byName, name)
		return n
	})
	if n != nil {
		n.forget(&p.idx)
	}
}

// membership applies change to a copy of the view and publishes it.
func (p *Placer) membership(name string, change func(*view) *node) *node {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.view.Load()
	v := &view{byName: make(map[string]*node, len(old.byName)+1)}
	for k, n := range old.byName {
		v.byName[k] = n
	}
	n := change(v)
	for _, n := range v.byName {
		v.all = append(v.all, n)
	}
	slices.SortFunc(v.all, func(a, b *node) int {
		if a.name < b.name {
			return -1
		}
		if a.name > b.name {
			return 1
		}
		return 0
	})
	for _, n := range v.all {
		if !n.down.Load() {
			v.up = append(v.up, n)
		}
	}
	p.view.Store(v)
	return n
}

// Place chooses a node for r and reserves r there. It returns an
// errdefs.Exhausted error when no up node fits.
func (p *Placer) Place(r Request) (string, error) {
	if err := validate(r); err != nil {
		return "", err
	}
	v := p.view.Load()
	if len(v.up) == 0 {
		return "", errdefs.Exhaustedf("no node is up to place a sandbox on")
	}
	if !p.scanAll {
		for range reserveTries {
			n := p.choose(v, r, false)
			if n == nil {
				break
			}
			if n.reserve(p, r) {
				return n.name, nil
			}
		}
	}
	// Sampling found nothing that fits (a nearly full cluster) or lost
	// races: score every node, so Exhausted means no node fits.
	for {
		n := p.choose(v, r, true)
		if n == nil {
			return "", errdefs.Exhaustedf("no node fits cpu=%dm memory=%d bytes (%d nodes up)", r.CPUMillis, r.MemoryBytes, len(v.up))
		}
		if n.reserve(p, r) {
			return n.name, nil
		}
	}
}

// PlaceN places n sandboxes of the same request, each placement seeing the
// reservations of the ones before it. It is all or nothing: if one does not
// fit, the ones made are released and the error is Exhausted.
func (p *Placer) PlaceN(r Request, n int) ([]string, error) {
	if n < 0 {
		return nil, errdefs.Invalidf("placement count %d is negative", n)
	}
	out := make([]string, 0, n)
	for range n {
		name, err := p.Place(r)
		if err != nil {
			for _, m := range out {
				p.Release(m, r)
			}
			return nil, errdefs.Wrap(errdefs.Exhausted, err, "batch placement")
		}
		out = append(out, name)
	}
	return out, nil
}

// Release takes back a reservation of r on node: a create that failed, or
// a sandbox that ended before the node's next report.
func (p *Placer) Release(node string, r Request) {
	if n := p.view.Load().byName[node]; n != nil {
		n.release(r)
	}
}

// Nodes returns every node's state with the reservations added, sorted by
// name.
func (p *Placer) Nodes() []NodeState {
	v := p.view.Load()
	out := make([]NodeState, 0, len(v.all))
	for _, n := range v.all {
		out = append(out, n.state())
	}
	return out
}

func validate(r Request) error {
	if r.CPUMillis < 0 || r.MemoryBytes < 0 {
		return errdefs.Invalidf("placement request cpu=%dm memory=%d is negative", r.CPUMillis, r.MemoryBytes)
	}
	return nil
}

// maxCand bounds the candidate buffer: K random plus K layer holders, and
// the extra anti-affinity rounds reuse it.
const maxCand = 64

// choose returns the best-scoring candidate that fits, or nil. all scores
// every up node (the fallback, or the ScanAll baseline).
func (p *Placer) choose(v *view, r Request, all bool) *node {
	var buf [maxCand]*node
	cand := buf[:0]
	k := min(p.k, maxCand/2)
	holderCount := p.idx.holdersOf(r.Layers, k, p, func(n *node) { cand = appendUnique(cand, n) })
	if all || p.scanAll {
		cand = v.up
	} else {
		cand = p.sample(v.up, cand, k)
	}
	var best *node
	var bestScore float64
	var bestAnti int
	for round := 0; ; round++ {
		for _, n := range cand {
			s, anti, ok := n.score(p, r, holderCount)
			if ok && (best == nil || s > bestScore) {
				best, bestScore, bestAnti = n, s, anti
			}
		}
		// Every candidate carries an anti-affinity label: sample afresh
		// (bounded) for a node without one.
		if best == nil || bestAnti == 0 || all || p.scanAll || round >= antiRounds || len(v.up) <= k {
			return best
		}
		cand = p.sample(v.up, buf[:0], k)
	}
}

// sample appends up to k distinct up nodes chosen uniformly to cand.
func (p *Placer) sample(up []*node, cand []*node, k int) []*node {
	if len(up) <= k {
		for _, n := range up {
			cand = appendUnique(cand, n)
		}
		return cand
	}
	want := len(cand) + k
	for tries := 0; len(cand) < want && tries < 2*k; tries++ {
		cand = appendUnique(cand, up[p.intn(len(up))])
	}
	return cand
}

func appendUnique(cand []*node, n *node) []*node {
	if slices.Contains(cand, n) || len(cand) == cap(cand) {
		return cand
	}
	return append(cand, n)
}

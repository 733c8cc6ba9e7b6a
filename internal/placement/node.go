package placement

import (
	"maps"
	"sync"
	"sync/atomic"
)

// node is one node's reported state plus the placer's reservations on it.
type node struct {
	name string
	down atomic.Bool

	mu      sync.Mutex
	removed bool
	rep     NodeState
	layers  map[string]struct{} // rep.Layers as a set
	// pend holds layers a placement sent to the node that its reports do
	// not show yet, with the report generation they were added in; they
	// count for locality until the second report after (doc.go).
	pend map[string]int
	gen  int
	// res[0] is reserved since the last report, res[1] before it.
	res [2]delta
}

// delta is the reservations of one report generation.
type delta struct {
	cpu, mem int64
	n        int
	qos      map[string]int
	labels   map[string]int
}

func newNode(name string) *node {
	return &node{name: name, layers: map[string]struct{}{}, pend: map[string]int{}}
}

func (n *node) has(layer string) bool {
	if _, ok := n.layers[layer]; ok {
		return true
	}
	_, ok := n.pend[layer]
	return ok
}

// update applies a report (Placer.Update).
func (n *node) update(idx *layerIndex, s NodeState) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.removed {
		return
	}
	s.QoS = maps.Clone(s.QoS)
	s.LabelCounts = maps.Clone(s.LabelCounts)
	s.Layers = append([]string(nil), s.Layers...)
	s.Down = false
	n.gen++
	n.res[1], n.res[0] = n.res[0], delta{}

	var gone, came []string
	newSet := n.layers
	if !sameLayers(n.rep.Layers, s.Layers) {
		newSet = make(map[string]struct{}, len(s.Layers))
		for _, l := range s.Layers {
			newSet[l] = struct{}{}
		}
		for l := range n.layers {
			if _, ok := newSet[l]; !ok {
				if _, p := n.pend[l]; !p {
					gone = append(gone, l)
				}
			}
		}
		for l := range newSet {
			if !n.has(l) {
				came = append(came, l)
			}
		}
	}
	for l, g := range n.pend {
		if _, ok := newSet[l]; ok {
			delete(n.pend, l) // the report shows it now
		} else if g < n.gen-1 {
			delete(n.pend, l) // two reports without it: the pull failed or it was evicted
			gone = append(gone, l)
		}
	}
	n.rep, n.layers = s, newSet
	idx.apply(n, came, gone)
}

// forget drops a removed node from the layer index.
func (n *node) forget(idx *layerIndex) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.removed = true
	var gone []string
	for l := range n.layers {
		gone = append(gone, l)
	}
	for l := range n.pend {
		if _, ok := n.layers[l]; !ok {
			gone = append(gone, l)
		}
	}
	idx.apply(n, nil, gone)
}

func sameLayers(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// effective is the reported allocation plus both reservation generations.
func (n *node) effective() (cpu, mem int64, count int) {
	return n.rep.AllocCPUMillis + n.res[0].cpu + n.res[1].cpu,
		n.rep.AllocMemoryBytes + n.res[0].mem + n.res[1].mem,
		n.rep.Sandboxes + n.res[0].n + n.res[1].n
}

func (n *node) qos(class string) int {
	return n.rep.QoS[class] + n.res[0].qos[class] + n.res[1].qos[class]
}

func (n *node) label(l string) int {
	return n.rep.LabelCounts[l] + n.res[0].labels[l] + n.res[1].labels[l]
}

// fits reports whether r fits under over-commit and the sandbox cap, and
// the utilisation it would leave (the largest of CPU, memory and slots).
// Called with n.mu held.
func (n *node) fits(oc float64, r Request) (util float64, ok bool) {
	cpu, mem, count := n.effective()
	if n.rep.MaxSandboxes > 0 && count+1 > n.rep.MaxSandboxes {
		return 0, false
	}
	uc, ok1 := usage(cpu+r.CPUMillis, n.rep.CPUMillis, oc)
	um, ok2 := usage(mem+r.MemoryBytes, n.rep.MemoryBytes, oc)
	if !ok1 || !ok2 {
		return 0, false
	}
	util = max(uc, um)
	if n.rep.MaxSandboxes > 0 {
		util = max(util, float64(count+1)/float64(n.rep.MaxSandboxes))
	}
	return util, true
}

func usage(used, capacity int64, oc float64) (float64, bool) {
	if used <= 0 {
		return 0, true
	}
	c := float64(capacity) * oc
	if float64(used) > c {
		return 0, false
	}
	return float64(used) / c, true
}

// score rates n for r (higher is better); anti is the count of sandboxes
// on n carrying the request's anti-affinity labels. ok is false when r
// does not fit or n is down.
func (n *node) score(p *Placer, r Request, holderCount int) (s float64, anti int, ok bool) {
	if n.down.Load() {
		return 0, 0, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.removed {
		return 0, 0, false
	}
	util, ok := n.fits(p.overcommit, r)
	if !ok {
		return 0, 0, false
	}
	s = wFree * (1 - util)
	s -= wLoad * min(n.rep.Load, 2) / 2
	s += wLoc * n.locality(r, holderCount >= spreadTarget)
	s -= wQoS * n.qosPenalty(r.QoS)
	for _, l := range r.AntiAffinity {
		anti += n.label(l)
	}
	s -= wAnti * float64(anti)
	return s, anti, true
}

// locality is the fraction of r's image on n, by bytes when sizes are
// given. Layers n reports (mounted there) always count: that is the mount
// and page cache a placement there saves. Layers only arriving (sent by a
// placement, not yet in a report) count only when arriving too: once the
// image is on spreadTarget nodes, so that a burst of a new image spreads
// instead of following its first placement.
func (n *node) locality(r Request, arriving bool) float64 {
	if len(r.Layers) == 0 {
		return 0
	}
	bySize := len(r.LayerSizes) == len(r.Layers)
	var have, total float64
	for i, l := range r.Layers {
		w := 1.0
		if bySize {
			w = float64(max(r.LayerSizes[i], 1))
		}
		total += w
		if _, ok := n.layers[l]; ok {
			have += w
		} else if _, ok := n.pend[l]; ok && arriving {
			have += w
		}
	}
	return have / total
}

// qosPenalty keeps latency-sensitive sandboxes off nodes whose run queue is
// busy with best-effort work (the penalty grows with both the best-effort
// share and the load), and packs best-effort with best-effort so the nodes
// latency-sensitive sandboxes live on stay calm.
func (n *node) qosPenalty(class string) float64 {
	ls, be := n.qos("ls"), n.qos("be")
	if ls+be == 0 {
		return 0
	}
	switch class {
	case "ls":
		return float64(be) / float64(ls+be) * min(n.rep.Load, 1)
	case "be":
		return 0.5 * float64(ls) / float64(ls+be)
	}
	return 0
}

// reserve adds r to n if it still fits (a concurrent caller may have
// filled n since it was scored) and marks r's layers as arriving.
func (n *node) reserve(p *Placer, r Request) bool {
	if n.down.Load() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.removed {
		return false
	}
	if _, ok := n.fits(p.overcommit, r); !ok {
		return false
	}
	d := &n.res[0]
	d.cpu += r.CPUMillis
	d.mem += r.MemoryBytes
	d.n++
	if r.QoS != "" {
		if d.qos == nil {
			d.qos = map[string]int{}
		}
		d.qos[r.QoS]++
	}
	for _, l := range r.AntiAffinity {
		if d.labels == nil {
			d.labels = map[string]int{}
		}
		d.labels[l]++
	}
	var came []string
	for _, l := range r.Layers {
		if !n.has(l) {
			came = append(came, l)
		}
		if _, ok := n.layers[l]; !ok {
			n.pend[l] = n.gen
		}
	}
	if len(came) > 0 {
		p.idx.apply(n, came, nil)
	}
	return true
}

// release takes r back from the newest reservations first; what is left
// over was a sandbox the last report already counted, and stays counted
// (over, never under) until the next report.
func (n *node) release(r Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cpu, mem, cnt := r.CPUMillis, r.MemoryBytes, 1
	for i := range n.res {
		d := &n.res[i]
		take := func(have *int64, want *int64) {
			t := min(*have, *want)
			*have -= t
			*want -= t
		}
		take(&d.cpu, &cpu)
		take(&d.mem, &mem)
		if cnt > 0 && d.n > 0 {
			d.n--
			cnt--
		}
	}
	takeKey(&n.res, r.QoS)
	for _, l := range r.AntiAffinity {
		takeKeyLabel(&n.res, l)
	}
}

func takeKey(res *[2]delta, k string) {
	for i := range res {
		if res[i].qos[k] > 0 {
			res[i].qos[k]--
			return
		}
	}
}

func takeKeyLabel(res *[2]delta, k string) {
	for i := range res {
		if res[i].labels[k] > 0 {
			res[i].labels[k]--
			return
		}
	}
}

// state is the node's report with the reservations added.
func (n *node) state() NodeState {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.rep
	s.Name = n.name
	s.AllocCPUMillis, s.AllocMemoryBytes, s.Sandboxes = n.effective()
	s.Down = n.down.Load()
	s.QoS = maps.Clone(n.rep.QoS)
	s.LabelCounts = maps.Clone(n.rep.LabelCounts)
	for _, d := range n.res {
		for k, v := range d.qos {
			if s.QoS == nil {
				s.QoS = map[string]int{}
			}
			s.QoS[k] += v
		}
		for k, v := range d.labels {
			if s.LabelCounts == nil {
				s.LabelCounts = map[string]int{}
			}
			s.LabelCounts[k] += v
		}
	}
	s.Layers = append([]string(nil), n.rep.Layers...)
	for l := range n.pend {
		if _, ok := n.layers[l]; !ok {
			s.Layers = append(s.Layers, l)
		}
	}
	return s
}

// layerIndex maps a layer digest to the nodes that have it or are pulling
// it, so that locality finds an image's holders without a scan.
type layerIndex struct {
	mu sync.RWMutex
	m  map[string]*holders
}

type holders struct {
	list []*node
	pos  map[*node]int
}

// apply records n gaining came and losing gone. Called with n.mu held
// (lock order: node, then index).
func (x *layerIndex) apply(n *node, came, gone []string) {
	if len(came) == 0 && len(gone) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, l := range came {
		h := x.m[l]
		if h == nil {
			h = &holders{pos: map[*node]int{}}
			x.m[l] = h
		}
		if _, ok := h.pos[n]; !ok {
			h.pos[n] = len(h.list)
			h.list = append(h.list, n)
		}
	}
	for _, l := range gone {
		h := x.m[l]
		if h == nil {
			continue
		}
		i, ok := h.pos[n]
		if !ok {
			continue
		}
		last := h.list[len(h.list)-1]
		h.list[i] = last
		h.pos[last] = i
		h.list = h.list[:len(h.list)-1]
		delete(h.pos, n)
		if len(h.list) == 0 {
			delete(x.m, l)
		}
	}
}

// holdersOf finds the most specific of layers (searching from the top)
// that some node holds, passes up to k of its holders to add, and returns
// how many nodes hold it.
func (x *layerIndex) holdersOf(layers []string, k int, p *Placer, add func(*node)) int {
	if len(layers) == 0 {
		return 0
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	for i := len(layers) - 1; i >= 0; i-- {
		h := x.m[layers[i]]
		if h == nil {
			continue
		}
		if len(h.list) <= k {
			for _, n := range h.list {
				add(n)
			}
		} else {
			for range k {
				add(h.list[p.intn(len(h.list))])
			}
		}
		return len(h.list)
	}
	return 0
}

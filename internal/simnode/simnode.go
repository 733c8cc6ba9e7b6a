// Package simnode is a simulated node: the node side of the cluster
// protocol (accept a sandbox create, delete it, report capacity, load, QoS
// classes, labels and layers) without running anything. `warren bench
// sched` drives 160 of them in-process behind a placement.Placer; the same
// nodes can sit behind the gateway's transport, answering its create and
// delete calls and sending Report on its report interval, to measure the
// gateway path without real sandboxes.
//
// A Node enforces capacity itself (under the same over-commit ratio), so a
// placement made from a stale report is refused here, as a real node
// would, and the benchmark counts it.
package simnode

import (
	"slices"
	"sync"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/placement"
)

// Config is a node's capacity.
type Config struct {
	Name         string
	CPUMillis    int64
	MemoryBytes  int64
	MaxSandboxes int
	Overcommit   float64 // <= 0 means 1
}

// Sandbox is one simulated sandbox.
type Sandbox struct {
	ID          uint64
	CPUMillis   int64
	MemoryBytes int64
	QoS         string
	Layers      []string
	Labels      []string
}

// Node is a simulated node. Its methods are safe for concurrent use.
type Node struct {
	cfg Config

	mu        sync.Mutex
	live      []Sandbox
	pos       map[uint64]int
	cpu, mem  int64
	qos       map[string]int
	labels    map[string]int
	layers    []string // cached layers, in arrival order
	layerSet  map[string]struct{}
	beCPU     int64
	created   int
	refused   int
	layerHits int
}

// New returns an empty node.
func New(cfg Config) *Node {
	if cfg.Overcommit <= 0 {
		cfg.Overcommit = 1
	}
	return &Node{cfg: cfg, pos: map[uint64]int{}, qos: map[string]int{}, labels: map[string]int{}, layerSet: map[string]struct{}{}}
}

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Cache adds layers to the node's cache without a sandbox (an image pulled
// earlier).
func (n *Node) Cache(layers ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cacheLocked(layers)
}

func (n *Node) cacheLocked(layers []string) (hit bool) {
	hit = true
	for _, l := range layers {
		if _, ok := n.layerSet[l]; !ok {
			hit = false
			n.layerSet[l] = struct{}{}
			n.layers = append(n.layers, l)
		}
	}
	return hit
}

// Create accepts sb if it fits the node's own capacity; local reports
// whether every layer of its image was already on the node. A sandbox that
// does not fit is an errdefs.Exhausted error.
func (n *Node) Create(sb Sandbox) (local bool, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	oc := n.cfg.Overcommit
	if (n.cfg.MaxSandboxes > 0 && len(n.live) >= n.cfg.MaxSandboxes) ||
		float64(n.cpu+sb.CPUMillis) > float64(n.cfg.CPUMillis)*oc ||
		float64(n.mem+sb.MemoryBytes) > float64(n.cfg.MemoryBytes)*oc {
		n.refused++
		return false, errdefs.Exhaustedf("node %s is full", n.cfg.Name)
	}
	if _, dup := n.pos[sb.ID]; dup {
		return false, errdefs.AlreadyExistsf("sandbox %d exists on %s", sb.ID, n.cfg.Name)
	}
	n.pos[sb.ID] = len(n.live)
	n.live = append(n.live, sb)
	n.cpu += sb.CPUMillis
	n.mem += sb.MemoryBytes
	if sb.QoS != "" {
		n.qos[sb.QoS]++
	}
	if sb.QoS == "be" {
		n.beCPU += sb.CPUMillis
	}
	for _, l := range sb.Labels {
		n.labels[l]++
	}
	n.created++
	local = n.cacheLocked(sb.Layers)
	if local {
		n.layerHits++
	}
	return local, nil
}

// Delete removes the sandbox with id.
func (n *Node) Delete(id uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, ok := n.pos[id]
	if !ok {
		return false
	}
	n.removeLocked(i)
	return true
}

// DeleteAt removes the i-th live sandbox (i modulo the count), for churn
// without tracking ids; false if the node is empty.
func (n *Node) DeleteAt(i int) (Sandbox, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.live) == 0 {
		return Sandbox{}, false
	}
	i %= len(n.live)
	sb := n.live[i]
	n.removeLocked(i)
	return sb, true
}

func (n *Node) removeLocked(i int) {
	sb := n.live[i]
	last := len(n.live) - 1
	n.live[i] = n.live[last]
	n.pos[n.live[i].ID] = i
	n.live = n.live[:last]
	delete(n.pos, sb.ID)
	n.cpu -= sb.CPUMillis
	n.mem -= sb.MemoryBytes
	if sb.QoS != "" {
		n.qos[sb.QoS]--
	}
	if sb.QoS == "be" {
		n.beCPU -= sb.CPUMillis
	}
	for _, l := range sb.Labels {
		if n.labels[l]--; n.labels[l] <= 0 {
			delete(n.labels, l)
		}
	}
}

// Len is the number of live sandboxes.
func (n *Node) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.live)
}

// Stats are the node's counters since New.
type Stats struct {
	Created, Refused, LayerHits, Live int
	AllocCPUMillis                    int64
}

// Stats returns the counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return Stats{Created: n.created, Refused: n.refused, LayerHits: n.layerHits, Live: len(n.live), AllocCPUMillis: n.cpu}
}

// ResetStats zeroes the counters (after a warm-up).
func (n *Node) ResetStats() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.created, n.refused, n.layerHits = 0, 0, 0
}

// Report is the node's report. Load is modelled, not measured: the run
// queue per core of sandboxes that use a fifth of their CPU request, and
// best-effort ones all of it (they are the batch work that fills queues).
func (n *Node) Report() placement.NodeState {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := placement.NodeState{
		Name: n.cfg.Name, CPUMillis: n.cfg.CPUMillis, MemoryBytes: n.cfg.MemoryBytes, MaxSandboxes: n.cfg.MaxSandboxes,
		AllocCPUMillis: n.cpu, AllocMemoryBytes: n.mem, Sandboxes: len(n.live),
		Layers: slices.Clone(n.layers),
		QoS:    map[string]int{}, LabelCounts: map[string]int{},
	}
	if n.cfg.CPUMillis > 0 {
		s.Load = (float64(n.cpu-n.beCPU)/5 + float64(n.beCPU)) / float64(n.cfg.CPUMillis)
	}
	for k, v := range n.qos {
		s.QoS[k] = v
	}
	for k, v := range n.labels {
		s.LabelCounts[k] = v
	}
	return s
}

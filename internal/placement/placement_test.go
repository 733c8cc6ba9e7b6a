package placement

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warrenrl/warren/internal/errdefs"
)

const gib = 1 << 30

func big(name string) NodeState {
	return NodeState{Name: name, CPUMillis: 64000, MemoryBytes: 256 * gib}
}

func cluster(t *testing.T, o Options, n int, edit func(i int, s *NodeState)) *Placer {
	t.Helper()
	if o.Seed == 0 {
		o.Seed = 1
	}
	p := New(o)
	for i := range n {
		s := big(fmt.Sprintf("n%02d", i))
		if edit != nil {
			edit(i, &s)
		}
		p.Update(s)
	}
	return p
}

func counts(names []string) map[string]int {
	m := map[string]int{}
	for _, n := range names {
		m[n]++
	}
	return m
}

func mustPlace(t *testing.T, p *Placer, r Request) string {
	t.Helper()
	n, err := p.Place(r)
	if err != nil {
		t.Fatalf("place: %v", err)
	}
	return n
}

// A request larger than a node's capacity never lands there, and with no
// node large enough the answer is Exhausted.
func TestCapacityFilterSkipsNodesTooSmall(t *testing.T) {
	p := cluster(t, Options{}, 10, func(i int, s *NodeState) {
		if i != 7 {
			s.CPUMillis = 1000
		}
	})
	for range 50 {
		if n := mustPlace(t, p, Request{CPUMillis: 2000}); n != "n07" {
			t.Fatalf("2000m placed on %s, which has 1000m", n)
		}
		p.Release("n07", Request{CPUMillis: 2000})
	}
	_, err := p.Place(Request{CPUMillis: 100000})
	if !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("oversized request: err %v, want exhausted", err)
	}
}

// Over-commit multiplies capacity: 4x lets four full-size requests share a
// node, and no more.
func TestOvercommitRatio(t *testing.T) {
	for _, tc := range []struct {
		oc   float64
		want int
	}{{1, 1}, {4, 4}} {
		p := New(Options{Overcommit: tc.oc, Seed: 1})
		p.Update(NodeState{Name: "a", CPUMillis: 1000, MemoryBytes: gib})
		got := 0
		for {
			if _, err := p.Place(Request{CPUMillis: 1000, MemoryBytes: gib / 2}); err != nil {
				if !errors.Is(err, errdefs.ErrExhausted) {
					t.Fatal(err)
				}
				break
			}
			got++
		}
		if got != tc.want {
			t.Errorf("overcommit %v: %d placements, want %d", tc.oc, got, tc.want)
		}
	}
}

// MaxSandboxes caps the count whatever the free CPU and memory.
func TestMaxSandboxesCap(t *testing.T) {
	p := New(Options{Seed: 1})
	s := big("a")
	s.MaxSandboxes = 3
	s.Sandboxes = 1
	p.Update(s)
	for range 2 {
		mustPlace(t, p, Request{CPUMillis: 1})
	}
	if _, err := p.Place(Request{CPUMillis: 1}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("third sandbox over cap 3: err %v, want exhausted", err)
	}
}

// A down node gets nothing; its next report brings it back.
func TestDownNodesSkippedUntilReport(t *testing.T) {
	p := cluster(t, Options{}, 3, nil)
	p.Down("n01")
	for range 200 {
		if n := mustPlace(t, p, Request{CPUMillis: 10}); n == "n01" {
			t.Fatal("placed on a down node")
		}
	}
	if st := p.Nodes(); !st[1].Down {
		t.Fatalf("Nodes: n01 not marked down: %+v", st[1])
	}
	p.Update(big("n01")) // n01 is now the emptiest
	if n := mustPlace(t, p, Request{CPUMillis: 10}); n != "n01" {
		t.Fatalf("after its report the empty n01 should win, got %s", n)
	}
	p.Remove("n01")
	for range 50 {
		if n := mustPlace(t, p, Request{CPUMillis: 10}); n == "n01" {
			t.Fatal("placed on a removed node")
		}
	}
	if len(p.Nodes()) != 2 {
		t.Fatalf("Nodes after Remove: %d, want 2", len(p.Nodes()))
	}
}

// A placement's reservation is visible to the next placement before any
// report, survives the first report after it (which may predate the
// create), and is retired by the second; Release gives it back at once.
func TestReservationsVisibleBeforeReport(t *testing.T) {
	p := New(Options{Seed: 1})
	empty := NodeState{Name: "a", CPUMillis: 1000, MemoryBytes: gib}
	p.Update(empty)
	r := Request{CPUMillis: 600}
	mustPlace(t, p, r)
	if _, err := p.Place(r); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("second 600m on a 1000m node before any report: err %v", err)
	}
	p.Update(empty) // written before the create landed: still reserved
	if _, err := p.Place(r); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("reservation lost at the first report: err %v", err)
	}
	p.Update(empty) // the second report retires it
	mustPlace(t, p, r)
	p.Release("a", r)
	mustPlace(t, p, r)
	if got := p.Nodes()[0].AllocCPUMillis; got != 600 {
		t.Fatalf("Nodes alloc %d, want 600", got)
	}
}

// An image on three nodes mostly goes there.
func TestLocalityPrefersHolders(t *testing.T) {
	img := []string{"sha256:base", "sha256:app"}
	p := cluster(t, Options{}, 20, func(i int, s *NodeState) {
		if i%7 == 0 { // n00, n07, n14
			s.Layers = img
		}
	})
	c := map[string]int{}
	for range 300 {
		c[mustPlace(t, p, Request{CPUMillis: 100, Layers: img})]++
	}
	on := c["n00"] + c["n07"] + c["n14"]
	if on < 270 {
		t.Fatalf("only %d/300 placements on the image's 3 holders: %v", on, c)
	}
}

// An image one node has mounted (its report lists the layers) goes to that
// node, though it is on fewer than spreadTarget nodes: spreading holds back
// only layers still arriving, never layers a node reports.
func TestLocalityPrefersOneReportedHolder(t *testing.T) {
	img := []string{"sha256:base", "sha256:only-on-n05"}
	p := cluster(t, Options{}, 20, func(i int, s *NodeState) {
		if i == 5 {
			s.Layers = img
		}
	})
	for i := range 20 {
		if n := mustPlace(t, p, Request{CPUMillis: 100, Layers: img}); n != "n05" {
			t.Fatalf("placement %d of an image only n05 has went to %s", i, n)
		}
	}
}

// Holders that are full lose to a node without the image.
func TestLocalityYieldsToFullHolders(t *testing.T) {
	img := []string{"sha256:x"}
	p := cluster(t, Options{}, 10, func(i int, s *NodeState) {
		if i < 3 {
			s.Layers = img
			s.AllocCPUMillis = s.CPUMillis * 95 / 100
		}
	})
	if n := mustPlace(t, p, Request{CPUMillis: 100, Layers: img}); n < "n03" {
		t.Fatalf("placed on a 95%% full holder %s instead of an empty node", n)
	}
}

// An image no node has does not pile onto one node: its first placements
// go to several nodes, after which it sticks to them.
func TestNewImageSpreads(t *testing.T) {
	img := []string{"sha256:new-base", "sha256:new-app"}
	p := cluster(t, Options{}, 20, nil)
	names, err := p.PlaceN(Request{CPUMillis: 100, Layers: img}, 60)
	if err != nil {
		t.Fatal(err)
	}
	c := counts(names)
	if len(c) < spreadTarget || len(c) > 6 {
		t.Fatalf("new image on %d nodes, want %d..6: %v", len(c), spreadTarget, c)
	}
	for n, k := range c {
		if k > 40 {
			t.Fatalf("%d of 60 on %s: piled up", k, n)
		}
	}
}

// Sandboxes carrying an anti-affinity label spread one per node even when
// a few nodes are much emptier than the rest.
func TestAntiAffinitySpreads(t *testing.T) {
	p := cluster(t, Options{}, 40, func(i int, s *NodeState) {
		if i >= 5 {
			s.AllocCPUMillis = s.CPUMillis / 2
		}
		if i == 0 {
			s.LabelCounts = map[string]int{"job=a": 1}
		}
	})
	names, err := p.PlaceN(Request{CPUMillis: 100, AntiAffinity: []string{"job=a"}}, 30)
	if err != nil {
		t.Fatal(err)
	}
	for n, k := range counts(names) {
		if k > 1 || n == "n00" {
			t.Fatalf("%s got %d sandboxes of job=a: %v", n, k, counts(names))
		}
	}
	if got := p.Nodes()[3].LabelCounts["job=a"]; got > 1 {
		t.Fatalf("Nodes label count %d", got)
	}
}

// Latency-sensitive sandboxes avoid a node busy with best-effort work;
// best-effort ones go with best-effort.
func TestQoSSeparatesClasses(t *testing.T) {
	p := New(Options{Seed: 1})
	be, ls := big("be-node"), big("ls-node")
	be.QoS, be.Load = map[string]int{"be": 50}, 1.5
	ls.QoS, ls.Load = map[string]int{"ls": 50}, 1.5
	p.Update(be)
	p.Update(ls)
	for _, tc := range []struct{ class, want string }{{"ls", "ls-node"}, {"be", "be-node"}} {
		for range 20 {
			r := Request{CPUMillis: 10, QoS: tc.class}
			if n := mustPlace(t, p, r); n != tc.want {
				t.Fatalf("%s sandbox placed on %s", tc.class, n)
			}
			p.Release(tc.want, r)
		}
	}
}

// Load counts: of two equally allocated nodes the one with the shorter run
// queue wins.
func TestLoadPrefersIdleNode(t *testing.T) {
	p := New(Options{Seed: 1})
	a, b := big("a"), big("b")
	a.Load = 1.8
	p.Update(a)
	p.Update(b)
	if n := mustPlace(t, p, Request{CPUMillis: 10}); n != "b" {
		t.Fatalf("placed on the loaded node %s", n)
	}
}

// A batch spreads over equal nodes, and a batch that cannot all fit
// reserves nothing.
func TestPlaceNSpreadsAndIsAllOrNothing(t *testing.T) {
	p := cluster(t, Options{}, 10, func(i int, s *NodeState) { s.MaxSandboxes = 20 })
	names, err := p.PlaceN(Request{CPUMillis: 10}, 100)
	if err != nil {
		t.Fatal(err)
	}
	c := counts(names)
	for n, k := range c {
		if k > 13 {
			t.Fatalf("%s got %d of 100 over 10 equal nodes: %v", n, k, c)
		}
	}
	if _, err := p.PlaceN(Request{CPUMillis: 10}, 101); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("batch of 101 into 100 free slots: %v", err)
	}
	total := 0
	for _, s := range p.Nodes() {
		total += s.Sandboxes
	}
	if total != 100 {
		t.Fatalf("a failed batch left reservations: %d sandboxes, want 100", total)
	}
}

func TestInvalidRequests(t *testing.T) {
	p := cluster(t, Options{}, 2, nil)
	if _, err := p.Place(Request{CPUMillis: -1}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("negative cpu: %v", err)
	}
	if _, err := p.PlaceN(Request{}, -1); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("negative count: %v", err)
	}
	if _, err := New(Options{}).Place(Request{}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("empty cluster: %v", err)
	}
}

// ScanAll, the baseline, obeys the same rules.
func TestScanAllChoosesTheBest(t *testing.T) {
	p := cluster(t, Options{ScanAll: true}, 50, func(i int, s *NodeState) {
		if i != 33 {
			s.AllocCPUMillis = s.CPUMillis / 2
		}
	})
	if n := mustPlace(t, p, Request{CPUMillis: 10}); n != "n33" {
		t.Fatalf("scan-all chose %s, not the one empty node", n)
	}
}

// Concurrent placements never over-fill a node, and reports, Down and
// Release racing them are safe (run with -race).
func TestConcurrentPlacementsRespectCapacity(t *testing.T) {
	p := New(Options{Seed: 3})
	for i := range 10 {
		s := big(fmt.Sprintf("n%d", i))
		s.MaxSandboxes = 100
		p.Update(s)
	}
	var ok, exhausted atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				_, err := p.Place(Request{CPUMillis: 1, Layers: []string{"l1", "l2"}, QoS: "ls", AntiAffinity: []string{"a=b"}})
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, errdefs.ErrExhausted):
					exhausted.Add(1)
				default:
					t.Error(err)
				}
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			_ = p.Nodes()
		}
	})
	wg.Wait()
	if ok.Load() != 1000 || exhausted.Load() != 600 {
		t.Fatalf("%d placed, %d exhausted; want 1000 and 600", ok.Load(), exhausted.Load())
	}
	for _, s := range p.Nodes() {
		if s.Sandboxes != 100 {
			t.Fatalf("%s has %d sandboxes, want 100", s.Name, s.Sandboxes)
		}
	}

	// Now with reports, Down/Update and Release racing placements.
	stop := make(chan struct{})
	var rep sync.WaitGroup
	rep.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s := big(fmt.Sprintf("n%d", i%10))
			s.Layers = []string{"l1", fmt.Sprintf("x%d", i%7)}
			if i%13 == 0 {
				p.Down(s.Name)
			}
			p.Update(s)
			if i%50 == 0 {
				p.Remove("gone")
				p.Update(big("gone"))
			}
		}
	})
	for range 8 {
		wg.Go(func() {
			for range 500 {
				r := Request{CPUMillis: 1, Layers: []string{"l1", "l3"}}
				if n, err := p.Place(r); err == nil {
					p.Release(n, r)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	rep.Wait()
}

package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/placement"
	"github.com/warrenrl/warren/internal/simnode"
)

// SchedConfig configures `warren bench sched`.
type SchedConfig struct {
	Nodes          int           // simulated nodes
	Live           int           // live sandboxes spread over them before the run
	Images         int           // distinct images, Zipf-popular
	Duration       time.Duration // measured run per placer
	Concurrency    int           // placing goroutines
	K              int           // best-of-K (0: placement.DefaultK)
	Overcommit     float64
	ReportInterval time.Duration // each node reports once per interval
	Peers          bool          // also run the scan-all placer
	Seed           int64
}

// SchedReport is the result of `warren bench sched`.
type SchedReport struct {
	Benchmark        string     `json:"benchmark"`
	Nodes            int        `json:"nodes"`
	Live             int        `json:"live_sandboxes"`
	Images           int        `json:"images"`
	MedianImageNodes float64    `json:"median_image_nodes"`
	Concurrency      int        `json:"concurrency"`
	K                int        `json:"k"`
	Overcommit       float64    `json:"overcommit"`
	ReportIntervalMs float64    `json:"report_interval_ms"`
	GOMAXPROCS       int        `json:"gomaxprocs"`
	Results          []SchedRow `json:"results"`
	// ThroughputRatio is best-of-K placements/s over scan-all's.
	ThroughputRatio *float64 `json:"throughput_ratio,omitempty"`
	Notes           []string `json:"notes,omitempty"`
}

// SchedRow is one placer's run.
type SchedRow struct {
	System     string  `json:"system"`
	Placements int     `json:"placements"`
	PerSec     float64 `json:"placements_per_s"`
	Summary            // Place latency
	// LocalityHitRate: the share of creates whose image was already whole
	// on the chosen node.
	LocalityHitRate float64 `json:"locality_hit_rate"`
	// LoadSpread: max/mean live sandboxes per node at the end;
	// PlacementSpread: max/mean placements per node during the run.
	LoadSpread      float64 `json:"load_spread"`
	PlacementSpread float64 `json:"placement_spread"`
	// Refused: placements a node turned down (a stale view); Exhausted:
	// placements the placer found no room for.
	Refused      int     `json:"refused"`
	Exhausted    int     `json:"exhausted"`
	Reports      int     `json:"reports"`
	TargetPerSec float64 `json:"target_per_s,omitempty"`
	TargetP99Ms  float64 `json:"target_p99_ms,omitempty"`
}

// schedWorld is the simulated cluster: nodes, images and their popularity.
type schedWorld struct {
	nodes  []*simnode.Node
	byName map[string]*simnode.Node
	images [][]string
	sizes  [][]int64
	cdf    []float64 // cumulative popularity
	median float64
}

const (
	schedNodeCPU    = 96000
	schedNodeMemory = 384 << 30
	schedNodeMax    = 4000
	schedZipfS      = 1.1
	schedBases      = 8 // base layers shared by many images
)

// newSchedWorld builds the cluster of cfg, the same for the same seed: each
// image cached on enough random nodes to hold its share of the live
// sandboxes at half the sandbox cap, and at least three (a median of three),
// the live sandboxes spread over their images' nodes.
func newSchedWorld(cfg SchedConfig) (*schedWorld, error) {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 14))
	w := &schedWorld{byName: map[string]*simnode.Node{}}
	for i := range cfg.Nodes {
		n := simnode.New(simnode.Config{Name: fmt.Sprintf("node-%03d", i), CPUMillis: schedNodeCPU, MemoryBytes: schedNodeMemory,
			MaxSandboxes: schedNodeMax, Overcommit: cfg.Overcommit})
		w.nodes = append(w.nodes, n)
		w.byName[n.Name()] = n
	}
	total := 0.0
	for i := range cfg.Images {
		layers := []string{fmt.Sprintf("sha256:base-%d", i%schedBases)}
		sizes := []int64{200 << 20}
		for j := range 2 + i%3 {
			layers = append(layers, fmt.Sprintf("sha256:img-%d-%d", i, j))
			sizes = append(sizes, int64(10+rng.IntN(200))<<20)
		}
		w.images = append(w.images, layers)
		w.sizes = append(w.sizes, sizes)
		total += zipfWeight(i)
		w.cdf = append(w.cdf, total)
	}
	for i := range w.cdf {
		w.cdf[i] /= total
	}
	holders := make([][]*simnode.Node, cfg.Images)
	counts := make([]float64, cfg.Images)
	for i := range cfg.Images {
		share := zipfWeight(i) / total
		// Enough nodes that the image's sandboxes fill them to half the
		// sandbox cap, and never fewer than three.
		h := max(3, min(cfg.Nodes, int(share*float64(cfg.Live)/(schedNodeMax/2)+0.999)))
		for _, j := range rng.Perm(cfg.Nodes)[:min(h, cfg.Nodes)] {
			holders[i] = append(holders[i], w.nodes[j])
			w.nodes[j].Cache(w.images[i]...)
		}
		counts[i] = float64(len(holders[i]))
	}
	slices.Sort(counts)
	w.median = counts[len(counts)/2]
	for id := range cfg.Live {
		img := w.pick(rng)
		sb := w.sandbox(rng, uint64(id)+1, img)
		hs := holders[img]
		placed := false
		for try := 0; try < 4 && !placed; try++ {
			_, err := hs[rng.IntN(len(hs))].Create(sb)
			placed = err == nil
		}
		for i, off := 0, rng.IntN(len(w.nodes)); i < len(w.nodes) && !placed; i++ { // its holders are full: anywhere
			_, err := w.nodes[(off+i)%len(w.nodes)].Create(sb)
			placed = err == nil
		}
		if !placed {
			return nil, errdefs.Exhaustedf("the simulated cluster has no room for %d live sandboxes", cfg.Live)
		}
	}
	for _, n := range w.nodes {
		n.ResetStats()
	}
	return w, nil
}

func zipfWeight(rank int) float64 {
	return 1 / math.Pow(float64(rank+1), schedZipfS)
}

// pick draws an image by popularity.
func (w *schedWorld) pick(rng *rand.Rand) int {
	i, _ := slices.BinarySearch(w.cdf, rng.Float64())
	return min(i, len(w.cdf)-1)
}

// sandbox makes a sandbox of image img: mostly small requests, 30%
// best-effort, one in ten part of a rollout group spread by anti-affinity.
func (w *schedWorld) sandbox(rng *rand.Rand, id uint64, img int) simnode.Sandbox {
	sb := simnode.Sandbox{ID: id, CPUMillis: []int64{50, 100, 100, 200}[rng.IntN(4)],
		MemoryBytes: []int64{128 << 20, 256 << 20, 256 << 20, 512 << 20}[rng.IntN(4)], QoS: "ls", Layers: w.images[img]}
	if rng.IntN(10) < 3 {
		sb.QoS = "be"
	}
	if rng.IntN(10) == 0 {
		sb.Labels = []string{fmt.Sprintf("rollout=%d", rng.IntN(500))}
	}
	return sb
}

func request(sb simnode.Sandbox, sizes []int64) placement.Request {
	return placement.Request{CPUMillis: sb.CPUMillis, MemoryBytes: sb.MemoryBytes, QoS: sb.QoS, Layers: sb.Layers,
		LayerSizes: sizes, AntiAffinity: sb.Labels}
}

// RunSched measures placement on a simulated cluster: cfg.Nodes in-process
// nodes holding cfg.Live sandboxes report on cfg.ReportInterval while
// cfg.Concurrency goroutines place, create on the chosen node and delete a
// random sandbox (the live count stays level). The peer is a placer that
// scores every node, run on an identical cluster.
func RunSched(cfg SchedConfig, progress io.Writer) (*SchedReport, error) {
	if cfg.Nodes <= 0 || cfg.Live < 0 || cfg.Images <= 0 || cfg.Concurrency <= 0 || cfg.Duration <= 0 || cfg.ReportInterval <= 0 {
		return nil, errdefs.Invalidf("bench sched: nodes, images, concurrency, duration and report interval must be positive")
	}
	if cfg.K <= 0 {
		cfg.K = placement.DefaultK
	}
	rep := &SchedReport{Benchmark: "sched", Nodes: cfg.Nodes, Live: cfg.Live, Images: cfg.Images, Concurrency: cfg.Concurrency,
		K: cfg.K, Overcommit: cfg.Overcommit, ReportIntervalMs: float64(cfg.ReportInterval) / float64(time.Millisecond),
		GOMAXPROCS: runtime.GOMAXPROCS(0)}
	systems := []struct {
		name string
		opt  placement.Options
	}{{fmt.Sprintf("best-of-%d", cfg.K), placement.Options{Overcommit: cfg.Overcommit, K: cfg.K}}}
	if cfg.Peers {
		systems = append(systems, struct {
			name string
			opt  placement.Options
		}{"scan-all", placement.Options{Overcommit: cfg.Overcommit, ScanAll: true}})
	}
	for _, sys := range systems {
		if progress != nil {
			fmt.Fprintf(progress, "sched: %s: building %d nodes with %d live sandboxes\n", sys.name, cfg.Nodes, cfg.Live)
		}
		w, err := newSchedWorld(cfg)
		if err != nil {
			return nil, err
		}
		rep.MedianImageNodes = w.median
		row, err := runSchedOne(cfg, w, placement.New(sys.opt))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sys.name, err)
		}
		row.System = sys.name
		if progress != nil {
			fmt.Fprintf(progress, "sched: %s: %.0f placements/s, p99 %.3f ms\n", sys.name, row.PerSec, row.P99)
		}
		rep.Results = append(rep.Results, row)
	}
	rep.Results[0].TargetPerSec, rep.Results[0].TargetP99Ms = 20000, 5
	if len(rep.Results) == 2 {
		rep.ThroughputRatio = ratio(rep.Results[0].PerSec, rep.Results[1].PerSec)
	}
	rep.Notes = append(rep.Notes,
		"placements/s is the closed loop of Place, the simulated node's create and one random delete (with Release), per goroutine; latency is Place alone",
		"both placers start from identical clusters (same seed); nodes report round-robin, each once per report interval")
	return rep, nil
}

func runSchedOne(cfg SchedConfig, w *schedWorld, p *placement.Placer) (SchedRow, error) {
	for _, n := range w.nodes {
		p.Update(n.Report())
	}
	var stop atomic.Bool
	var reports atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { // reporter: one node per interval/nodes
		tick := time.NewTicker(cfg.ReportInterval / time.Duration(len(w.nodes)))
		defer tick.Stop()
		for i := 0; !stop.Load(); i++ {
			<-tick.C
			p.Update(w.nodes[i%len(w.nodes)].Report())
			reports.Add(1)
		}
	})
	type result struct {
		lat                     []time.Duration
		placed, exhausted, hits int
		refused                 int
		perNode                 map[string]int
		err                     error
	}
	results := make([]result, cfg.Concurrency)
	var nextID atomic.Uint64
	nextID.Store(uint64(cfg.Live) + 1)
	start := time.Now()
	for g := range cfg.Concurrency {
		wg.Go(func() {
			res := &results[g]
			res.perNode = map[string]int{}
			res.lat = make([]time.Duration, 0, 1<<16)
			rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(g)+100))
			for !stop.Load() {
				img := w.pick(rng)
				sb := w.sandbox(rng, nextID.Add(1), img)
				r := request(sb, w.sizes[img])
				t0 := time.Now()
				name, err := p.Place(r)
				res.lat = append(res.lat, time.Since(t0))
				if err != nil {
					if !errors.Is(err, errdefs.ErrExhausted) {
						res.err = err
						return
					}
					res.exhausted++
					continue
				}
				res.placed++
				res.perNode[name]++
				local, err := w.byName[name].Create(sb)
				if err != nil {
					res.refused++
					p.Release(name, r)
					continue
				}
				if local {
					res.hits++
				}
				// Churn: a random sandbox ends, through the gateway.
				victim := w.nodes[rng.IntN(len(w.nodes))]
				if gone, ok := victim.DeleteAt(rng.IntN(1 << 30)); ok {
					p.Release(victim.Name(), request(gone, nil))
				}
			}
		})
	}
	time.Sleep(cfg.Duration)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)

	row := SchedRow{Reports: int(reports.Load())}
	var lat []time.Duration
	perNode := map[string]int{}
	creates := 0
	for _, r := range results {
		if r.err != nil {
			return row, r.err
		}
		lat = append(lat, r.lat...)
		row.Placements += r.placed
		row.Exhausted += r.exhausted
		row.Refused += r.refused
		row.LocalityHitRate += float64(r.hits)
		creates += r.placed - r.refused
		for k, v := range r.perNode {
			perNode[k] += v
		}
	}
	row.Summary = Summarize(lat)
	row.PerSec = round(float64(row.Placements)/elapsed.Seconds(), 0)
	if creates > 0 {
		row.LocalityHitRate = round(row.LocalityHitRate/float64(creates), 3)
	}
	var live []float64
	for _, n := range w.nodes {
		live = append(live, float64(n.Len()))
	}
	row.LoadSpread = round(maxOverMean(live), 3)
	var placed []float64
	for _, n := range w.nodes {
		placed = append(placed, float64(perNode[n.Name()]))
	}
	row.PlacementSpread = round(maxOverMean(placed), 3)
	return row, nil
}

func maxOverMean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sum, mx := 0.0, 0.0
	for _, x := range v {
		sum += x
		mx = max(mx, x)
	}
	if sum == 0 {
		return 0
	}
	return mx / (sum / float64(len(v)))
}

// Table prints the report.
func (r *SchedReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "placement: %d simulated nodes, %d live sandboxes, %d images (median on %.0f nodes), %d goroutines, GOMAXPROCS %d, over-commit %.0f, reports every %.0f ms per node\n",
		r.Nodes, r.Live, r.Images, r.MedianImageNodes, r.Concurrency, r.GOMAXPROCS, r.Overcommit, r.ReportIntervalMs)
	t := newTable("system", "placements", "per s", "p50 ms", "p99 ms", "max ms", "locality hits", "load max/mean", "placed max/mean", "refused", "exhausted")
	for _, row := range r.Results {
		t.add(row.System, fmt.Sprint(row.Placements), num(row.PerSec), fmt.Sprintf("%.4f", row.P50), fmt.Sprintf("%.4f", row.P99),
			ms(row.Max), fmt.Sprintf("%.1f%%", 100*row.LocalityHitRate), fmt.Sprintf("%.3f", row.LoadSpread),
			fmt.Sprintf("%.3f", row.PlacementSpread), fmt.Sprint(row.Refused), fmt.Sprint(row.Exhausted))
	}
	if err := t.write(w); err != nil {
		return err
	}
	if r.ThroughputRatio != nil {
		fmt.Fprintf(w, "best-of-%d / scan-all throughput: %.1fx (target: >= 20000/s, p99 <= 5 ms)\n", r.K, *r.ThroughputRatio)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

// Command gobench is the Go side of the Python SDK's benchmark
// (python -m warren.bench): it fires -calls concurrent execs of `true`
// spread over -sandboxes sandboxes from one process with the Go SDK, for
// -rounds rounds, and prints calls/s and latency percentiles as JSON.
//
//	go run ./sdk/python/bench/gobench -addr unix:///run/warren/warren.sock -image busybox
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

type round struct {
	WallS     float64 `json:"wall_s"`
	CallsPerS float64 `json:"calls_per_s"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	Errors    int     `json:"errors"`
}

type report struct {
	Impl      string  `json:"impl"`
	Transport string  `json:"transport"`
	Calls     int     `json:"calls"`
	Sandboxes int     `json:"sandboxes"`
	Rounds    []round `json:"rounds"`
	CallsPerS float64 `json:"calls_per_s"` // median round
	P50Ms     float64 `json:"p50_ms"`      // over all rounds' calls
	P99Ms     float64 `json:"p99_ms"`
	Errors    int     `json:"errors"`
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return float64(sorted[i]) / float64(time.Millisecond)
}

func main() {
	addr := flag.String("addr", "", "daemon address (default $WARREN_ADDR or the default socket)")
	image := flag.String("image", "busybox", "image of the sandboxes")
	nSandboxes := flag.Int("sandboxes", 100, "sandboxes to spread the calls over")
	calls := flag.Int("calls", 1000, "concurrent execs per round")
	rounds := flag.Int("rounds", 3, "measured rounds (after one warm-up round)")
	http1 := flag.Bool("http1", false, "use the Connect protocol over HTTP/1.1 instead of gRPC over h2c")
	flag.Parse()

	if err := run(*addr, *image, *nSandboxes, *calls, *rounds, *http1); err != nil {
		fmt.Fprintln(os.Stderr, "gobench:", err)
		os.Exit(1)
	}
}

func run(addr, image string, nSandboxes, calls, rounds int, http1 bool) error {
	var opts []client.Option
	transport := "grpc-h2c"
	if http1 {
		opts = append(opts, client.WithHTTP1())
		transport = "connect-http1"
	}
	c, err := client.New(addr, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()

	label := fmt.Sprintf("gobench-%d", os.Getpid())
	ids := make([]string, nSandboxes)
	errs := make([]error, nSandboxes)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := c.Create(ctx, &warrenv1.CreateRequest{Image: image, Labels: map[string]string{"warren-bench": label}})
			if err != nil {
				errs[i] = err
				return
			}
			ids[i] = sb.GetId()
		}()
	}
	wg.Wait()
	defer func() {
		var dwg sync.WaitGroup
		for _, id := range ids {
			if id == "" {
				continue
			}
			dwg.Add(1)
			go func() {
				defer dwg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				_ = c.Delete(context.Background(), id)
			}()
		}
		dwg.Wait()
	}()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
	}

	one := func() ([]time.Duration, time.Duration, int) {
		lat := make([]time.Duration, calls)
		fails := make([]bool, calls)
		var wg sync.WaitGroup
		start := time.Now()
		for i := 0; i < calls; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: ids[i%len(ids)], Argv: []string{"true"}, TimeoutMs: 60000})
				lat[i] = time.Since(t0)
				fails[i] = err != nil || res.GetExitCode() != 0
			}()
		}
		wg.Wait()
		wall := time.Since(start)
		n := 0
		for _, f := range fails {
			if f {
				n++
			}
		}
		return lat, wall, n
	}

	one() // warm-up: connections, page cache
	rep := report{Impl: "go", Transport: transport, Calls: calls, Sandboxes: nSandboxes}
	var all []time.Duration
	for r := 0; r < rounds; r++ {
		lat, wall, nerr := one()
		sorted := append([]time.Duration(nil), lat...)
		sort.Slice(sorted, func(a, b int) bool { return sorted[a] < sorted[b] })
		rep.Rounds = append(rep.Rounds, round{
			WallS:     wall.Seconds(),
			CallsPerS: float64(calls) / wall.Seconds(),
			P50Ms:     percentile(sorted, 0.50),
			P99Ms:     percentile(sorted, 0.99),
			Errors:    nerr,
		})
		rep.Errors += nerr
		all = append(all, lat...)
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	rep.P50Ms = percentile(all, 0.50)
	rep.P99Ms = percentile(all, 0.99)
	rates := make([]float64, 0, len(rep.Rounds))
	for _, r := range rep.Rounds {
		rates = append(rates, r.CallsPerS)
	}
	sort.Float64s(rates)
	if len(rates) > 0 {
		rep.CallsPerS = rates[len(rates)/2]
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

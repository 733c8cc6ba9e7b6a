package ui

import (
	"bufio"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The counters the overview turns into rates. A gateway exports none of
// them (its metrics are the cluster's capacity): its overview says so.
const (
	metricCreates  = "warren_sandbox_create_seconds_count"
	metricExecSum  = "warren_exec_seconds_sum"
	metricExecN    = "warren_exec_seconds_count"
	metricDeleted  = "warren_sandbox_deleted_total"
	metricSecurity = "warren_security_events_total"
)

// point is one interval of the history: rates between two samples.
type point struct {
	at         time.Time
	createsPS  float64 // sandboxes created per second
	execMeanMS float64 // mean exec latency (NaN: no exec in the interval)
}

// history keeps the last hour of the overview's rates, sampled from the
// process's own /metrics: the dashboard has no Prometheus to ask.
type history struct {
	source http.Handler

	mu     sync.Mutex
	points []point // oldest first, at most max
	max    int
	last   map[string]float64
	lastAt time.Time
	has    bool // the metrics carry the counters above
}

func newHistory(max int) *history { return &history{max: max} }

func (h *history) run(every time.Duration, stop <-chan struct{}) {
	h.sample(time.Now())
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			h.sample(now)
		}
	}
}

func (h *history) sample(now time.Time) {
	cur := scrape(h.source)
	h.mu.Lock()
	defer h.mu.Unlock()
	_, h.has = cur[metricCreates]
	if h.last != nil {
		dt := now.Sub(h.lastAt).Seconds()
		p := point{at: now, execMeanMS: math.NaN()}
		if dt > 0 {
			p.createsPS = max(cur[metricCreates]-h.last[metricCreates], 0) / dt
		}
		if n := cur[metricExecN] - h.last[metricExecN]; n > 0 {
			p.execMeanMS = (cur[metricExecSum] - h.last[metricExecSum]) / n * 1000
		}
		h.points = append(h.points, p)
		if len(h.points) > h.max {
			h.points = h.points[len(h.points)-h.max:]
		}
	}
	h.last, h.lastAt = cur, now
}

// snapshot returns a copy of the points, the latest totals, and whether
// the source exports the counters at all.
func (h *history) snapshot() ([]point, map[string]float64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]point(nil), h.points...), h.last, h.has
}

// scrape reads the Prometheus text exposition of src, summing each
// metric's series over their labels. Only the few counters the overview
// needs are kept.
func scrape(src http.Handler) map[string]float64 {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	rec := httptest.NewRecorder()
	src.ServeHTTP(rec, req)
	return parseText(rec.Body)
}

func parseText(r io.Reader) map[string]float64 {
	want := map[string]bool{metricCreates: true, metricExecSum: true, metricExecN: true, metricDeleted: true, metricSecurity: true}
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if !want[name] {
			continue
		}
		// The value follows the labels; a timestamp may follow it.
		rest := line[len(name):]
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			out[name] += v
		}
	}
	return out
}

package e2b

import (
	"net/http"
	"strconv"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// metric is one point of E2B's sandbox metrics.
type metric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      uint32  `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       uint64  `json:"memUsed"`
	MemTotal      uint64  `json:"memTotal"`
	MemCache      uint64  `json:"memCache"`
	DiskUsed      uint64  `json:"diskUsed"`
	DiskTotal     uint64  `json:"diskTotal"`
}

// cpuWindow is how long GET /metrics measures CPU use over: Warren keeps
// no history of a sandbox's use, so the one point it answers with is
// sampled now, from two reads of the sandbox's CPU time.
const cpuWindow = 250 * time.Millisecond

// metricsSlack: a start or end this close to now still covers "now".
const metricsSlack = 10 * time.Second

// metrics serves GET /sandboxes/{id}/metrics: one point, now, from the
// daemon's SandboxStats (E2B keeps a series sampled every few seconds;
// Warren keeps none). A paused sandbox, or a range that ends before now
// or starts after it, has no point: [].
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb, err := s.visible(r, r.PathValue("id"))
	if err != nil {
		s.fail(w, err)
		return
	}
	now := time.Now()
	for _, q := range []string{"start", "end"} {
		v := r.URL.Query().Get(q)
		if v == "" {
			continue
		}
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			s.fail(w, errdefs.Invalidf("%s %q: want Unix seconds", q, v))
			return
		}
		t := time.Unix(sec, 0)
		if (q == "start" && t.After(now.Add(metricsSlack))) || (q == "end" && t.Before(now.Add(-metricsSlack))) {
			writeJSON(w, http.StatusOK, []metric{})
			return
		}
	}
	if sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
		writeJSON(w, http.StatusOK, []metric{})
		return
	}
	ctx, id := r.Context(), sb.GetId()
	a, err := s.m.SandboxStats(ctx, &warrenv1.SandboxStatsRequest{SandboxId: id})
	if err != nil {
		s.fail(w, err)
		return
	}
	select {
	case <-time.After(cpuWindow):
	case <-ctx.Done():
		return
	}
	b, err := s.m.SandboxStats(ctx, &warrenv1.SandboxStatsRequest{SandboxId: id})
	if err != nil {
		s.fail(w, err)
		return
	}
	pct := 0.0
	if wall := time.Duration(b.GetSampledAtUnixMs()-a.GetSampledAtUnixMs()) * time.Millisecond; wall > 0 && b.GetCpuCount() > 0 && b.GetCpuUsageNs() >= a.GetCpuUsageNs() {
		pct = 100 * float64(b.GetCpuUsageNs()-a.GetCpuUsageNs()) / float64(wall.Nanoseconds()) / float64(b.GetCpuCount())
		pct = min(pct, 100)
	}
	at := time.UnixMilli(b.GetSampledAtUnixMs()).UTC()
	used := b.GetMemoryBytes() - min(b.GetMemoryCacheBytes(), b.GetMemoryBytes())
	writeJSON(w, http.StatusOK, []metric{{
		Timestamp:     at.Format(time.RFC3339Nano),
		TimestampUnix: at.Unix(),
		CPUCount:      b.GetCpuCount(),
		CPUUsedPct:    pct,
		MemUsed:       used,
		MemTotal:      b.GetMemoryLimitBytes(),
		MemCache:      b.GetMemoryCacheBytes(),
		DiskUsed:      b.GetDiskUsedBytes(),
		DiskTotal:     b.GetDiskBytes(),
	}})
}

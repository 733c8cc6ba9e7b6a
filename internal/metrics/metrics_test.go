package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/warrenrl/warren/internal/errdefs"
)

func TestPreinitialised(t *testing.T) {
	m := New("Create", "Exec")
	for _, op := range []string{"Create", "Exec"} {
		for _, c := range errdefs.Categories() {
			if v := value(t, m.Errors.WithLabelValues(c.String(), op)); v != 0 {
				t.Fatalf("%s/%s = %v", c, op, v)
			}
		}
	}
	// 9 categories x 2 ops.
	if n := count(m.Errors); n != 2*len(errdefs.Categories()) {
		t.Fatalf("%d error series", n)
	}
	if n := count(m.Sandboxes); n != len(States) {
		t.Fatalf("%d state series", n)
	}
	if n := count(m.Deleted); n != 4 { // user, timeout, dead, moved
		t.Fatalf("%d reason series", n)
	}
}

func TestRecording(t *testing.T) {
	m := New("Create")
	m.Error("Create", errdefs.NotFoundf("image x not found"))
	m.Error("Create", errors.New("no category"))
	m.Error("Create", nil)
	if v := value(t, m.Errors.WithLabelValues("not_found", "Create")); v != 1 {
		t.Fatalf("not_found = %v", v)
	}
	if v := value(t, m.Errors.WithLabelValues("unknown", "Create")); v != 1 {
		t.Fatalf("unknown = %v", v)
	}
	m.SandboxState("", StateCreating)
	m.SandboxState(StateCreating, StateRunning)
	m.SandboxState("", StateCreating)
	m.SandboxState(StateCreating, "")
	if v := value(t, m.Sandboxes.WithLabelValues(StateRunning)); v != 1 {
		t.Fatalf("running = %v", v)
	}
	if v := value(t, m.Sandboxes.WithLabelValues(StateCreating)); v != 0 {
		t.Fatalf("creating = %v", v)
	}
	m.SandboxEnded(ReasonTimeout)
	if v := value(t, m.Deleted.WithLabelValues(ReasonTimeout)); v != 1 {
		t.Fatalf("timeout = %v", v)
	}
	m.ObserveCreate(0.05)
	m.ObserveExec(0.0002)

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`warren_sandboxes{state="running"} 1`,
		`warren_errors_total{category="not_found",op="Create"} 1`,
		`warren_sandbox_deleted_total{reason="timeout"} 1`,
		`warren_sandbox_create_seconds_bucket{le="0.001"} 0`,
		`warren_sandbox_create_seconds_count 1`,
		`warren_exec_seconds_bucket{le="0.0001"} 0`,
		`warren_exec_seconds_count 1`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
}

func TestBuckets(t *testing.T) {
	cb := CreateBuckets()
	if cb[0] != 0.001 || cb[len(cb)-1] < 9.99 || len(cb) < 30 {
		t.Fatalf("create buckets %v", cb)
	}
	eb := ExecBuckets()
	if eb[0] != 0.0001 || len(eb) < 30 {
		t.Fatalf("exec buckets %v", eb)
	}
	for i := 1; i < len(eb); i++ {
		if eb[i]/eb[i-1] > 1.5 {
			t.Fatalf("exec buckets too coarse at %v", eb[i])
		}
	}
}

func TestNilSafe(t *testing.T) {
	var m *Metrics
	m.InitOps("x")
	m.Error("x", errors.New("e"))
	m.SandboxState("", StateRunning)
	m.ObserveCreate(1)
	m.ObserveExec(1)
	m.SandboxEnded(ReasonUser)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 404 {
		t.Fatalf("code %d", rec.Code)
	}
}

func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	t.Fatalf("not a counter or gauge: %v", &d)
	return 0
}

func count(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	n := 0
	for range ch {
		n++
	}
	return n
}

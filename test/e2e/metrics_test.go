package e2e

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// metrics is one scrape: series (name plus sorted labels, as exposed) to
// value.
type metrics map[string]float64

// scrape fetches /metrics over the unix socket.
func (e *env) scrape(t *testing.T) (metrics, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxFor(t, 30*time.Second), http.MethodGet, "http://warren/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Each scrape has its own transport: its idle connection would stay
	// open in the daemon, one fd and two goroutines per scrape, and the
	// leak checks that poll goroutines would count them.
	hc := e.rawHTTP()
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: HTTP %d %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics: content type %q", ct)
	}
	m := metrics{}
	for line := range strings.SplitSeq(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("bad metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad metrics line %q: %v", line, err)
		}
		m[line[:i]] = v
	}
	return m, string(body)
}

// get returns a series' value and whether it is present.
func (m metrics) get(series string) (float64, bool) {
	v, ok := m[series]
	return v, ok
}

// TestMetrics checks /metrics over the unix socket and that the counters
// follow what the daemon does.
func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)

	m0, body := e.scrape(t)
	for _, want := range []string{
		"# TYPE warren_sandboxes gauge",
		"# TYPE warren_sandbox_create_seconds histogram",
		"# TYPE warren_exec_seconds histogram",
		"# TYPE warren_errors_total counter",
		"# TYPE warren_delete_backlog gauge",
		`warren_delete_backlog{backend="container"} 0`,
		"# TYPE warren_delete_failures_total counter",
		`warren_delete_failures_total{backend="container"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Security events are counted by kind only, from zero: no series per
	// sandbox.
	for _, k := range []string{"oom_kill", "pids_limit", "output_cap", "disk_full", "inodes_full", "timeout", "disk_reserve", "seccomp", "policy_drop"} {
		if v, ok := m0.get(`warren_security_events_total{kind="` + k + `"}`); !ok || v != 0 {
			t.Errorf("warren_security_events_total{kind=%q} = %v (present %v), want 0", k, v, ok)
		}
	}
	for _, s := range []string{"creating", "running", "stopped", "deleting", "paused", "hibernated", "lost", "unknown"} {
		series := `warren_sandboxes{state="` + s + `"}`
		if v, ok := m0.get(series); !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0", series, v, ok)
		}
	}
	for _, cat := range []string{"not_found", "invalid", "exhausted", "conflict", "unavailable", "deadline_exceeded", "unauthenticated", "internal"} {
		for _, op := range []string{"Create", "Get", "Exec"} {
			series := `warren_errors_total{category="` + cat + `",op="` + op + `"}`
			if _, ok := m0.get(series); !ok {
				t.Errorf("%s is not pre-initialised", series)
			}
		}
	}

	e.create(&warrenv1.CreateRequest{Id: "m1"})
	e.create(&warrenv1.CreateRequest{Id: "m2"})
	for range 3 {
		e.shOK("m1", "true")
	}
	if _, err := e.c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "m2", Shell: "echo x"}, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := e.c.Get(ctx, "nosuch"); err == nil {
			t.Fatal("get of an unknown sandbox succeeded")
		}
	}
	if _, err := e.c.Create(ctx, &warrenv1.CreateRequest{Id: "../x", Image: imageName}); err == nil {
		t.Fatal("create with a bad id succeeded")
	}
	if _, err := e.c.Create(ctx, &warrenv1.CreateRequest{Id: "m1", Image: imageName}); err == nil {
		t.Fatal("create with a duplicate id succeeded")
	}
	if _, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "m1", Argv: []string{"no-such-binary"}}); err == nil {
		t.Fatal("exec of a missing binary succeeded")
	}

	m1, _ := e.scrape(t)
	delta := func(series string) float64 {
		t.Helper()
		v1, ok := m1.get(series)
		if !ok {
			t.Errorf("series %s missing", series)
		}
		v0, _ := m0.get(series)
		return v1 - v0
	}
	checks := []struct {
		series string
		want   float64
	}{
		{`warren_sandboxes{state="running"}`, 2},
		{`warren_sandboxes{state="creating"}`, 0},
		{`warren_sandbox_create_seconds_count`, 2},
		{`warren_exec_seconds_count`, 4},
		{`warren_errors_total{category="not_found",op="Get"}`, 2},
		{`warren_errors_total{category="invalid",op="Create"}`, 1},
		{`warren_errors_total{category="conflict",op="Create"}`, 1},
		{`warren_errors_total{category="not_found",op="Exec"}`, 1},
		{`warren_errors_total{category="internal",op="Create"}`, 0},
	}
	for _, c := range checks {
		if got := delta(c.series); got != c.want {
			t.Errorf("%s moved by %v, want %v", c.series, got, c.want)
		}
	}
	if sum, _ := m1.get("warren_sandbox_create_seconds_sum"); sum <= 0 || sum > 60 {
		t.Errorf("warren_sandbox_create_seconds_sum = %v", sum)
	}
	if inf, _ := m1.get(`warren_sandbox_create_seconds_bucket{le="+Inf"}`); inf != 2 {
		t.Errorf("create +Inf bucket = %v", inf)
	}
	// Every step of the two successful creates, and no more (the refused
	// ones are not timed): the steps add up to less than the whole create.
	var steps float64
	for _, ph := range []string{"dirs", "clone", "cgroup", "config", "network", "init", "attach"} {
		if n, _ := m1.get(`warren_sandbox_create_phase_seconds_count{phase="` + ph + `"}`); n != 2 {
			t.Errorf("create phase %s observed %v times, want 2", ph, n)
		}
		v, _ := m1.get(`warren_sandbox_create_phase_seconds_sum{phase="` + ph + `"}`)
		steps += v
	}
	if sum, _ := m1.get("warren_sandbox_create_seconds_sum"); steps <= 0 || steps > sum {
		t.Errorf("create phases add up to %v s, the creates took %v s", steps, sum)
	}

	// Deletion, death and timeout move the gauges and the reasons.
	if err := e.c.Delete(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	e.create(&warrenv1.CreateRequest{Id: "brief", TimeoutSeconds: 1})
	if err := e.waitGone("brief", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	m2, _ := e.scrape(t)
	for _, c := range []struct {
		series string
		want   float64
	}{
		{`warren_sandboxes{state="running"}`, 1},
		{`warren_sandboxes{state="deleting"}`, 0},
		{`warren_sandbox_deleted_total{reason="user"}`, 1},
		{`warren_sandbox_deleted_total{reason="timeout"}`, 1},
		{`warren_sandbox_create_seconds_count`, 3},
	} {
		if got, _ := m2.get(c.series); got != c.want {
			t.Errorf("%s = %v, want %v", c.series, got, c.want)
		}
	}
	if err := e.c.Delete(ctx, "m2"); err != nil {
		t.Fatal(err)
	}
	m3, _ := e.scrape(t)
	if got, _ := m3.get(`warren_sandboxes{state="running"}`); got != 0 {
		t.Errorf("running gauge after deleting everything = %v", got)
	}
	// A sandbox whose init dies moves to the dead gauge.
	e.create(&warrenv1.CreateRequest{Id: "dies"})
	if err := unix.Kill(e.initPid("dies"), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := e.waitState("dies", stateStopped, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	m5, _ := e.scrape(t)
	for _, c := range []struct {
		series string
		want   float64
	}{
		{`warren_sandboxes{state="running"}`, 0},
		{`warren_sandboxes{state="stopped"}`, 1},
		{`warren_sandbox_deleted_total{reason="dead"}`, 1},
	} {
		if got, _ := m5.get(c.series); got != c.want {
			t.Errorf("after an init died: %s = %v, want %v", c.series, got, c.want)
		}
	}
	if err := e.c.Delete(ctx, "dies"); err != nil {
		t.Fatal(err)
	}
	m6, _ := e.scrape(t)
	if got, _ := m6.get(`warren_sandboxes{state="stopped"}`); got != 0 {
		t.Errorf("dead gauge after deleting the dead sandbox = %v", got)
	}
	if got, _ := m6.get(`warren_sandbox_deleted_total{reason="user"}`); got != 2 {
		t.Errorf("user deletions = %v, want 2 (deleting a dead sandbox does not count)", got)
	}

	// After a restart the gauges count the adopted sandboxes.
	e.create(&warrenv1.CreateRequest{Id: "adopt"})
	e.kill9()
	e.start()
	m4, _ := e.scrape(t)
	if got, _ := m4.get(`warren_sandboxes{state="running"}`); got != 1 {
		t.Errorf("running gauge after a restart with one sandbox = %v", got)
	}
	if err := e.c.Delete(ctx, "adopt"); err != nil {
		t.Fatal(err)
	}
}

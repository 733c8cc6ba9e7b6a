package server

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// Every RPC of the API has an explicit entry in the harness table, and
// every entry names an RPC: a new RPC fails this test until someone
// decides what a harness may do with it (until then it is refused). An
// entry that checks a sandbox id names a string field of the request.
func TestHarnessRulesCoverEveryRPC(t *testing.T) {
	seen := map[string]bool{}
	svcs := warrenv1.File_warren_v1_warren_proto.Services()
	for i := range svcs.Len() {
		svc := svcs.Get(i)
		for j := range svc.Methods().Len() {
			md := svc.Methods().Get(j)
			proc := "/" + string(svc.FullName()) + "/" + string(md.Name())
			seen[proc] = true
			r, ok := harnessRPC[proc]
			if !ok {
				t.Errorf("%s is missing from harnessRPC (scope.go): decide what a harness may do with it", proc)
				continue
			}
			if r.access == child {
				fd := md.Input().Fields().ByName(r.field)
				if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
					t.Errorf("%s: request %s has no string field %q", proc, md.Input().FullName(), r.field)
				}
			}
			if md.IsStreamingClient() && r.access != deny {
				t.Errorf("%s streams requests: the scope check reads only the first; deny it or check every message", proc)
			}
		}
	}
	for proc := range harnessRPC {
		if !seen[proc] {
			t.Errorf("harnessRPC has %s, which the API does not", proc)
		}
	}
}

// goroutines waits until the goroutine count is at most n, or fails.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A call on a harness's route sees and drives the harness's children
// only: another sandbox, the image store, metrics and node-level RPCs
// are PermissionDenied, unary and streaming alike, and the node's own
// socket is not scoped. Closing the route removes its socket and leaves
// no goroutine behind.
func TestHarnessRouteScopes(t *testing.T) {
	before := runtime.NumGoroutine()
	ts := startServer(t, Config{})
	ts.m.sandboxes["kid"] = &warrenv1.Sandbox{Id: "kid", Parent: "h", State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING}
	ts.m.sandboxes["other"] = &warrenv1.Sandbox{Id: "other", State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING}
	ts.m.sandboxes["h"] = &warrenv1.Sandbox{Id: "h", State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING}
	ts.m.files["kid:/f"] = []byte("x")
	ts.m.files["other:/f"] = []byte("x")

	dir := shortTempDir(t)
	path := filepath.Join(dir, "warren.sock")
	if err := os.WriteFile(path, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ts.srv.OpenRoute("h", path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o666 {
		t.Fatalf("route socket: %v %v, want a socket of mode 0666", fi, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc := newClient(t, "unix://"+path)

	if _, err := hc.Get(ctx, "kid"); err != nil {
		t.Errorf("get own child: %v", err)
	}
	if _, err := hc.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "kid", Argv: []string{"echo", "hi"}}); err != nil {
		t.Errorf("exec in own child: %v", err)
	}
	if _, err := hc.Version(ctx); err != nil {
		t.Errorf("version: %v", err)
	}
	denied := map[string]error{}
	_, denied["get other"] = hc.Get(ctx, "other")
	_, denied["get itself"] = hc.Get(ctx, "h")
	_, denied["exec other"] = hc.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "other", Argv: []string{"true"}})
	_, denied["exec stream other"] = hc.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "other", Argv: []string{"true"}}, func(*warrenv1.ExecEvent) error { return nil })
	denied["delete other"] = hc.Delete(ctx, "other")
	_, denied["events of the node"] = hc.ListSandboxEvents(ctx, &warrenv1.ListSandboxEventsRequest{})
	_, denied["list images"] = hc.ListImages(ctx)
	denied["remove image"] = hc.RemoveImage(ctx, "bb")
	_, denied["commit own child"] = hc.CommitSandbox(ctx, "kid", "layer")
	_, denied["pause by label"] = hc.PauseByLabel(ctx, &warrenv1.PauseByLabelRequest{Labels: map[string]string{"a": "b"}}, func(*warrenv1.ByLabelEvent) error { return nil })
	_, denied["import image tar"] = hc.ImportImageTar(ctx, "x", bytes.NewReader(nil))
	_, denied["download other"] = hc.Download(ctx, "other", "/f")
	for what, err := range denied {
		if !client.IsPermissionDenied(err) {
			t.Errorf("%s through the route: %v, want permission_denied", what, err)
		}
	}
	if _, err := hc.Get(ctx, "nope"); !client.IsNotFound(err) {
		t.Errorf("get missing sandbox: %v, want not_found", err)
	}
	rc, err := hc.Download(ctx, "kid", "/f")
	if err != nil {
		t.Errorf("download from own child: %v", err)
	} else {
		rc.Close()
	}
	hcl := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	for url, want := range map[string]int{"http://h/healthz": 200, "http://h/metrics": 403} {
		res, err := hcl.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("GET %s through the route: %d, want %d", url, res.StatusCode, want)
		}
	}
	hcl.CloseIdleConnections()

	// The node's socket is not scoped.
	nc := newClient(t, "unix://"+ts.sock)
	if _, err := nc.Get(ctx, "other"); err != nil {
		t.Errorf("get through the node's socket: %v", err)
	}
	if _, err := nc.ListImages(ctx); err != nil && strings.Contains(err.Error(), "permission") {
		t.Errorf("list images through the node's socket: %v", err)
	}

	hc.Close()
	ts.srv.CloseRoute("h")
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("socket after CloseRoute: %v, want it gone", err)
	}
	if len(ts.srv.Routes()) != 0 {
		t.Errorf("routes after close: %v", ts.srv.Routes())
	}
	nc.Close()
	if err := ts.stop(); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, before+2)
}

// A route serves at most RouteMaxConns connections at once: a harness
// cannot hold an unbounded number of the daemon's connections (each a
// goroutine and buffers); the next is served once one closes.
func TestRouteConnectionLimit(t *testing.T) {
	ts := startServer(t, Config{})
	path := filepath.Join(shortTempDir(t), "warren.sock")
	if err := ts.srv.OpenRoute("h", path); err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	for range RouteMaxConns {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	get := func(timeout time.Duration) error {
		hc := &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
		defer hc.CloseIdleConnections()
		res, err := hc.Get("http://h/healthz")
		if err == nil {
			res.Body.Close()
		}
		return err
	}
	if err := get(500 * time.Millisecond); err == nil {
		t.Fatalf("a call past %d held connections was served", RouteMaxConns)
	}
	held[0].Close()
	if err := get(10 * time.Second); err != nil {
		t.Fatalf("a call once a connection closed: %v", err)
	}
	for _, c := range held[1:] {
		c.Close()
	}
	ts.srv.CloseRoute("h")
}

// TestHarnessCallBudget: a harness's calls spend its route's budget: past
// its burst a call waits for the rate (here 2 s a call, beyond the wait a
// call is allowed) and is refused Exhausted, naming the budget, for RPCs
// and plain endpoints alike; another harness's route has a budget of its
// own, and the node's socket none.
func TestHarnessCallBudget(t *testing.T) {
	ts := startServer(t, Config{HarnessCallsPerSecond: 0.5, HarnessCallBurst: 3})
	ts.m.sandboxes["kid"] = &warrenv1.Sandbox{Id: "kid", Parent: "h", State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING}
	dir := shortTempDir(t)
	routes := map[string]string{"h": filepath.Join(dir, "h.sock"), "h2": filepath.Join(dir, "h2.sock")}
	for h, p := range routes {
		if err := ts.srv.OpenRoute(h, p); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc := newClient(t, "unix://"+routes["h"])
	for i := range 3 {
		if _, err := hc.Get(ctx, "kid"); err != nil {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
	}
	_, err := hc.Get(ctx, "kid")
	if !client.IsExhausted(err) || !strings.Contains(err.Error(), "call budget") {
		t.Fatalf("a call past the budget: %v, want exhausted naming the budget", err)
	}
	hcl := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", routes["h"])
	}}}
	defer hcl.CloseIdleConnections()
	res, err := hcl.Get("http://h/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a plain endpoint past the budget: HTTP %d, want 429", res.StatusCode)
	}
	if _, err := newClient(t, "unix://"+routes["h2"]).Version(ctx); err != nil {
		t.Errorf("another harness's call: %v", err)
	}
	nc := newClient(t, "unix://"+ts.sock)
	for i := range 10 {
		if _, err := nc.Get(ctx, "kid"); err != nil {
			t.Fatalf("node call %d: %v", i, err)
		}
	}
}

package ui

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
)

// fakeAPI serves the few calls the list, overview and delete use; the
// browser test (test/e2e TestUIBrowser) covers the rest against a real
// daemon.
type fakeAPI struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	warrenv1connect.UnimplementedSystemServiceHandler

	mu      sync.Mutex
	sbs     []*warrenv1.Sandbox
	deleted []string
}

func (f *fakeAPI) List(_ context.Context, r *connect.Request[warrenv1.ListRequest]) (*connect.Response[warrenv1.ListResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := &warrenv1.ListResponse{}
next:
	for _, sb := range f.sbs {
		for k, v := range r.Msg.GetLabels() {
			if sb.GetLabels()[k] != v {
				continue next
			}
		}
		res.Sandboxes = append(res.Sandboxes, sb)
	}
	return connect.NewResponse(res), nil
}

func (f *fakeAPI) Delete(_ context.Context, r *connect.Request[warrenv1.DeleteRequest]) (*connect.Response[warrenv1.DeleteResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, r.Msg.GetId())
	return connect.NewResponse(&warrenv1.DeleteResponse{}), nil
}

func (f *fakeAPI) NodeStatus(context.Context, *connect.Request[warrenv1.NodeStatusRequest]) (*connect.Response[warrenv1.NodeStatusResponse], error) {
	return connect.NewResponse(&warrenv1.NodeStatusResponse{Nodes: []*warrenv1.NodeStatus{{Name: `<b>node</b>`, Up: true, CpuMillis: 2000}}}), nil
}

const testToken = "t0ken"

// newTestSite serves the dashboard of a listener with token tok over a
// fake API holding n sandboxes.
func newTestSite(t *testing.T, tok string, n int) (*httptest.Server, *fakeAPI) {
	t.Helper()
	f := &fakeAPI{}
	states := []warrenv1.SandboxState{warrenv1.SandboxState_SANDBOX_STATE_RUNNING, warrenv1.SandboxState_SANDBOX_STATE_PAUSED}
	for i := range n {
		f.sbs = append(f.sbs, &warrenv1.Sandbox{Id: fmt.Sprintf("sb-%05d", i), Image: "img", Backend: "container",
			State: states[i%2], CreatedAtUnixMs: int64(1000 + i), Node: "n1",
			Labels: map[string]string{"team": []string{"red", "blue"}[i%2], "evil": `<img src=x onerror=alert(1)>`}})
	}
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(f))
	mux.Handle(warrenv1connect.NewSystemServiceHandler(f))
	api := httptest.NewServer(mux)
	t.Cleanup(api.Close)
	u, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Close)
	// The dashboard's client talks to the fake whatever host it names.
	apiURL, _ := url.Parse(api.URL)
	hc := &http.Client{Transport: rewriteHost{apiURL.Host}}
	srv := httptest.NewServer(u.Handler(hc, nil, tok, nil))
	t.Cleanup(srv.Close)
	return srv, f
}

type rewriteHost struct{ host string }

func (r rewriteHost) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Host = r.host
	return http.DefaultTransport.RoundTrip(req)
}

func fetch(t *testing.T, method, u string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, u, body)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

var cookie = map[string]string{"Cookie": CookieName + "=" + testToken}

// TestAuth: on a listener with a token, a request without it (or with
// a wrong one) gets the login page with 401 and no data; the cookie or
// a bearer header opens the pages; logging in sets an HttpOnly,
// SameSite=Strict cookie scoped to /ui; on the socket (no token) the
// pages open without one, to local host names only (DNS rebinding).
func TestAuth(t *testing.T) {
	srv, _ := newTestSite(t, testToken, 3)
	for _, hdr := range []map[string]string{nil, {"Cookie": CookieName + "=wrong"}, {"Authorization": "Bearer wrong"}} {
		for _, p := range []string{"/ui/", "/ui/sandboxes", "/ui/nodes", "/ui/live", "/ui/sandboxes/sb-00001", "/ui/nope"} {
			res, body := fetch(t, "GET", srv.URL+p, nil, hdr)
			if res.StatusCode != 401 || !strings.Contains(body, `id="login"`) || strings.Contains(body, "sb-0000") || strings.Contains(body, "&lt;b&gt;node") {
				t.Errorf("GET %s with %v: %d, want the login page only:\n%s", p, hdr, res.StatusCode, body)
			}
		}
	}
	for _, hdr := range []map[string]string{cookie, {"Authorization": "Bearer " + testToken}} {
		if res, body := fetch(t, "GET", srv.URL+"/ui/sandboxes", nil, hdr); res.StatusCode != 200 || !strings.Contains(body, "sb-00002") {
			t.Errorf("with %v: %d", hdr, res.StatusCode)
		}
	}
	res, _ := fetch(t, "POST", srv.URL+"/ui/login", strings.NewReader("token=wrong"), map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if res.StatusCode != 401 || len(res.Cookies()) != 0 {
		t.Errorf("wrong login: %d %v", res.StatusCode, res.Cookies())
	}
	res, _ = fetch(t, "POST", srv.URL+"/ui/login", strings.NewReader("token="+testToken), map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	cs := res.Cookies()
	if res.StatusCode != 303 || len(cs) != 1 || cs[0].Name != CookieName || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode || cs[0].Path != "/ui" {
		t.Errorf("login: %d %+v", res.StatusCode, cs)
	}
	res, _ = fetch(t, "POST", srv.URL+"/ui/login", strings.NewReader("token="+testToken),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Site": "cross-site"})
	if res.StatusCode != 403 || len(res.Cookies()) != 0 {
		t.Errorf("cross-site login: %d", res.StatusCode)
	}

	sock, _ := newTestSite(t, "", 3)
	for host, want := range map[string]int{"": 200, "localhost:7080": 200, "127.0.0.1": 200, "[::1]:80": 200, "x": 200,
		"rebind.example.com": 403, "rebind.example.com:7080": 403, "127.0.0.1.nip.io": 403} {
		h := map[string]string{}
		if host != "" {
			h["Host"] = host
		}
		res, body := fetch(t, "GET", sock.URL+"/ui/sandboxes", nil, h)
		if res.StatusCode != want || (want == 200) != strings.Contains(body, "sb-00002") {
			t.Errorf("socket without a token, Host %q: %d, want %d", host, res.StatusCode, want)
		}
	}
}

var csrfMeta = regexp.MustCompile(`<meta name="csrf" content="([0-9a-f]+)">`)

// TestCSRF: delete needs the session's CSRF token (form field or
// header) and a same-origin request; without either nothing is deleted.
func TestCSRF(t *testing.T) {
	srv, f := newTestSite(t, testToken, 3)
	_, page := fetch(t, "GET", srv.URL+"/ui/sandboxes", nil, cookie)
	m := csrfMeta.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the page")
	}
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie["Cookie"]}
	for name, tc := range map[string]struct {
		body string
		hdr  map[string]string
	}{
		"no token":     {"", nil},
		"wrong token":  {"csrf=" + strings.Repeat("0", len(m[1])), nil},
		"cross-site":   {"csrf=" + m[1], map[string]string{"Sec-Fetch-Site": "cross-site"}},
		"other origin": {"csrf=" + m[1], map[string]string{"Origin": "http://evil.example"}},
	} {
		h := map[string]string{}
		for k, v := range form {
			h[k] = v
		}
		for k, v := range tc.hdr {
			h[k] = v
		}
		if res, _ := fetch(t, "POST", srv.URL+"/ui/sandboxes/sb-00001/delete", strings.NewReader(tc.body), h); res.StatusCode != 403 {
			t.Errorf("%s: %d, want 403", name, res.StatusCode)
		}
	}
	if len(f.deleted) != 0 {
		t.Fatalf("deleted without a valid CSRF token: %v", f.deleted)
	}
	if res, _ := fetch(t, "POST", srv.URL+"/ui/sandboxes/sb-00001/delete", strings.NewReader("csrf="+m[1]), form); res.StatusCode != 303 {
		t.Errorf("delete with the token: %d", res.StatusCode)
	}
	h := map[string]string{"Cookie": cookie["Cookie"], csrfHeader: m[1], "Origin": srv.URL}
	if res, _ := fetch(t, "POST", srv.URL+"/ui/sandboxes/sb-00002/delete", nil, h); res.StatusCode != 303 {
		t.Errorf("delete with the header: %d", res.StatusCode)
	}
	if strings.Join(f.deleted, ",") != "sb-00001,sb-00002" {
		t.Errorf("deleted %v", f.deleted)
	}
}

// TestListPagedOnTheServer: of 20,000 sandboxes one page reaches the
// browser (100,000 take the same path, a few seconds under -race); filters, sort order and page links work; a page size past
// the cap is cut to it. Untrusted labels and node names are escaped.
func TestListPagedOnTheServer(t *testing.T) {
	srv, _ := newTestSite(t, testToken, 20_000)
	rows := regexp.MustCompile(`<a class="sbid" href="/ui/sandboxes/([^"]+)">`)
	res, body := fetch(t, "GET", srv.URL+"/ui/sandboxes", nil, cookie)
	ids := rows.FindAllStringSubmatch(body, -1)
	if res.StatusCode != 200 || len(ids) != 50 || ids[0][1] != "sb-19999" || len(body) > 200<<10 {
		t.Fatalf("first page: %d, %d rows, first %v, %d bytes", res.StatusCode, len(ids), ids[:1], len(body))
	}
	if !strings.Contains(body, "page 1 of 400") || !strings.Contains(body, "20000 match") {
		t.Errorf("pager or count missing")
	}
	if strings.Contains(body, "<img src=x") || !strings.Contains(body, "&lt;img src=x onerror=alert(1)&gt;") {
		t.Errorf("labels not escaped")
	}
	_, body = fetch(t, "GET", srv.URL+"/ui/sandboxes?label=team%3Dred&state=paused&sort=id&order=asc&per=100000&page=2", nil, cookie)
	ids = rows.FindAllStringSubmatch(body, -1)
	// red is even, paused is odd: nothing matches both.
	if len(ids) != 0 || !strings.Contains(body, "0 match") {
		t.Errorf("red and paused: %d rows", len(ids))
	}
	_, body = fetch(t, "GET", srv.URL+"/ui/sandboxes?label=team%3Dblue&sort=id&order=asc&per=100000&page=2", nil, cookie)
	ids = rows.FindAllStringSubmatch(body, -1)
	if len(ids) != maxPerPage || ids[0][1] != "sb-01001" || !strings.Contains(body, "page 2 of 20") {
		t.Errorf("blue, by id, page 2 of %d: %d rows, first %v", maxPerPage, len(ids), ids[:1])
	}
	_, body = fetch(t, "GET", srv.URL+"/ui/", nil, cookie)
	if strings.Contains(body, "<b>node</b>") || !strings.Contains(body, "&lt;b&gt;node&lt;/b&gt;") {
		t.Errorf("node name not escaped on the overview")
	}
	if res, _ := fetch(t, "GET", srv.URL+"/ui/sandboxes?label=nolabel", nil, cookie); res.StatusCode != 400 {
		t.Errorf("bad label filter: %d", res.StatusCode)
	}
}

// TestHeaders: every response carries the strict CSP and no-sniff, and
// pages are not cached.
func TestHeaders(t *testing.T) {
	srv, _ := newTestSite(t, testToken, 1)
	for _, p := range []string{"/ui/login", "/ui/sandboxes", "/ui/static/app.js"} {
		res, _ := fetch(t, "GET", srv.URL+p, nil, cookie)
		if res.Header.Get("Content-Security-Policy") != contentSecurityPolicy || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", p, res.Header)
		}
	}
	if !strings.Contains(contentSecurityPolicy, "script-src 'self';") || strings.Contains(contentSecurityPolicy, "unsafe") {
		t.Errorf("CSP %q", contentSecurityPolicy)
	}
}

func TestParseText(t *testing.T) {
	in := `# HELP warren_exec_seconds x
warren_exec_seconds_sum 1.5
warren_exec_seconds_count 3
warren_sandbox_create_seconds_count 7 1700000000
warren_security_events_total{kind="oom"} 2
warren_security_events_total{kind="pids",x="a b}"} 3
warren_sandboxes{state="running"} 9
`
	got := parseText(strings.NewReader(in))
	want := map[string]float64{metricExecSum: 1.5, metricExecN: 3, metricCreates: 7, metricSecurity: 5}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %v", got)
	}
}

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// The payloads a sandbox controls that the dashboard must show as text.
const (
	xssLabel = `<img src=x onerror=alert(1)>`
	xssFile  = `"><script>`
	xssFile2 = `<img src=x onerror=alert(2)>`
)

// uiSandboxes is how many sandboxes the list test makes.
const uiSandboxes = 1000

// TestUIBrowser drives the web dashboard with headless Chromium against a
// real daemon serving it on TCP with a token: a token-less request gets
// the login page and no data; logging in shows the overview; the list of
// 1,000 sandboxes is paged and filtered on the server; one sandbox's live
// CPU moves while it runs a loop; its terminal runs a command in a PTY
// and its shell is hung up when the page goes; delete deletes it. A label, file names and a command (in the
// trajectory, with its timeout among the security events) made of HTML
// render as text; no JavaScript dialog opens anywhere (the listener is
// proven live by a probe dialog at the end) and the CSP refuses nothing.
// Screenshots are saved under $WARREN_ARTIFACTS/ui (else the test's
// temporary directory) and checked not blank. It skips only when Debian's
// chromium is not installed.
func TestUIBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (scripts/deps.sh installs Debian's chromium package): cannot drive the dashboard")
	}
	t.Parallel()
	const token = "e2e-ui-token-0123456789abcdef"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{serveArgs: []string{"--listen", "127.0.0.1:0", "--token-file", tokenFile}})
	m := tcpListenRE.FindStringSubmatch(e.logTail(1000))
	if m == nil {
		t.Fatalf("no TCP listener in the daemon log:\n%s", e.logTail(20))
	}
	base := "http://" + m[1]
	ctx := ctxFor(t, 10*time.Minute)
	shots := artifactsDir(t, "ui")

	// The fleet: 1,000 plain container sandboxes in two teams, a loop
	// sandbox and one whose label and files are HTML.
	start := time.Now()
	makeSandboxes(t, e, uiSandboxes)
	t.Logf("created %d sandboxes in %v", uiSandboxes, time.Since(start).Round(time.Millisecond))
	e.create(&warrenv1.CreateRequest{Id: "loop", Image: imageName, Labels: map[string]string{"role": "loop"},
		Resources: &warrenv1.Resources{CpuMillis: 500}})
	e.create(&warrenv1.CreateRequest{Id: "xss", Image: imageName, Labels: map[string]string{"payload": xssLabel, xssLabel: "key"}})
	for _, name := range []string{xssFile, xssFile2} {
		if err := e.c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "xss", Path: "/tmp/" + name,
			Content: []byte("<script>alert(3)</script>\n")}); err != nil {
			t.Fatalf("write %q: %v", name, err)
		}
	}

	// A command of HTML that times out: a trajectory entry and a
	// security event (timeout) on the xss sandbox's page.
	res, err := e.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "xss", Shell: "echo '" + xssFile2 + "'; sleep 30", TimeoutMs: 300})
	if err != nil || !res.GetTimedOut() {
		t.Fatalf("exec to time out: %v %v", res, err)
	}

	// Without a token: the login page, never data.
	raw := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, p := range []string{"/ui", "/ui/", "/ui/sandboxes", "/ui/sandboxes/xss", "/ui/sandboxes/loop/live", "/ui/nodes", "/ui/images",
		"/ui/sandboxes/loop?path=/etc", "/ui/live", "/ui/nosuch"} {
		for _, cookie := range []string{"", "wrong-token"} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+p, nil)
			if cookie != "" {
				req.AddCookie(&http.Cookie{Name: "warren_ui_token", Value: cookie})
			}
			res, err := raw.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `id="login"`) ||
				strings.Contains(string(body), "loop") || strings.Contains(string(body), "ui-00") {
				t.Errorf("GET %s with cookie %q: %d, want 401 and the login page without data:\n%.400s", p, cookie, res.StatusCode, body)
			}
			if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
				t.Errorf("GET %s: content type %q", p, ct)
			}
			if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
				t.Errorf("GET %s: Content-Security-Policy %q", p, csp)
			}
		}
	}
	// A state change without the CSRF token is refused even with the
	// session cookie, and one from another site is refused outright.
	for _, tc := range []struct{ name, csrf, origin string }{{"no CSRF token", "", ""}, {"wrong CSRF token", "0000", ""}, {"cross-site", "", "http://evil.example"}} {
		form := url.Values{"csrf": {tc.csrf}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/ui/sandboxes/ui-0001/delete", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: "warren_ui_token", Value: token})
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		res, err := raw.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("delete with %s: %d, want 403", tc.name, res.StatusCode)
		}
	}
	if _, err := e.c.Get(ctx, "ui-0001"); err != nil {
		t.Errorf("a refused delete deleted: %v", err)
	}

	// The browser.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	// Every JavaScript dialog is recorded and dismissed. Subscribing
	// starts the browser (on a context without a deadline, which would
	// end it).
	var dialogMu sync.Mutex
	var dialogs []string
	// The listeners log with t: they must be done before the test is.
	var listeners sync.WaitGroup
	defer func() {
		cancelB()
		listeners.Wait()
	}()
	opening := chromedp.Events(bctx, page.JavascriptDialogOpening)
	listeners.Add(3)
	go func() {
		defer listeners.Done()
		for ev, err := range opening {
			if err != nil {
				return
			}
			dialogMu.Lock()
			dialogs = append(dialogs, ev.Message)
			dialogMu.Unlock()
			_, _ = chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	// The page's own errors (exceptions, CSP refusals, failed fetches)
	// are logged, and exceptions fail the test.
	var jsErrors atomic.Int64
	exceptions := chromedp.Events(bctx, runtime.ExceptionThrown)
	go func() {
		defer listeners.Done()
		for ev, err := range exceptions {
			if err != nil {
				return
			}
			jsErrors.Add(1)
			desc := ev.ExceptionDetails.Text
			if ex := ev.ExceptionDetails.Exception; ex != nil {
				desc += " " + ex.Description
			}
			t.Logf("JavaScript exception: %s", desc)
		}
	}()
	logs := chromedp.Events(bctx, cdplog.EntryAdded)
	go func() {
		defer listeners.Done()
		for ev, err := range logs {
			if err != nil {
				return
			}
			t.Logf("browser %s: %s %s", ev.Entry.Level, ev.Entry.Text, ev.Entry.URL)
			// The CSP refused something: markup from data got into a page.
			if strings.Contains(ev.Entry.Text, "Content Security Policy") {
				jsErrors.Add(1)
			}
		}
	}()
	for _, en := range []cdp.Command[cdp.Empty, cdp.Empty]{runtime.Enable, cdplog.Enable} {
		if _, err := chromedp.Call(bctx, en, cdp.Empty{}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(bctx, 60*time.Second)
		defer cancel()
		if err := chromedp.Do(c, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		return browserRun(t, bctx, "text of "+sel, chromedp.Text(chromedp.CSS(sel)))
	}
	// poll is text for polling: a page being replaced has no such node
	// for a moment.
	poll := func(sel string) string {
		c, cancel := context.WithTimeout(bctx, 10*time.Second)
		defer cancel()
		s, err := chromedp.Run(c, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			return "error: " + err.Error()
		}
		return s
	}
	// waitFor polls the page until cond holds.
	waitFor := func(what string, within time.Duration, cond func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			ok, got := cond()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (last: %q)", what, within, got)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	shot := func(name string) {
		t.Helper()
		buf := browserRun(t, bctx, "screenshot "+name, chromedp.FullScreenshot(100)) // 100: PNG
		checkNotBlank(t, name, buf)
		if err := os.WriteFile(filepath.Join(shots, name+".png"), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Log in.
	run("open the dashboard", chromedp.Navigate(base+"/ui/sandboxes"), chromedp.WaitVisible(chromedp.CSS("#login")))
	shot("login")
	run("log in", chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS(`[data-live="total"]`)))
	want := strconv.Itoa(uiSandboxes + 2)
	waitFor("the overview's total", 30*time.Second, func() (bool, string) {
		s := poll(`[data-live="total"]`)
		return s == want, s
	})
	if s := text(`[data-live="state-running"]`); s != want {
		t.Errorf("running sandboxes on the overview: %q, want %s", s, want)
	}
	shot("overview")

	// The list: one page of 50 of 1,002 reaches the browser.
	start = time.Now()
	run("list", chromedp.Navigate(base+"/ui/sandboxes"), chromedp.WaitVisible(chromedp.CSS("#sandboxes")))
	t.Logf("the list of %s sandboxes rendered in %v", want, time.Since(start).Round(time.Millisecond))
	rows := browserRun(t, bctx, "rows", chromedp.Evaluate[int](`document.querySelectorAll("#sandboxes tbody tr").length`))
	if rows != 50 {
		t.Errorf("rows on the first page: %d, want 50", rows)
	}
	if s := text("#pageinfo"); s != "page 1 of 21" {
		t.Errorf("pager: %q", s)
	}
	if s := text("#matched"); s != want+" match" {
		t.Errorf("matched: %q", s)
	}
	shot("sandboxes")
	run("next page", chromedp.Click(chromedp.CSS("#next")), chromedp.WaitVisible(chromedp.CSS("#prev")))
	if s := text("#pageinfo"); s != "page 2 of 21" {
		t.Errorf("pager after next: %q", s)
	}
	// Filter by label, then by state and id.
	run("filter by label", chromedp.Navigate(base+"/ui/sandboxes"), chromedp.WaitVisible(chromedp.CSS("#f-label")),
		chromedp.SendKeys(chromedp.CSS("#f-label"), "team=red"), chromedp.Click(chromedp.CSS("#f-apply")))
	waitFor("the label filter", 30*time.Second, func() (bool, string) {
		s := poll("#matched")
		return s == strconv.Itoa(uiSandboxes/2)+" match", s
	})
	teams := browserRun(t, bctx, "teams", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#sandboxes td.labels")].map(td => td.textContent.includes("team=red") ? "red" : "other")`))
	for i, tm := range teams {
		if tm != "red" {
			t.Errorf("row %d of the team=red filter is not red", i)
		}
	}
	run("filter by id", chromedp.Navigate(base+"/ui/sandboxes?state=running&id=loop"), chromedp.WaitVisible(chromedp.CSS("#sandboxes")))
	if s := text("#matched"); s != "1 match" {
		t.Errorf("id filter: %q", s)
	}

	// One sandbox: its live CPU moves once a loop runs.
	run("open loop", chromedp.Click(chromedp.CSS("a.sbid")), chromedp.WaitVisible(chromedp.CSS("#sb-cpu")))
	if s := text("#sb-id"); s != "loop" {
		t.Fatalf("opened %q", s)
	}
	// The first samples: no CPU used yet.
	waitFor("a first CPU reading", 30*time.Second, func() (bool, string) {
		s := poll("#sb-cpu")
		return strings.HasSuffix(s, "%"), s
	})
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "loop", Shell: "while :; do :; done"}); err != nil {
		t.Fatal(err)
	}
	waitFor("the live CPU to show the loop", 60*time.Second, func() (bool, string) {
		s := poll("#sb-cpu")
		pct, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
		return err == nil && pct >= 10, s
	})
	shot("sandbox")

	// Its terminal runs a command in a PTY.
	run("open the terminal", chromedp.Click(chromedp.CSS("#term-open")), chromedp.WaitVisible(chromedp.CSS("#term-in")))
	run("type a command", chromedp.SendKeys(chromedp.CSS("#term-in"), "echo ui-$((6*7)) && tty"),
		chromedp.Click(chromedp.CSS("#term-send")))
	waitFor("the command's output in the terminal", 30*time.Second, func() (bool, string) {
		s := poll("#term-out")
		return strings.Contains(s, "ui-42") && strings.Contains(s, "/dev/pts/"), s
	})
	shot("terminal")
	// Leaving the page hangs up the shell, as closing a terminal does.
	run("reload", chromedp.Navigate(base+"/ui/sandboxes/loop"), chromedp.WaitVisible(chromedp.CSS("#term-open")))
	waitFor("the shell to exit on hangup", 30*time.Second, func() (bool, string) {
		ps, err := e.c.ListProcesses(ctx, "loop")
		if err != nil {
			return false, err.Error()
		}
		for _, p := range ps {
			if p.GetPty() && p.GetRunning() {
				return false, strings.Join(p.GetArgv(), " ") + " still running"
			}
		}
		return true, ""
	})

	// Delete it, through the confirmation.
	run("delete", chromedp.Click(chromedp.CSS("details.danger summary")), chromedp.WaitVisible(chromedp.CSS("#delete")),
		chromedp.Click(chromedp.CSS("#delete")), chromedp.WaitVisible(chromedp.CSS("#sandboxes")))
	if err := e.waitGone("loop", 60*time.Second); err != nil {
		t.Errorf("deleted in the dashboard: %v", err)
	}

	// Untrusted text renders as text.
	run("list the xss sandbox", chromedp.Navigate(base+"/ui/sandboxes?id=xss"), chromedp.WaitVisible(chromedp.CSS("#sandboxes")))
	if s := text("#sandboxes td.labels"); !strings.Contains(s, "payload="+xssLabel) || !strings.Contains(s, xssLabel+"=key") {
		t.Errorf("the label is not shown as text: %q", s)
	}
	injected := browserRun(t, bctx, "injected", chromedp.Evaluate[int](`document.querySelectorAll("main img, main script").length`))
	if injected != 0 {
		t.Errorf("%d elements injected into the list", injected)
	}
	run("open the xss sandbox's files", chromedp.Navigate(base+"/ui/sandboxes/xss?path=/tmp"), chromedp.WaitVisible(chromedp.CSS("#files")))
	names := browserRun(t, bctx, "file names", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#files a.fname")].map(a => a.textContent)`))
	if !slices.Contains(names, xssFile) || !slices.Contains(names, xssFile2) {
		t.Errorf("file names shown: %q", names)
	}
	if s := text("#sb-labels"); !strings.Contains(s, xssLabel) {
		t.Errorf("labels on the sandbox page: %q", s)
	}
	if s := text("#trajectory"); !strings.Contains(s, "echo '"+xssFile2+"'; sleep 30") {
		t.Errorf("the command in the trajectory: %q", s)
	}
	if s := text("#events"); !strings.Contains(s, "timeout") {
		t.Errorf("the timeout among the security events: %q", s)
	}
	injected = browserRun(t, bctx, "injected", chromedp.Evaluate[int](`document.querySelectorAll("main img, main script").length + document.scripts.length - 1`))
	if injected != 0 {
		t.Errorf("%d elements injected into the sandbox page", injected)
	}
	shot("xss")
	run("open the xss file", chromedp.Navigate(base+"/ui/sandboxes/xss?path="+url.QueryEscape("/tmp/"+xssFile)),
		chromedp.WaitVisible(chromedp.CSS("#file-content")))
	if s := text("#file-content"); !strings.Contains(s, "<script>alert(3)</script>") {
		t.Errorf("file content: %q", s)
	}

	// On a phone: the page fits the screen's width (tables scroll in
	// their own box).
	run("phone", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Navigate(base+"/ui/sandboxes"),
		chromedp.WaitVisible(chromedp.CSS("#sandboxes")))
	overflow := browserRun(t, bctx, "overflow", chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`))
	if overflow {
		t.Errorf("the list is wider than a phone's screen")
	}
	shot("phone")
	run("desktop", chromedp.EmulateViewport(1280, 900))

	// The images and nodes pages render.
	run("images", chromedp.Navigate(base+"/ui/images"), chromedp.WaitVisible(chromedp.CSS("section.image")))
	shot("images")
	run("nodes", chromedp.Navigate(base+"/ui/nodes"), chromedp.WaitVisible(chromedp.CSS("table")))
	shot("nodes")

	if n := jsErrors.Load(); n != 0 {
		t.Errorf("%d JavaScript exceptions or CSP refusals (logged above)", n)
	}
	dialogMu.Lock()
	got := append([]string(nil), dialogs...)
	dialogMu.Unlock()
	if len(got) != 0 {
		t.Errorf("JavaScript dialogs opened: %q", got)
	}
	// The dialog listener works: a dialog the test opens is seen.
	browserRun(t, bctx, "probe dialog", chromedp.Evaluate[any](`setTimeout(() => alert("probe"), 0)`))
	waitFor("the probe dialog", 10*time.Second, func() (bool, string) {
		dialogMu.Lock()
		defer dialogMu.Unlock()
		return slices.Contains(dialogs, "probe"), strings.Join(dialogs, ",")
	})
	t.Logf("screenshots in %s", shots)
}

// browserRun runs one action with a deadline and returns its value.
func browserRun[T any](t *testing.T, bctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// makeSandboxes creates n sandboxes ui-0000... in two teams (red, blue)
// with a few creates at once.
func makeSandboxes(t *testing.T, e *env, n int) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Minute)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				team := map[bool]string{true: "red", false: "blue"}[i%2 == 0]
				if _, err := e.c.Create(ctx, &warrenv1.CreateRequest{Id: fmt.Sprintf("ui-%04d", i), Image: imageName,
					Labels: map[string]string{"team": team}, Resources: &warrenv1.Resources{MemoryBytes: 32 << 20}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("create: %v", err)
	}
}

// artifactsDir is where a test keeps files for CI: $WARREN_ARTIFACTS/sub,
// else the test's temporary directory (removed after the test).
func artifactsDir(t *testing.T, sub string) string {
	t.Helper()
	root := os.Getenv("WARREN_ARTIFACTS")
	if root == "" {
		return t.TempDir()
	}
	dir := filepath.Join(root, sub)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// checkNotBlank fails unless the PNG has some variety: a page that
// rendered nothing is one colour.
func checkNotBlank(t *testing.T, name string, data []byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	colours := map[uint32]bool{}
	b := img.Bounds()
	var nonWhite, all int
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			colours[r>>8<<16|g>>8<<8|bl>>8] = true
			if r>>8 < 240 || g>>8 < 240 || bl>>8 < 240 {
				nonWhite++
			}
			all++
		}
	}
	if len(colours) < 8 || nonWhite*1000 < all {
		t.Errorf("screenshot %s looks blank: %d colours, %d of %d sampled pixels not white", name, len(colours), nonWhite, all)
	}
}

// TestUIGatewayShowsTheCluster: a gateway serves the same dashboard
// over its cluster: behind its token, the nodes page lists every node
// and the sandboxes page the sandboxes of every node, each with its
// node, and one sandbox's page (on whichever node) opens.
func TestUIGatewayShowsTheCluster(t *testing.T) {
	cl := newClusterOf(t, clusterConfig{nodes: 2})
	ctx := ctxFor(t, 3*time.Minute)
	gw := cl.gws[0]
	res, err := gw.c.BatchCreate(ctx, &warrenv1.CreateRequest{Image: imageName, Labels: map[string]string{"ui": "gw"}}, 6)
	if err != nil {
		t.Fatal(err)
	}
	onNode := map[string]string{}
	for _, sb := range res.GetSandboxes() {
		onNode[sb.GetId()] = sb.GetNode()
	}
	if len(onNode) != 6 {
		t.Fatalf("batch made %d sandboxes: %v", len(onNode), res)
	}
	page := func(p string, cookie bool) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+gw.api+p, nil)
		if cookie {
			req.AddCookie(&http.Cookie{Name: "warren_ui_token", Value: cl.token})
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	if code, body := page("/ui/nodes", false); code != http.StatusUnauthorized || strings.Contains(body, "node0") {
		t.Errorf("the gateway's nodes page without a token: %d", code)
	}
	code, body := page("/ui/nodes", true)
	if code != 200 || !strings.Contains(body, ">node0<") || !strings.Contains(body, ">node1<") || !strings.Contains(body, "Warren <small>gateway") {
		t.Errorf("the gateway's nodes page: %d\n%s", code, body)
	}
	code, body = page("/ui/sandboxes?label=ui%3Dgw", true)
	if code != 200 || !strings.Contains(body, "6 match") {
		t.Errorf("the gateway's sandboxes page: %d\n%s", code, body)
	}
	nodes := map[string]bool{}
	for id, node := range onNode {
		if !strings.Contains(body, ">"+id+"<") {
			t.Errorf("sandbox %s (on %s) not listed", id, node)
		}
		nodes[node] = true
	}
	for id, node := range onNode {
		code, body = page("/ui/sandboxes/"+id, true)
		if code != 200 || !strings.Contains(body, "<td>"+node+"</td>") {
			t.Errorf("sandbox %s's page through the gateway: %d", id, code)
		}
		break
	}
	// The overview and images pages work over a cluster too.
	if code, body = page("/ui/", true); code != 200 || !strings.Contains(body, `data-live="total">6<`) || !strings.Contains(body, ">node1<") {
		t.Errorf("the gateway's overview: %d\n%s", code, body)
	}
	if code, body = page("/ui/images", true); code != 200 || !strings.Contains(body, "<h2>"+imageName+" ") {
		t.Errorf("the gateway's images page: %d\n%s", code, body)
	}
	t.Logf("the 6 sandboxes are on %d nodes", len(nodes))
}

// Package ui is Warren's web dashboard, served under /ui by `warren serve`
// and `warren gateway` (docs/UI.md).
//
// It is a client of the API like any other: every page is built from the
// Go client's calls, made in process (server.UIFactory), so a gateway's
// dashboard shows its cluster and a node's shows the node. Pages are
// rendered on the server with html/template; a small script embedded
// with the templates adds live numbers (server-sent events) and the
// terminal. Nothing is fetched from elsewhere and nothing is built.
//
// Everything a sandbox controls (ids, labels, hostnames, file names,
// output) is untrusted: templates escape it by context, live data goes out
// as JSON and the script writes it with textContent only; the
// Content-Security-Policy allows scripts from /ui/static only, so neither
// an injected <script> nor an inline handler runs. State-changing calls
// (delete, terminal) need a CSRF token tied to the session.
package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

//go:embed templates/*.html static/*
var assets embed.FS

// CookieName is the cookie holding the API token after a login.
const CookieName = "warren_ui_token"

// csrfHeader carries the CSRF token on the script's calls; forms send it
// as the field csrf.
const csrfHeader = "X-Warren-CSRF"

// contentSecurityPolicy allows nothing inline and nothing from elsewhere:
// scripts, styles and connections from this origin only.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Options configure New.
type Options struct {
	Logger *slog.Logger
	// Role names what serves the dashboard ("node" or "gateway"), shown
	// in its title.
	Role string
	// SampleEvery is how often the overview's history samples the
	// metrics (zero: 10s); History is how long it keeps (zero: 1h).
	SampleEvery, History time.Duration
}

// UI is the dashboard of one process: its listeners share the history
// of the metrics and the CSRF key.
type UI struct {
	o     Options
	key   []byte // CSRF tokens are HMACs of the session under it
	pages map[string]*template.Template

	mu      sync.Mutex
	hist    *history
	stop    chan struct{}
	stopped bool
}

// New returns a dashboard; Handler makes its handler for each listener.
// Close stops its sampling.
func New(o Options) (*UI, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Role == "" {
		o.Role = "node"
	}
	if o.SampleEvery <= 0 {
		o.SampleEvery = 10 * time.Second
	}
	if o.History <= 0 {
		o.History = time.Hour
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	return &UI{o: o, key: key, pages: pages, stop: make(chan struct{}),
		hist: newHistory(int(o.History / o.SampleEvery))}, nil
}

// Close stops sampling the metrics.
func (u *UI) Close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.stopped {
		u.stopped = true
		close(u.stop)
	}
}

// Handler is a server.UIFactory: the dashboard for one listener whose
// bearer token is token ("" on the unix socket: no login).
func (u *UI) Handler(api *http.Client, metrics http.Handler, token string, stopping <-chan struct{}) http.Handler {
	// The host is never dialled: api's transport goes to the API in
	// process.
	c, err := client.New("http://warren.internal", client.WithHTTPClient(api), client.WithToken(""),
		client.WithCreateRetry(0), client.WithUserAgent("warren-ui"))
	if err != nil {
		// Only a bad address fails New, and this one is fixed.
		panic(err)
	}
	if metrics != nil {
		u.startSampling(metrics)
	}
	s := &site{ui: u, c: c, token: token, metrics: metrics != nil, stopping: stopping}
	return s.routes()
}

func (u *UI) startSampling(metrics http.Handler) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.hist.source != nil || u.stopped {
		return
	}
	u.hist.source = metrics
	go u.hist.run(u.o.SampleEvery, u.stop)
}

// site is the dashboard behind one listener.
type site struct {
	ui      *UI
	c       *client.Client
	token   string // "": the listener needs none
	metrics bool
	// stopping closes when the server shuts down: event streams end.
	stopping <-chan struct{}

	// The last list of every sandbox (listAll); the lock also makes
	// concurrent pages share one call.
	listMu   sync.Mutex
	listed   []*warrenv1.Sandbox
	listedAt time.Time
}

func (s *site) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /ui/login", s.loginPage)
	mux.HandleFunc("POST /ui/login", s.login)
	mux.HandleFunc("POST /ui/logout", s.logout)
	authed := func(pattern string, fn http.HandlerFunc) { mux.Handle(pattern, s.auth(fn)) }
	changes := func(pattern string, fn http.HandlerFunc) { mux.Handle(pattern, s.auth(s.csrf(fn))) }
	authed("GET /ui", s.overview)
	authed("GET /ui/{$}", s.overview)
	authed("GET /ui/live", s.overviewLive)
	authed("GET /ui/sandboxes", s.sandboxes)
	authed("GET /ui/sandboxes/{id}", s.sandbox)
	authed("GET /ui/sandboxes/{id}/live", s.sandboxLive)
	authed("GET /ui/sandboxes/{id}/terminal/{pid}", s.terminalStream)
	changes("POST /ui/sandboxes/{id}/delete", s.deleteSandbox)
	changes("POST /ui/sandboxes/{id}/terminal", s.terminalStart)
	changes("POST /ui/sandboxes/{id}/terminal/{pid}/input", s.terminalInput)
	authed("GET /ui/images", s.images)
	authed("GET /ui/nodes", s.nodes)
	authed("/ui/", func(w http.ResponseWriter, r *http.Request) {
		s.errorPage(w, r, http.StatusNotFound, "no such page")
	})
	return secureHeaders(mux)
}

// secureHeaders sets the headers every response carries: the CSP, and no
// sniffing, framing, referrers or caching of pages that hold fleet data.
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if !strings.HasPrefix(r.URL.Path, "/ui/static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// session returns the token the request presents (cookie or bearer
// header) and whether it is the listener's.
func (s *site) session(r *http.Request) (string, bool) {
	if s.token == "" {
		return "", true
	}
	got := ""
	if ck, err := r.Cookie(CookieName); err == nil {
		got = ck.Value
	}
	if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		got = strings.TrimSpace(tok)
	}
	return got, got != "" && equalTokens(got, s.token)
}

// localName reports whether host (of a Host header) cannot be a name a
// DNS-rebinding attacker controls: an IP address, localhost, or a name
// without dots.
func localName(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return strings.EqualFold(host, "localhost") || !strings.Contains(host, ".")
}

func equalTokens(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// auth answers a request without a valid token with the login page (and
// 401), never with data.
func (s *site) auth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.token == "" && !localName(r.Host) {
			// Without a token (the socket, forwarded to a browser) a
			// page a DNS-rebinding site loads under its own name would
			// read the fleet: only local names are served.
			s.errorPage(w, r, http.StatusForbidden, "without a token the dashboard answers only to an IP address, localhost or a name without dots; log in through a listener with a token")
			return
		}
		if _, ok := s.session(r); !ok {
			s.renderLogin(w, r, http.StatusUnauthorized, "")
			return
		}
		next(w, r)
	})
}

// csrfToken is the session's CSRF token: an HMAC of its API token, so
// it needs no server state and changes with the token.
func (s *site) csrfToken(r *http.Request) string {
	tok, _ := s.session(r)
	m := hmac.New(sha256.New, s.ui.key)
	m.Write([]byte("csrf\x00"))
	m.Write([]byte(tok))
	return hex.EncodeToString(m.Sum(nil))
}

// csrf refuses a state-changing call that does not carry the session's
// CSRF token or that a browser says came from another site.
func (s *site) csrf(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !sameOrigin(r) {
			s.errorPage(w, r, http.StatusForbidden, "cross-site request refused")
			return
		}
		got := r.Header.Get(csrfHeader)
		if got == "" {
			got = r.PostFormValue("csrf")
		}
		want := s.csrfToken(r)
		if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
			s.errorPage(w, r, http.StatusForbidden, "missing or wrong CSRF token: reload the page")
			return
		}
		next(w, r)
	}
}

// sameOrigin is false when the browser reports a cross-site request
// (Sec-Fetch-Site, or an Origin naming another host).
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		_, host, ok := strings.Cut(o, "://")
		return ok && host == r.Host
	}
	return true
}

func (s *site) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.session(r); ok {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	s.renderLogin(w, r, http.StatusOK, "")
}

func (s *site) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		s.renderLogin(w, r, http.StatusForbidden, "cross-site login refused")
		return
	}
	if s.token == "" {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	tok := strings.TrimSpace(r.PostFormValue("token"))
	if tok == "" || !equalTokens(tok, s.token) {
		s.renderLogin(w, r, http.StatusUnauthorized, "wrong token")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: tok, Path: "/ui", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (s *site) logout(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		s.errorPage(w, r, http.StatusForbidden, "cross-site request refused")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/ui", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

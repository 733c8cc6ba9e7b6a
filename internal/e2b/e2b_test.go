package e2b

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// TestHostSandbox: only PORT-ID.DOMAIN with a numeric port and an id of
// [a-z0-9]+ names a sandbox; anything else is REST traffic.
func TestHostSandbox(t *testing.T) {
	for _, c := range []struct{ host, id, port string }{
		{"49983-abc123.warren.example", "abc123", "49983"},
		{"49983-abc123.warren.example:443", "abc123", "49983"},
		{"8080-zz9.local", "zz9", "8080"},
		{"127.0.0.1:3000", "", ""},
		{"api.warren.example", "", ""},
		{"localhost", "", ""},
		{"x1-abc.d", "", ""},
		{"49983-ABC.d", "", ""},
		{"49983-a_b.d", "", ""},
		{"49983-.d", "", ""},
	} {
		id, port := hostSandbox(c.host)
		if id != c.id || port != c.port {
			t.Errorf("hostSandbox(%q) = %q, %q; want %q, %q", c.host, id, port, c.id, c.port)
		}
	}
}

// TestReadKeys: keys are e2b_ and at least 16 lowercase hex digits;
// comments and blank lines are skipped; a file without a key is refused.
func TestReadKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "k")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys, err := ReadKeys(write("# comment\n\ne2b_0123456789abcdef\n  e2b_ffffffffffffffffffff  \n"))
	if err != nil || len(keys) != 2 || keys[1] != "e2b_ffffffffffffffffffff" {
		t.Fatalf("keys %q, %v", keys, err)
	}
	for _, bad := range []string{"", "# only\n", "e2b_0123\n", "e2b_0123456789ABCDEF\n", "key_0123456789abcdef\n"} {
		if _, err := ReadKeys(write(bad)); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("ReadKeys(%q) = %v, want invalid", bad, err)
		}
	}
}

// TestAccessTokens: a sandbox's token is accepted for it only, under any
// configured key (so keys can be rotated), and not for another sandbox.
func TestAccessTokens(t *testing.T) {
	s := &Server{cfg: Config{Keys: []string{"e2b_aaaaaaaaaaaaaaaa", "e2b_bbbbbbbbbbbbbbbb"}}}
	if !s.tokenOK("sb1", s.token("sb1")) {
		t.Error("the issued token is refused")
	}
	if !s.tokenOK("sb1", accessToken("e2b_bbbbbbbbbbbbbbbb", "sb1")) {
		t.Error("a token under the second key is refused")
	}
	for _, bad := range []string{"", s.token("sb2"), accessToken("e2b_cccccccccccccccc", "sb1")} {
		if s.tokenOK("sb1", bad) {
			t.Errorf("token %q accepted for sb1", bad)
		}
	}
	if s.keyOK("") || s.keyOK("e2b_cccccccccccccccc") || !s.keyOK("e2b_bbbbbbbbbbbbbbbb") {
		t.Error("keyOK")
	}
}

// TestListQuery: the SDKs quote metadata keys and values, then
// form-encode them; state is a comma list of running and paused.
func TestListQuery(t *testing.T) {
	inner := url.Values{}
	// As urllib.parse.quote does it: a space is %20.
	inner.Set(url.PathEscape("a b"), url.PathEscape("x&y=z%"))
	inner.Set("run", "7")
	q, err := parseListQuery(url.Values{"metadata": {inner.Encode()}, "state": {"paused"}})
	if err != nil {
		t.Fatal(err)
	}
	if q.metadata["run"] != "7" || len(q.states) != 1 || q.states[0] != "paused" {
		t.Errorf("query %+v", q)
	}
	if q.metadata["a b"] != "x&y=z%" {
		t.Errorf("quoted metadata %+v", q.metadata)
	}
	if _, err := parseListQuery(url.Values{"state": {"running,dead"}}); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Errorf("state dead: %v", err)
	}
}

// TestStatusAndState: error categories map to the statuses the SDKs read,
// and only running and paused sandboxes are visible to E2B.
func TestStatusAndState(t *testing.T) {
	for c, want := range map[error]int{
		errdefs.NotFoundf("x"): http.StatusNotFound, errdefs.Invalidf("x"): http.StatusBadRequest,
		errdefs.Conflictf("x"): http.StatusConflict, errdefs.Exhaustedf("x"): http.StatusTooManyRequests,
		errdefs.Unavailablef("x"): http.StatusServiceUnavailable, errdefs.Internalf("x"): http.StatusInternalServerError,
	} {
		if got := httpStatus(c); got != want {
			t.Errorf("httpStatus(%v) = %d, want %d", c, got, want)
		}
	}
	for st, want := range map[warrenv1.SandboxState]string{
		warrenv1.SandboxState_SANDBOX_STATE_RUNNING: "running", warrenv1.SandboxState_SANDBOX_STATE_PAUSED: "paused",
		warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED: "paused", warrenv1.SandboxState_SANDBOX_STATE_STOPPED: "",
		warrenv1.SandboxState_SANDBOX_STATE_CREATING: "", warrenv1.SandboxState_SANDBOX_STATE_LOST: "",
	} {
		if got := e2bState(st); got != want {
			t.Errorf("e2bState(%v) = %q, want %q", st, got, want)
		}
	}
}

// TestExecUser: the SDKs' Basic user; E2B's default account "user" is
// the sandbox's default user.
func TestExecUser(t *testing.T) {
	for h, want := range map[string]string{"": "", "Basic cm9vdDo=": "root", "Basic dXNlcjo=": "", "Basic bm9ib2R5Og==": "nobody", "Bearer x": ""} {
		hd := http.Header{}
		if h != "" {
			hd.Set("Authorization", h)
		}
		if got := execUser(hd); got != want {
			t.Errorf("execUser(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestNetworkPolicy: E2B's egress settings map onto Warren's policies
// where they can, and are refused (not dropped) where they cannot.
func TestNetworkPolicy(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		name    string
		allow   *bool
		n       *netConfig
		mode    string // "" = nil policy (the node's default)
		rules   []string
		refused bool
	}{
		{name: "unset", mode: ""},
		{name: "internet", allow: &yes, mode: "open"},
		{name: "no internet", allow: &no, mode: "none"},
		{name: "deny all", n: &netConfig{DenyOut: []string{"0.0.0.0/0"}}, mode: "none"},
		{name: "allowlist", n: &netConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"1.2.3.4", "10.0.0.0/8", "pypi.org", "::1"}},
			mode: "allowlist", rules: []string{"1.2.3.4/32", "10.0.0.0/8", "host:pypi.org", "::1/128"}},
		{name: "no internet but", allow: &no, n: &netConfig{AllowOut: []string{"pypi.org"}}, mode: "allowlist", rules: []string{"host:pypi.org"}},
		{name: "allow only", n: &netConfig{AllowOut: []string{"pypi.org"}}, mode: "open"},
		{name: "body says", allow: &no, n: &netConfig{AllowInternetAccess: &yes}, mode: "open"},
		{name: "partial deny", n: &netConfig{DenyOut: []string{"10.0.0.0/8"}}, refused: true},
		{name: "rules", n: &netConfig{Rules: []byte(`{"a.com":[]}`)}, refused: true},
		{name: "dns", n: &netConfig{DNSServers: []string{"8.8.8.8"}}, refused: true},
	} {
		p, err := networkPolicy(c.allow, c.n)
		if c.refused {
			if errdefs.CategoryOf(err) != errdefs.Unsupported {
				t.Errorf("%s: %v, %v; want unsupported", c.name, p, err)
			}
			continue
		}
		if err != nil || p.GetMode() != c.mode {
			t.Errorf("%s: %v, %v; want mode %q", c.name, p, err, c.mode)
			continue
		}
		var rules []string
		for _, r := range p.GetAllow() {
			if r.GetHost() != "" {
				rules = append(rules, "host:"+r.GetHost())
			} else {
				rules = append(rules, r.GetCidr())
			}
		}
		if strings.Join(rules, ",") != strings.Join(c.rules, ",") {
			t.Errorf("%s: rules %v, want %v", c.name, rules, c.rules)
		}
	}
}

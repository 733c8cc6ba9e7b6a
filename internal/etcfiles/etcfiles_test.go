package etcfiles

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/errdefs"
)

func TestCheckHostname(t *testing.T) {
	for _, h := range []string{"a", "box", "r-1", "rollout-42.train", "A1.b2.C3", strings.Repeat("a", 63), strings.Repeat("a.", 31) + "ab"} {
		if err := CheckHostname(h); err != nil {
			t.Errorf("CheckHostname(%q) = %v, want nil", h, err)
		}
	}
	for _, h := range []string{"", "a_b", "-a", "a-", "a..b", ".a", "a.", "a b", "a/b", "ü", "a\x00", strings.Repeat("a", 64), strings.Repeat("a.", 32) + "a"} {
		err := CheckHostname(h)
		if errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("CheckHostname(%q) = %v, want an invalid error", h, err)
		}
	}
}

func TestHostnameFor(t *testing.T) {
	for id, want := range map[string]string{
		"abc":        "abc",
		"run_1":      "run-1",
		"a.b":        "a.b",
		"a..b":       "a--b",
		"a.-b":       "a--b",
		"x_":         "x",
		"abc.":       "abc",
		"0-9_z.q":    "0-9-z.q",
		"a." + "_._": "a",
	} {
		got := HostnameFor(id)
		if got != want {
			t.Errorf("HostnameFor(%q) = %q, want %q", id, got, want)
		}
		if err := CheckHostname(got); err != nil {
			t.Errorf("HostnameFor(%q) = %q, not a hostname: %v", id, got, err)
		}
	}
}

func TestFiles(t *testing.T) {
	fs := Files("web.test", None)
	if len(fs) != len(Names) {
		t.Fatalf("%d files, want %d", len(fs), len(Names))
	}
	byName := map[string]string{}
	for i, f := range fs {
		if f.Name != Names[i] {
			t.Errorf("file %d is %q, want %q", i, f.Name, Names[i])
		}
		byName[f.Name] = string(f.Data)
	}
	for _, line := range []string{"127.0.0.1\tlocalhost\n", "::1\tlocalhost ip6-localhost ip6-loopback\n", "127.0.1.1\tweb.test web\n"} {
		if !strings.Contains(byName["hosts"], line) {
			t.Errorf("hosts lacks %q:\n%s", line, byName["hosts"])
		}
	}
	if byName["hostname"] != "web.test\n" {
		t.Errorf("hostname = %q", byName["hostname"])
	}
	if strings.Contains(byName["resolv.conf"], "\nnameserver") || strings.HasPrefix(byName["resolv.conf"], "nameserver") {
		t.Errorf("resolv.conf of a sandbox without network names a nameserver:\n%s", byName["resolv.conf"])
	}
	if !Unchanged("hosts", []byte(byName["hosts"]), "web.test", None) {
		t.Error("Unchanged(hosts as written) = false")
	}
	if Unchanged("hosts", []byte(byName["hosts"]+"10.0.0.1 db\n"), "web.test", None) || Unchanged("hosts", []byte(byName["hosts"]), "other", None) {
		t.Error("Unchanged of a changed hosts file = true")
	}
}

// TestResolvConf: with a nameserver resolv.conf names it; the zero Addr
// (a sandbox without a network) gives mode none's, as Files writes it.
func TestResolvConf(t *testing.T) {
	gw := netip.MustParseAddr("10.88.0.2")
	if got := string(ResolvConf(gw)); !strings.Contains(got, "\nnameserver 10.88.0.2\n") {
		t.Errorf("ResolvConf(%s) = %q", gw, got)
	}
	none := Files("h", None)[2].Data
	if got := ResolvConf(netip.Addr{}); string(got) != string(none) {
		t.Errorf("ResolvConf(zero) = %q, want mode none's %q", got, none)
	}
	if got := WithNameserver(Files("h", None), netip.Addr{})[2].Data; string(got) != string(none) {
		t.Errorf("WithNameserver(zero) = %q", got)
	}
	if got := WithNameserver(Files("h", None), gw)[2].Data; string(got) != string(ResolvConf(gw)) {
		t.Errorf("WithNameserver(%s) = %q", gw, got)
	}
}

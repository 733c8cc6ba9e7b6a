package netpolicy

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/net/idna"
)

// Name rules: how long an answered address stays allowed. The record's
// TTL, at least MinNameTTL (a record with TTL 0 or 1 would expire
// between the answer and the connect it is for; some clients also cache
// an answer a little longer than its TTL) and at most MaxNameTTL (an
// address the name left is forgotten within the hour, whatever TTL it
// claimed). A connection begun while an address was allowed outlives
// the address: its conntrack entry carries the rule's mark.
const (
	MinNameTTL = 30 * time.Second
	MaxNameTTL = time.Hour
)

// ClampTTL is how long an address answered with ttl stays allowed.
func ClampTTL(ttl time.Duration) time.Duration { return min(max(ttl, MinNameTTL), MaxNameTTL) }

// nameProfile maps a name as a user writes it (Unicode or ASCII, any
// case) to its ASCII form and checks the DNS rules: labels of 1 to 63
// bytes, at most 253 bytes in all, IDNA 2008 code points, hyphens not at
// a label's start or end. Underscores are allowed (_dmarc-style labels
// exist in the wild) though not in a hostname.
var nameProfile = idna.New(idna.MapForLookup(), idna.VerifyDNSLength(true), idna.StrictDomainName(false), idna.BidiRule())

// ParseHost checks a name rule's host and returns it as the resolver
// compares it: lower case ASCII, no trailing dot. "*.example.org" is
// every name under example.org; a '*' anywhere else is refused.
func ParseHost(h string) (string, error) {
	raw := strings.TrimSuffix(h, ".")
	wild := false
	if rest, ok := strings.CutPrefix(raw, "*."); ok {
		raw, wild = rest, true
	}
	if raw == "" {
		return "", fmt.Errorf("host: %q is not a name", h)
	}
	if strings.Contains(raw, "*") {
		return "", fmt.Errorf("host: %q: a '*' only as the whole first label (*.example.org)", h)
	}
	a, err := nameProfile.ToASCII(raw)
	if err != nil {
		return "", fmt.Errorf("host: %q is not a valid DNS name: %v", h, err)
	}
	a = strings.ToLower(a)
	for _, l := range strings.Split(a, ".") {
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("host: %q: label %q has %q (letters, digits, '-', '_')", h, l, c)
			}
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("host: %q: label %q starts or ends with '-'", h, l)
		}
	}
	if !strings.Contains(a, ".") && wild {
		return "", fmt.Errorf("host: %q: a wildcard needs a domain of two labels at least (*.example.org)", h)
	}
	if wild {
		a = "*." + a
	}
	// 253 is the longest name in dotted form (RFC 1035's 255 bytes on
	// the wire); a wildcard's "*." counts as the label it stands for.
	if len(a) > 253 {
		return "", fmt.Errorf("host: %q is %d bytes as ASCII; at most 253", h, len(a))
	}
	return a, nil
}

// HostMatches reports whether name (lower case, no trailing dot) is
// what host (as ParseHost returns it) allows.
func HostMatches(host, name string) bool {
	if suffix, ok := strings.CutPrefix(host, "*"); ok {
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return name == host
}

// Hosts are the hosts of p's name rules that allow name, each once.
func (p Policy) Hosts(name string) []string {
	var out []string
	for _, r := range p.Allow {
		if r.Host != "" && HostMatches(r.Host, name) && !contains(out, r.Host) {
			out = append(out, r.Host)
		}
	}
	return out
}

func contains(s []string, x string) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

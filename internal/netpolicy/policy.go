// Package netpolicy gives sandboxes their network: none (loopback only),
// open (a veth pair into the sandbox's network namespace, an address of
// the node's sandbox subnet, NAT out through the node) or an allowlist of
// destinations. It owns one nftables table per daemon and the host ends
// of the sandboxes' veth pairs, and nothing else on the node.
//
// What every mode but none guarantees, enforced in the forward and input
// hooks of the daemon's table:
//   - nothing addressed to the node itself (any of its addresses: the
//     daemon's TCP API, anything listening on the node) is delivered;
//   - no packet reaches another sandbox, link-local or metadata addresses
//     (169.254.0.0/16, fd00:ec2::254), or leaves over IPv6;
//   - nothing from outside opens a connection into a sandbox;
//   - the policy is checked on every packet, not only a connection's
//     first: a policy change cuts established connections it forbids
//     (TCP gets a reset on the sandbox's next packet).
package netpolicy

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Mode is a sandbox's network mode.
type Mode string

const (
	None      Mode = "none"
	Open      Mode = "open"
	Allowlist Mode = "allowlist"
)

// Policy is what a sandbox may reach. The zero Policy is None.
type Policy struct {
	Mode  Mode   `json:"mode,omitempty"`
	Allow []Rule `json:"allow,omitempty"`
	// Group names the sandbox's group on this node: members reach each
	// other (every port and protocol) whatever their mode, and nothing
	// else reaches them. A member in mode none reaches its group only.
	// Fixed at create.
	Group string `json:"group,omitempty"`
}

// Rule allows one destination: an IPv4 prefix or a host name,
// optionally one port and protocol. A name rule allows the IPv4
// addresses Warren's resolver (internal/resolver) answered the sandbox
// for that name, each for its record's TTL (clamped to MinNameTTL,
// MaxNameTTL).
type Rule struct {
	Prefix netip.Prefix `json:"cidr,omitzero"`
	// Host is a name rule's name, lower case, ASCII (IDNA A-labels),
	// without a trailing dot: "pypi.org" (that name only) or
	// "*.pythonhosted.org" (every name under it, not the name itself).
	Host  string `json:"host,omitempty"`
	Port  uint16 `json:"port,omitempty"`  // 0: every port
	Proto string `json:"proto,omitempty"` // "tcp", "udp"; "": both
}

// IsNone reports whether p gives the sandbox no interface but lo: mode
// none outside any group.
func (p Policy) IsNone() bool { return (p.Mode == "" || p.Mode == None) && p.Group == "" }

// Equal reports whether p and q allow the same.
func (p Policy) Equal(q Policy) bool {
	if p.IsNone() || q.IsNone() {
		return p.IsNone() == q.IsNone()
	}
	return p.Mode == q.Mode && slices.Equal(p.Allow, q.Allow) && p.Group == q.Group
}

// MaxRules bounds an allowlist: each rule is two nftables rules, and a
// policy change rewrites them all in one transaction.
const MaxRules = 256

// Parse validates a policy as the API spells it. Errors are Invalid and
// name the field (field is the policy's own name in the request, e.g.
// "network").
func Parse(field, mode, group string, rules []RuleSpec) (Policy, error) {
	var p Policy
	if group != "" && !groupRE.MatchString(group) {
		return p, errdefs.Invalidf("%s.group: bad group name %q: want [a-z0-9][a-z0-9_.-]{0,62}", field, group)
	}
	p.Group = group
	switch Mode(mode) {
	case "", None:
		p.Mode = None
	case Open:
		p.Mode = Open
	case Allowlist:
		p.Mode = Allowlist
	default:
		return p, errdefs.Invalidf("%s.mode: unknown network mode %q (none, open, allowlist)", field, mode)
	}
	if len(rules) > 0 && p.Mode != Allowlist {
		return p, errdefs.Invalidf("%s.allow: rules need mode allowlist, not %s", field, p.Mode)
	}
	if len(rules) > MaxRules {
		return p, errdefs.Invalidf("%s.allow: %d rules, at most %d", field, len(rules), MaxRules)
	}
	for i, r := range rules {
		rule, err := r.parse()
		if err != nil {
			return Policy{}, errdefs.Invalidf("%s.allow[%d]: %v", field, i, err)
		}
		p.Allow = append(p.Allow, rule)
	}
	return p, nil
}

var groupRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// RuleSpec is a rule as the API spells it.
type RuleSpec struct {
	CIDR    string
	Host    string // a name rule: CIDR empty
	HasPort bool   // a port given; 0 then is invalid, not "every port"
	Port    uint32
	Proto   string
}

func (r RuleSpec) parse() (Rule, error) {
	var out Rule
	switch {
	case r.Host != "" && r.CIDR != "":
		return out, fmt.Errorf("a rule names a cidr or a host, not both (%q, %q)", r.CIDR, r.Host)
	case r.Host != "":
		h, err := ParseHost(r.Host)
		if err != nil {
			return out, err
		}
		out.Host = h
		return out, r.portProto(&out)
	}
	pfx, err := netip.ParsePrefix(r.CIDR)
	if err != nil {
		a, aerr := netip.ParseAddr(r.CIDR)
		if aerr != nil {
			return out, fmt.Errorf("cidr: %q is neither a CIDR nor an address", r.CIDR)
		}
		pfx = netip.PrefixFrom(a, a.BitLen())
	}
	if !pfx.Addr().Is4() {
		// Sandboxes have no IPv6 address: an IPv6 rule would allow nothing.
		return out, fmt.Errorf("cidr: %q is not IPv4 (sandboxes have IPv4 only)", r.CIDR)
	}
	out.Prefix = pfx.Masked()
	return out, r.portProto(&out)
}

func (r RuleSpec) portProto(out *Rule) error {
	if r.HasPort && (r.Port == 0 || r.Port > 65535) {
		return fmt.Errorf("port: %d is out of range (1-65535; leave it unset for every port)", r.Port)
	}
	out.Port = uint16(r.Port)
	switch r.Proto {
	case "", "tcp", "udp":
		out.Proto = r.Proto
	default:
		return fmt.Errorf("protocol: %q (tcp, udp, or empty for both)", r.Proto)
	}
	return nil
}

// String is the policy as the CLI spells it: none, open, or
// allow:CIDR[:PORT[/PROTO]],... (the group is apart: --network-group).
func (p Policy) String() string {
	if p.Mode == "" || p.Mode == None {
		return string(None)
	}
	if p.Mode == Open {
		return string(Open)
	}
	parts := make([]string, len(p.Allow))
	for i, r := range p.Allow {
		parts[i] = r.String()
	}
	return "allow:" + strings.Join(parts, ",")
}

func (r Rule) String() string {
	s := r.Host
	if s == "" {
		s = r.Prefix.String()
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	if r.Proto != "" {
		s += "/" + r.Proto
	}
	return s
}

// ParseFlag reads the CLI's spelling (String's): "none", "open", or
// "allow:CIDR[:PORT][/PROTO],...", into the API's mode and rules.
// "allow:" alone is an allowlist that allows nothing.
func ParseFlag(s string) (mode string, rules []RuleSpec, err error) {
	switch s {
	case "none", "open", "allowlist":
		return s, nil, nil
	}
	list, ok := strings.CutPrefix(s, "allow:")
	if !ok {
		return "", nil, fmt.Errorf("network %q: want none, open or allow:RULE,... (RULE: CIDR or HOST, then [:PORT][/PROTO])", s)
	}
	for item := range strings.SplitSeq(list, ",") {
		if item == "" {
			continue
		}
		var r RuleSpec
		// The CIDR has a '/' too: only a protocol name after the last
		// one is a protocol.
		if i := strings.LastIndexByte(item, '/'); i >= 0 {
			if pr := item[i+1:]; pr != "" && (pr[0] < '0' || pr[0] > '9') {
				item, r.Proto = item[:i], pr
			}
		}
		// An IPv4 CIDR or a name has no ':'; the one there is the port's.
		cidr, port, hasPort := strings.Cut(item, ":")
		if isName(cidr) {
			r.Host = cidr
		} else {
			r.CIDR = cidr
		}
		if hasPort {
			n, err := strconv.ParseUint(port, 10, 31)
			if err != nil {
				return "", nil, fmt.Errorf("network %q: bad port %q", s, port)
			}
			r.Port, r.HasPort = uint32(n), true
		}
		rules = append(rules, r)
	}
	return "allowlist", rules, nil
}

// isName tells a host rule's name from a CIDR or address in the CLI's
// spelling: an address starts with a digit and has no letter; a name
// has a letter or a '*'.
func isName(s string) bool {
	return strings.ContainsFunc(s, func(c rune) bool { return c == '*' || c > '9' && c != '/' && c != '.' })
}

// Allows reports whether p lets the sandbox reach addr:port over proto
// ("tcp", "udp"), as the sandbox's CIDR rules decide it (name rules
// allow what the resolver answered: Node.Cut asks it).
func (p Policy) Allows(addr netip.Addr, port uint16, proto string) bool {
	switch p.Mode {
	case Open:
		return addr.Is4()
	case Allowlist:
		for _, r := range p.Allow {
			if r.Prefix.Contains(addr) && (r.Port == 0 || r.Port == port) && (r.Proto == "" || r.Proto == proto) {
				return true
			}
		}
	}
	return false
}

package daemon

import (
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/netpolicy"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// networkPolicy validates a request's network policy (nil: mode none).
// Errors are Invalid and name the field.
func networkPolicy(field string, p *warrenv1.NetworkPolicy) (netpolicy.Policy, error) {
	if p == nil {
		return netpolicy.Policy{Mode: netpolicy.None}, nil
	}
	rules := make([]netpolicy.RuleSpec, len(p.GetAllow()))
	for i, r := range p.GetAllow() {
		rules[i] = netpolicy.RuleSpec{CIDR: r.GetCidr(), Host: r.GetHost(), HasPort: r.Port != nil, Port: r.GetPort(), Proto: r.GetProtocol()}
	}
	return netpolicy.Parse(field, p.GetMode(), p.GetGroup(), rules)
}

// networkProto is a policy as the API shows it: nil for mode none.
func networkProto(p netpolicy.Policy) *warrenv1.NetworkPolicy {
	if p.IsNone() {
		return nil
	}
	out := &warrenv1.NetworkPolicy{Mode: string(p.Mode), Group: p.Group}
	if out.Mode == "" {
		out.Mode = string(netpolicy.None)
	}
	for _, r := range p.Allow {
		pr := &warrenv1.NetworkRule{Host: r.Host, Protocol: r.Proto}
		if r.Host == "" {
			pr.Cidr = r.Prefix.String()
		}
		if r.Port != 0 {
			port := uint32(r.Port)
			pr.Port = &port
		}
		out.Allow = append(out.Allow, pr)
	}
	return out
}

// networkAddress is a sandbox's address on the node's sandbox subnet, ""
// without one.
func networkAddress(sb backend.Sandbox) string {
	if n, ok := sb.(backend.Networked); ok {
		return n.NetworkAddress()
	}
	return ""
}

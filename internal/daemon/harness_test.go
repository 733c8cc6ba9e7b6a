package daemon

import (
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// A harness's child may not be contained less tightly than the harness:
// no wider network, no setuid the harness lacks, no leaving the user
// namespace, and never a network group.
func TestCheckChild(t *testing.T) {
	port := uint32(443)
	allow := func(rules ...*warrenv1.NetworkRule) *warrenv1.NetworkPolicy {
		return &warrenv1.NetworkPolicy{Mode: "allowlist", Allow: rules}
	}
	pypi := &warrenv1.NetworkRule{Host: "pypi.org", Port: &port, Protocol: "tcp"}
	cidr := &warrenv1.NetworkRule{Cidr: "10.9.0.0/16"}
	cases := []struct {
		name          string
		parent, child *warrenv1.NetworkPolicy
		setuid        bool
		parentSetuid  bool
		userNS        bool
		parentUserNS  bool
		ok            bool
	}{
		{name: "none under none", ok: true},
		{name: "open under none", child: &warrenv1.NetworkPolicy{Mode: "open"}},
		{name: "allowlist under none", child: allow(pypi)},
		{name: "anything under open", parent: &warrenv1.NetworkPolicy{Mode: "open"}, child: allow(cidr), ok: true},
		{name: "subset of the allowlist", parent: allow(pypi, cidr), child: allow(cidr), ok: true},
		{name: "rule outside the allowlist", parent: allow(pypi), child: allow(cidr)},
		{name: "open under allowlist", parent: allow(pypi), child: &warrenv1.NetworkPolicy{Mode: "open"}},
		{name: "group under open", parent: &warrenv1.NetworkPolicy{Mode: "open"}, child: &warrenv1.NetworkPolicy{Mode: "none", Group: "g"}},
		{name: "setuid without the harness's", setuid: true},
		{name: "setuid with the harness's", setuid: true, parentSetuid: true, ok: true},
		{name: "out of the harness's user namespace", parentUserNS: true},
		{name: "in a user namespace under a harness without", userNS: true, ok: true},
	}
	for _, c := range cases {
		parent := &warrenv1.Sandbox{Id: "h", Network: c.parent, AllowSetuid: c.parentSetuid, UserNamespace: c.parentUserNS}
		net, err := networkPolicy("network", c.child)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		err = checkChild(parent, net, c.setuid, c.userNS)
		if c.ok != (err == nil) || (err != nil && errdefs.CategoryOf(err) != errdefs.PermissionDenied) {
			t.Errorf("%s: %v, want ok %v (else permission_denied)", c.name, err, c.ok)
		}
	}
}

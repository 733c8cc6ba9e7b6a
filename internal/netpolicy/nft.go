package netpolicy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// firewall is the daemon's nftables table (family inet):
//
//	chain prerouting (nat, dstnat) iifname "<prefix>*" ip daddr <subnet> udp/tcp dport 53
//	                              redirect to :<resolver port>  (with a resolver)
//	chain input    (hook input)   iifname "<prefix>*" ct status dnat th dport <resolver port> accept
//	                              iifname != "<prefix>*" th dport <resolver port> drop
//	                              iifname "<prefix>*" reject
//	chain forward  (hook forward) iifname "<prefix>*" jump egress
//	                              oifname "<prefix>*" jump ingress
//	chain egress   ip saddr @g-<group> ip daddr @g-<group> accept (one per group)
//	               other sandboxes, IPv6, 169.254.0.0/16: reject;
//	               iifname vmap @out; reject
//	chain ingress  oifname vmap @in; drop
//	chain postrouting (nat)       ip saddr <subnet> oifname != "<prefix>*" masquerade
//	map out, in    ifname : verdict (jump sb-<id>-out / sb-<id>-in)
//	chain sb-<id>-out  the sandbox's policy on what it sends, every packet
//	chain sb-<id>-in   the same on what it receives (replies only)
//	set g-<group>  the addresses of a group's members
//	set sb-<id>-n<hash of host>  addresses the resolver answered sandbox
//	               <id> for a name rule's host, each with the timeout of
//	               its record's TTL; the rule accepting them sets the
//	               connection's ct mark to the host's, and a connection
//	               so marked stays accepted after its address expires
//
// Only sandboxes' own traffic (by the daemon's interface name prefix)
// enters the table's rules; every base chain's policy is accept, so the
// node's other traffic is left to whatever else filters it. A sandbox's
// state is two chains and two map elements, keyed by its id (chains)
// and interface (elements): what Sweep finds without any other record.
type firewall struct {
	table  *nftables.Table
	prefix string // of the host ends' interface names
	subnet netip.Prefix
	// logGroup is the NFLOG group every refused packet is logged to
	// (at most logRate a second per rule) before it is refused: the
	// daemon turns them into events of the sandbox that sent them.
	logGroup uint16

	// dnsPort is the daemon's resolver's port (0: none): sandboxes' DNS
	// to their gateway is redirected to it.
	dnsPort uint16

	mu    sync.Mutex // one batch at a time on conn
	conn  *nftables.Conn
	ready bool // base chains written by this process
}

const groupPrefix = "g-"

func groupSet(group string) string { return groupPrefix + group }

func (f *firewall) ipSet(name string) *nftables.Set {
	return &nftables.Set{Table: f.table, Name: name, KeyType: nftables.TypeIPAddr}
}

// groupRule lets members of set name reach each other: ip saddr @name ip
// daddr @name accept.
func groupRule(set *nftables.Set) []expr.Any {
	lookup := func(off uint32) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		}
	}
	out := []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
	out = append(out, lookup(12)...)
	out = append(out, lookup(16)...)
	return append(out, &expr.Verdict{Kind: expr.VerdictAccept})
}

const (
	mapOut = "out"
	mapIn  = "in"
)

func chainOut(id string) string { return "sb-" + id + "-out" }
func chainIn(id string) string  { return "sb-" + id + "-in" }

// idOfChain is the sandbox id of a per-sandbox chain name.
func idOfChain(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "sb-")
	if !ok {
		return "", false
	}
	if id, ok := strings.CutSuffix(rest, "-out"); ok {
		return id, true
	}
	if id, ok := strings.CutSuffix(rest, "-in"); ok {
		return id, true
	}
	return "", false
}

func newFirewall(table, prefix string, subnet netip.Prefix, logGroup uint16) *firewall {
	return &firewall{table: &nftables.Table{Family: nftables.TableFamilyINet, Name: table}, prefix: prefix, subnet: subnet, logGroup: logGroup}
}

func (f *firewall) connLocked() (*nftables.Conn, error) {
	if f.conn == nil {
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return nil, fmt.Errorf("nftables: %w", err)
		}
		f.conn = c
	}
	return f.conn, nil
}

func (f *firewall) chain(name string) *nftables.Chain {
	return &nftables.Chain{Table: f.table, Name: name}
}

func (f *firewall) verdictMap(name string) *nftables.Set {
	return &nftables.Set{Table: f.table, Name: name, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
}

// ensureLocked writes the table, its maps and base chains (once per
// process: a restarted daemon rewrites the base chains in one
// transaction, keeping the sandboxes' chains and map elements).
func (f *firewall) ensureLocked() (*nftables.Conn, error) {
	c, err := f.connLocked()
	if err != nil {
		return nil, err
	}
	if f.ready {
		return c, nil
	}
	if err := enableForwarding(); err != nil {
		return nil, err
	}
	c.AddTable(f.table)
	accept := nftables.ChainPolicyAccept
	base := []*nftables.Chain{
		{Table: f.table, Name: "input", Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Table: f.table, Name: "forward", Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Table: f.table, Name: "postrouting", Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept},
		{Table: f.table, Name: "prerouting", Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept},
		{Table: f.table, Name: "egress"},
		{Table: f.table, Name: "ingress"},
	}
	for _, ch := range base {
		c.AddChain(ch)
		c.FlushChain(ch)
	}
	sets, _ := c.GetSets(f.table) // none when the table is new
	for _, name := range []string{mapOut, mapIn} {
		if !hasSet(sets, name) {
			if err := c.AddSet(f.verdictMap(name), nil); err != nil {
				return nil, fmt.Errorf("nftables map %s: %w", name, err)
			}
		}
	}
	add := func(chain string, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: f.table, Chain: f.chain(chain), Exprs: exprs})
	}
	reject := func(chain string, match ...expr.Any) {
		for _, r := range f.rejectRules(match) {
			add(chain, r...)
		}
	}
	// Groups first: members reach each other before anything below
	// rejects sandbox-to-sandbox traffic.
	for _, set := range sets {
		if strings.HasPrefix(set.Name, groupPrefix) {
			add("egress", groupRule(set)...)
		}
	}
	in, out := ifnamePrefix(expr.MetaKeyIIFNAME, f.prefix, true), ifnamePrefix(expr.MetaKeyOIFNAME, f.prefix, true)
	if f.dnsPort != 0 {
		f.resolverRulesLocked(add, in)
	}
	// Nothing from a sandbox is for the node: not its API, not anything
	// listening on any of its addresses.
	reject("input", in...)
	add("forward", append(in, jump("egress"))...)
	add("forward", append(out, jump("ingress"))...)
	// Never another sandbox, whatever its policy.
	reject("egress", out...)
	// Sandboxes have IPv4 only; fd00:ec2::254 and any other IPv6
	// destination stay out of reach.
	add("egress", &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}}, &expr.Verdict{Kind: expr.VerdictDrop})
	reject("egress", ipMatch(false, netip.MustParsePrefix("169.254.0.0/16"))...)
	add("egress", vmap(expr.MetaKeyIIFNAME, mapOut)...)
	reject("egress")
	add("ingress", vmap(expr.MetaKeyOIFNAME, mapIn)...)
	add("ingress", &expr.Verdict{Kind: expr.VerdictDrop})
	add("postrouting", append(append(ipMatch(true, f.subnet), ifnamePrefix(expr.MetaKeyOIFNAME, f.prefix, false)...), &expr.Masq{})...)
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables table %s: %w", f.table.Name, err)
	}
	f.ready = true
	return c, nil
}

// resolverRulesLocked queues the rules that take a sandbox's DNS to the
// resolver: its queries to any gateway (they are all the node's) are
// redirected to the resolver's port on the gateway of the interface they
// came in on, and the input hook accepts a sandbox's packet to that port
// only when conntrack says it was so redirected: the resolver's socket
// is the one thing on the node a sandbox reaches, at port 53 only. Off
// the sandboxes' interfaces the port is dropped: the socket listens on
// every address of the node, and answers sandboxes only.
func (f *firewall) resolverRulesLocked(add func(chain string, exprs ...expr.Any), in []expr.Any) {
	port := binaryutil.BigEndian.PutUint16(f.dnsPort)
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		l4 := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}}}
		dport := func(p []byte) []expr.Any {
			return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p}}
		}
		var r []expr.Any
		r = append(r, in...)
		r = append(r, ipMatch(false, f.subnet)...)
		r = append(r, l4...)
		r = append(r, dport(binaryutil.BigEndian.PutUint16(53))...)
		r = append(r, &expr.Immediate{Register: 1, Data: port}, &expr.Redir{RegisterProtoMin: 1})
		add("prerouting", r...)
		r = append(append(append([]expr.Any{}, in...), l4...), dport(port)...)
		r = append(r, &expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(ctStatusDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Verdict{Kind: expr.VerdictAccept})
		add("input", r...)
		r = append(append(ifnamePrefix(expr.MetaKeyIIFNAME, f.prefix, false), l4...), dport(port)...)
		add("input", append(r, &expr.Verdict{Kind: expr.VerdictDrop})...)
	}
}

// ctStatusDstNAT is IPS_DST_NAT (linux/netfilter/nf_conntrack_common.h).
const ctStatusDstNAT = 1 << 5

func hasSet(sets []*nftables.Set, name string) bool {
	for _, s := range sets {
		if s.Name == name {
			return true
		}
	}
	return false
}

// add writes sandbox id's chains with policy p and maps its interface
// to them, in one transaction. A table someone removed since this
// process wrote it is written again, once.
func (f *firewall) add(id, ifname string, p Policy, addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	wasReady := f.ready
	err := f.addLocked(id, ifname, p, addr)
	if err != nil && wasReady {
		err = f.addLocked(id, ifname, p, addr)
	}
	return err
}

func (f *firewall) addLocked(id, ifname string, p Policy, addr netip.Addr) error {
	c, err := f.ensureLocked()
	if err != nil {
		return err
	}
	if p.Group != "" {
		set, err := c.GetSetByName(f.table, groupSet(p.Group))
		if err != nil {
			// The group's first member: its set, and its rule at the
			// head of egress.
			set = f.ipSet(groupSet(p.Group))
			if err := c.AddSet(set, nil); err != nil {
				return err
			}
			c.InsertRule(&nftables.Rule{Table: f.table, Chain: f.chain("egress"), Exprs: groupRule(set)})
		}
		a4 := addr.As4()
		if err := c.SetAddElements(set, []nftables.SetElement{{Key: a4[:]}}); err != nil {
			return err
		}
	}
	o, i := c.AddChain(f.chain(chainOut(id))), c.AddChain(f.chain(chainIn(id)))
	sets, err := f.nameSetsLocked(c, id, p, nil)
	if err != nil {
		return err
	}
	f.policyRulesLocked(c, id, o, i, p, sets)
	key := ifnameKey(ifname)
	if err := c.SetAddElements(f.verdictMap(mapOut), []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: o.Name}}}); err != nil {
		return err
	}
	if err := c.SetAddElements(f.verdictMap(mapIn), []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: i.Name}}}); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		f.ready = false // the table may have been removed under us: rewrite it next time
		return fmt.Errorf("nftables rules of sandbox %s: %w", id, err)
	}
	return nil
}

// set replaces sandbox id's rules with policy p in one transaction: the
// kernel switches from the old rules to the new between two packets.
func (f *firewall) set(id string, p Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.ensureLocked()
	if err != nil {
		return err
	}
	o, i := f.chain(chainOut(id)), f.chain(chainIn(id))
	have, err := f.listNameSetsLocked(c, id)
	if err != nil {
		return err
	}
	c.FlushChain(o)
	c.FlushChain(i)
	sets, err := f.nameSetsLocked(c, id, p, have)
	if err != nil {
		return err
	}
	f.policyRulesLocked(c, id, o, i, p, sets)
	// The sets of hosts p no longer names go with their elements, after
	// the rules that used them.
	for name, set := range have {
		if _, ok := sets[name]; !ok {
			c.DelSet(set)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables rules of sandbox %s: %w", id, err)
	}
	return nil
}

// nameSet names the set of sandbox id's addresses for host.
func nameSet(id, host string) string {
	h := fnv.New64a()
	h.Write([]byte(host))
	return fmt.Sprintf("sb-%s-n%016x", id, h.Sum64())
}

// idOfNameSet is the sandbox id of a name set's name.
func idOfNameSet(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "sb-")
	if !ok || len(rest) < 19 || rest[len(rest)-18:len(rest)-16] != "-n" {
		return "", false
	}
	return rest[:len(rest)-18], true
}

// nameMark is the ct mark of sandbox id's connections its rule for host
// accepted: never 0 (unmarked).
func nameMark(id, host string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(id + "\x00" + host))
	return h.Sum32() | 1
}

func (f *firewall) timeoutSet(name string) *nftables.Set {
	return &nftables.Set{Table: f.table, Name: name, KeyType: nftables.TypeIPAddr, HasTimeout: true}
}

// listNameSetsLocked lists sandbox id's name sets by name.
func (f *firewall) listNameSetsLocked(c *nftables.Conn, id string) (map[string]*nftables.Set, error) {
	all, err := c.GetSets(f.table)
	if err != nil {
		return nil, fmt.Errorf("list nftables sets: %w", err)
	}
	out := map[string]*nftables.Set{}
	for _, s := range all {
		if got, ok := idOfNameSet(s.Name); ok && got == id {
			out[s.Name] = s
		}
	}
	return out, nil
}

// nameSetsLocked returns the sets of p's name rules by set name: those
// in have (kept with their elements), the others queued to be made.
func (f *firewall) nameSetsLocked(c *nftables.Conn, id string, p Policy, have map[string]*nftables.Set) (map[string]*nftables.Set, error) {
	out := map[string]*nftables.Set{}
	for _, r := range p.Allow {
		if r.Host == "" {
			continue
		}
		name := nameSet(id, r.Host)
		if _, ok := out[name]; ok {
			continue
		}
		if s, ok := have[name]; ok {
			out[name] = s
			continue
		}
		s := f.timeoutSet(name)
		if err := c.AddSet(s, nil); err != nil {
			return nil, fmt.Errorf("nftables set %s: %w", name, err)
		}
		out[name] = s
	}
	return out, nil
}

// allowResolved adds addrs to sandbox id's sets of hosts, for ttl.
func (f *firewall) allowResolved(id string, hosts []string, addrs []netip.Addr, ttl time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.connLocked()
	if err != nil {
		return err
	}
	elems := make([]nftables.SetElement, 0, len(addrs))
	for _, a := range addrs {
		b := a.As4()
		elems = append(elems, nftables.SetElement{Key: b[:], Timeout: ttl})
	}
	for _, h := range hosts {
		if err := c.SetAddElements(f.timeoutSet(nameSet(id, h)), elems); err != nil {
			return err
		}
	}
	return c.Flush()
}

// resolved lists the addresses sandbox id's set for host holds (none
// without the set).
func (f *firewall) resolved(id, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.connLocked()
	if err != nil {
		return nil, err
	}
	set, err := c.GetSetByName(f.table, nameSet(id, host))
	if err != nil {
		return nil, nil
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, e := range elems {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			out = append(out, a)
		}
	}
	return out, nil
}

// policyRulesLocked queues the rules of p into the (empty) chains o and
// i; sets are p's name sets by name.
func (f *firewall) policyRulesLocked(c *nftables.Conn, id string, o, i *nftables.Chain, p Policy, sets map[string]*nftables.Set) {
	add := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: exprs})
	}
	established := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	switch p.Mode {
	case Open:
		add(o, accept)
		add(i, append(established, accept)...)
	case Allowlist:
		marked := map[string]bool{}
		for _, r := range p.Allow {
			if r.Host != "" {
				f.nameRulesLocked(add, o, i, r, id, sets[nameSet(id, r.Host)], established, !marked[r.Host])
				marked[r.Host] = true
				continue
			}
			for _, m := range ruleMatches(r, false) {
				add(o, append(m, accept)...)
			}
			// Replies come from where the sandbox was allowed to go.
			for _, m := range ruleMatches(r, true) {
				add(i, append(append(m, established...), accept)...)
			}
		}
	}
	for _, r := range f.rejectRules(nil) {
		add(o, r...)
	}
	add(i, &expr.Verdict{Kind: expr.VerdictDrop})
}

// nameRulesLocked queues name rule r's rules: a packet to an address
// of its set (and its port and protocol) is accepted and its connection
// marked with the host's mark; with first (once per host), a marked
// connection's packets both ways are accepted while it lasts, so that
// an address expiring mid-download does not cut the download. A policy
// without the host has no rule for its mark: the connection's next
// packet is refused (and a TCP one aborted by Cut).
func (f *firewall) nameRulesLocked(add func(*nftables.Chain, ...expr.Any), o, i *nftables.Chain, r Rule, id string, set *nftables.Set, established []expr.Any, first bool) {
	mark := binaryutil.NativeEndian.PutUint32(nameMark(id, r.Host))
	lookup := []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID}}
	setMark := []expr.Any{&expr.Immediate{Register: 1, Data: mark},
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true},
		&expr.Verdict{Kind: expr.VerdictAccept}}
	for _, m := range ruleMatches(Rule{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Port: r.Port, Proto: r.Proto}, false) {
		add(o, append(append(append([]expr.Any{}, lookup...), m...), setMark...)...)
	}
	if !first {
		return
	}
	marked := append([]expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: mark}}, established...)
	add(o, append(append([]expr.Any{}, marked...), &expr.Verdict{Kind: expr.VerdictAccept})...)
	add(i, append(append([]expr.Any{}, marked...), &expr.Verdict{Kind: expr.VerdictAccept})...)
}

// ruleMatches are the expressions matching r: of the destination on the
// way out, of the source on the way back. One list per protocol when a
// port is named without one.
func ruleMatches(r Rule, reply bool) [][]expr.Any {
	addr := ipMatch(reply, r.Prefix)
	if r.Port == 0 && r.Proto == "" {
		return [][]expr.Any{addr}
	}
	protos := []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP}
	switch r.Proto {
	case "tcp":
		protos = protos[:1]
	case "udp":
		protos = protos[1:]
	}
	var out [][]expr.Any
	for _, pr := range protos {
		m := append([]expr.Any{}, addr...)
		m = append(m, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{pr}})
		if r.Port != 0 {
			off := uint32(2) // destination port
			if reply {
				off = 0
			}
			m = append(m, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(r.Port)})
		}
		out = append(out, m)
	}
	return out
}

// remove deletes sandbox id's chains and map elements, whichever of them
// exist (a create that failed halfway, a second call).
func (f *firewall) remove(id, ifname string, p Policy, addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.connLocked()
	if err != nil {
		return err
	}
	if group := p.Group; group != "" {
		if err := f.leaveGroupLocked(c, group, func(a netip.Addr) bool { return a == addr }); err != nil {
			return err
		}
	}
	// The common case in one transaction; if any part is missing the
	// kernel refuses it whole, and the listing below deletes what is left.
	if ifname != "" {
		f.queueRemoveLocked(c, id, ifname, true, true, true)
		seen := map[string]bool{}
		for _, r := range p.Allow {
			if r.Host != "" && !seen[r.Host] {
				seen[r.Host] = true
				c.DelSet(f.timeoutSet(nameSet(id, r.Host)))
			}
		}
		if err := c.Flush(); err == nil {
			return nil
		}
	}
	return f.removeListedLocked(c, func(x string) bool { return x == id })
}

// leaveGroupLocked deletes the addresses gone says from group's set, and
// the set and its rule once no member is left. No set: nothing to do.
func (f *firewall) leaveGroupLocked(c *nftables.Conn, group string, gone func(netip.Addr) bool) error {
	set, err := c.GetSetByName(f.table, groupSet(group))
	if err != nil {
		return nil
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		return fmt.Errorf("list group %s: %w", group, err)
	}
	var del []nftables.SetElement
	for _, e := range elems {
		if a, ok := netip.AddrFromSlice(e.Key); ok && gone(a) {
			del = append(del, nftables.SetElement{Key: e.Key})
		}
	}
	if len(del) < len(elems) {
		if len(del) == 0 {
			return nil
		}
		if err := c.SetDeleteElements(set, del); err != nil {
			return err
		}
		return c.Flush()
	}
	// The last member: the rule goes, then the set.
	rules, err := c.GetRules(f.table, f.chain("egress"))
	if err != nil {
		return fmt.Errorf("list egress rules: %w", err)
	}
	for _, r := range rules {
		if usesSet(r, set.Name) {
			if err := c.DelRule(r); err != nil {
				return err
			}
		}
	}
	c.DelSet(set)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove group %s: %w", group, err)
	}
	return nil
}

func usesSet(r *nftables.Rule, name string) bool {
	for _, e := range r.Exprs {
		if l, ok := e.(*expr.Lookup); ok && l.SetName == name {
			return true
		}
	}
	return false
}

// groups lists the daemon's groups with their members' addresses.
func (f *firewall) groupsLocked(c *nftables.Conn) (map[string][]netip.Addr, error) {
	sets, err := c.GetSets(f.table)
	if err != nil {
		return nil, nil // no table
	}
	out := map[string][]netip.Addr{}
	for _, s := range sets {
		g, ok := strings.CutPrefix(s.Name, groupPrefix)
		if !ok {
			continue
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, err
		}
		out[g] = nil
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				out[g] = append(out[g], a)
			}
		}
	}
	return out, nil
}

func (f *firewall) groups() (map[string][]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.connLocked()
	if err != nil {
		return nil, err
	}
	return f.groupsLocked(c)
}

func (f *firewall) queueRemoveLocked(c *nftables.Conn, id, ifname string, elems, out, in bool) {
	if elems {
		key := []nftables.SetElement{{Key: ifnameKey(ifname)}}
		_ = c.SetDeleteElements(f.verdictMap(mapOut), key)
		_ = c.SetDeleteElements(f.verdictMap(mapIn), key)
	}
	if out {
		c.DelChain(f.chain(chainOut(id)))
	}
	if in {
		c.DelChain(f.chain(chainIn(id)))
	}
}

// removeListedLocked deletes the chains and map elements of every
// sandbox the kernel lists whose id gone says. No table: nothing to do.
func (f *firewall) removeListedLocked(c *nftables.Conn, gone func(id string) bool) error {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("list nftables chains: %w", err)
	}
	n := 0
	for _, name := range []string{mapOut, mapIn} {
		s, err := c.GetSetByName(f.table, name)
		if err != nil {
			continue
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("list nftables map %s: %w", name, err)
		}
		var del []nftables.SetElement
		for _, e := range elems {
			if id, ok := idOfChain(verdictChain(e)); ok && gone(id) {
				del = append(del, nftables.SetElement{Key: e.Key})
			}
		}
		if len(del) > 0 {
			if err := c.SetDeleteElements(s, del); err != nil {
				return err
			}
			n++
		}
	}
	for _, ch := range chains {
		if ch.Table.Name != f.table.Name {
			continue
		}
		if id, ok := idOfChain(ch.Name); ok && gone(id) {
			c.DelChain(f.chain(ch.Name))
			n++
		}
	}
	// Name sets after the chains whose rules use them.
	sets, _ := c.GetSets(f.table)
	for _, s := range sets {
		if id, ok := idOfNameSet(s.Name); ok && gone(id) {
			c.DelSet(s)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete nftables state: %w", err)
	}
	return nil
}

// sweep deletes the chains and elements of every sandbox not in keep
// (nil keeps none), and from groups every address not in kept.
func (f *firewall) sweep(keep map[string]bool, kept map[netip.Addr]bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.connLocked()
	if err != nil {
		return err
	}
	groups, err := f.groupsLocked(c)
	if err != nil {
		return err
	}
	var errs []error
	for g := range groups {
		errs = append(errs, f.leaveGroupLocked(c, g, func(a netip.Addr) bool { return !kept[a] }))
	}
	errs = append(errs, f.removeListedLocked(c, func(id string) bool { return !keep[id] }))
	return errors.Join(errs...)
}

// sandboxes lists the ids that have chains in the table (tests, leak
// checks).
func (f *firewall) sandboxes() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.connLocked()
	if err != nil {
		return nil, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var ids []string
	for _, ch := range chains {
		if id, ok := idOfChain(ch.Name); ok && ch.Table.Name == f.table.Name && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	// A name set left behind counts as the sandbox's state too.
	sets, _ := c.GetSets(f.table)
	for _, s := range sets {
		if id, ok := idOfNameSet(s.Name); ok && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// removeTable deletes the table, if there is one.
func (f *firewall) removeTable() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.connLocked()
	if err != nil {
		return err
	}
	f.ready = false
	if t, err := c.ListTableOfFamily(f.table.Name, nftables.TableFamilyINet); err != nil || t == nil {
		return nil
	}
	c.DelTable(f.table)
	return c.Flush()
}

// close lets go of the netlink socket.
func (f *firewall) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == nil {
		return nil
	}
	c := f.conn
	f.conn, f.ready = nil, false
	return c.CloseLasting()
}

func ifnameKey(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// ifnamePrefix matches interface names starting with prefix (nft's
// `iifname "prefix*"`: a compare of only the prefix's bytes), or, with eq
// false, those that do not.
func ifnamePrefix(key expr.MetaKey, prefix string, eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: []byte(prefix)}}
}

// ipMatch matches IPv4 packets whose destination (source, with src set)
// is in p.
func ipMatch(src bool, p netip.Prefix) []expr.Any {
	off := uint32(16)
	if src {
		off = 12
	}
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	net := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
	}
}

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

// vmap looks the packet's interface name up in a verdict map: a hit is
// the element's verdict (the verdict register, 0), a miss falls through.
func vmap(key expr.MetaKey, set string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: set, IsDestRegSet: true, DestRegister: 0}}
}

// rejectRules are two rules rejecting what match matches: TCP with a
// reset, everything else with ICMP "administratively prohibited". A
// refused connection fails at once instead of timing out, and one the
// policy no longer allows sees ECONNRESET on the sandbox's next packet.
// Logging of refused packets: a rate per rule (node-wide, so that a
// flood costs the daemon a bounded number of events), and how much of a
// packet to copy (the IP and transport headers).
const (
	logRate  = 100
	logBurst = 20
	logSnap  = 64
)

// rejectRules refuse what match matches: a TCP reset, or ICMP
// administratively prohibited; first, a rule that logs it (rate-limited)
// to the firewall's NFLOG group.
func (f *firewall) rejectRules(match []expr.Any) [][]expr.Any {
	var out [][]expr.Any
	if f.logGroup != 0 {
		out = append(out, append(append([]expr.Any{}, match...),
			&expr.Limit{Type: expr.LimitTypePkts, Rate: logRate, Unit: expr.LimitTimeSecond, Burst: logBurst},
			&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_SNAPLEN | 1<<unix.NFTA_LOG_QTHRESHOLD,
				Group: f.logGroup, Snaplen: logSnap, QThreshold: 1}))
	}
	tcp := append(append([]expr.Any{}, match...),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	other := append(append([]expr.Any{}, match...),
		&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
	return append(out, tcp, other)
}

// enableForwarding turns on IPv4 forwarding, which sandboxes' traffic
// needs to leave the node. It is node-wide: on a node with several
// interfaces, routing between them is then up to the node's own firewall
// (docs/SECURITY.md).
func enableForwarding() error {
	const p = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(p)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	return nil
}

// verdictChain is the chain a listed verdict map element jumps to: the
// library returns the verdict undecoded, as the attributes of
// NFTA_DATA_VERDICT (code, then chain name).
func verdictChain(e nftables.SetElement) string {
	if e.VerdictData != nil {
		return e.VerdictData.Chain
	}
	ad, err := netlink.NewAttributeDecoder(e.Val)
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			return ad.String()
		}
	}
	return ""
}

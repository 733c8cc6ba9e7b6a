package netpolicy

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
)

// DefaultSubnet is where sandboxes' addresses come from unless the
// daemon is given another (--network-subnet): each sandbox takes a /31,
// the node's end of its veth the even address and the sandbox the odd.
var DefaultSubnet = netip.MustParsePrefix("10.234.0.0/16")

// Options configure a node's sandbox networking.
type Options struct {
	// Name names the daemon's nftables table and, hashed, the prefix of
	// its interfaces: give each daemon on a node its own (the container
	// backend uses its cgroup parent).
	Name string
	// Subnet is the daemon's sandbox subnet, IPv4, /16 to /30; each
	// daemon on a node needs its own. Zero: DefaultSubnet.
	Subnet netip.Prefix
}

// Node is the sandbox networking of one daemon: it gives sandboxes an
// interface and rules, changes their rules, and removes both.
type Node struct {
	fw     *firewall
	prefix string
	subnet netip.Prefix

	mu   sync.Mutex
	used map[int]*member // /31 index -> its sandbox
	next int             // where the search for a free index starts
}

// member is what the node knows of a sandbox with a /31: enough for the
// resolver to answer it (who asks, what it may resolve, its group's
// names).
type member struct {
	id, hostname string
	policy       Policy
	attached     bool   // Attach or Adopt done (Reserve alone: not yet)
	tap          bool   // a VM's tap (AttachTap), not a veth
	owner        string // the backend whose VM's tap it is (AttachTap)
}

// New checks the options; it touches nothing on the node (a daemon whose
// sandboxes all have mode none never does).
func New(o Options) (*Node, error) {
	if o.Name == "" {
		return nil, errdefs.Invalidf("network: a name is required")
	}
	if !o.Subnet.IsValid() {
		o.Subnet = DefaultSubnet
	}
	if !o.Subnet.Addr().Is4() || o.Subnet.Bits() < 16 || o.Subnet.Bits() > 30 {
		return nil, errdefs.Invalidf("network subnet %s: want IPv4, /16 to /30", o.Subnet)
	}
	h := fnv.New32a()
	h.Write([]byte(o.Name))
	// "w" and five hex digits, then the index in hex: at most 10 bytes
	// of the 15 an interface name has.
	prefix := fmt.Sprintf("w%05x", h.Sum32()&0xfffff)
	// Another 15 bits of the hash pick the NFLOG group: one per daemon
	// (a group has one reader), away from 0 and the low groups tools use.
	logGroup := uint16(h.Sum32()>>17) | 0x8000
	return &Node{
		fw:     newFirewall(strings.ReplaceAll(o.Name, "/", "-"), prefix, o.Subnet.Masked(), logGroup),
		prefix: prefix, subnet: o.Subnet.Masked(), used: map[int]*member{},
	}, nil
}

// Attachment is what a sandbox with a network holds: its /31 (by index in
// the subnet) and its policy. The container backend keeps it in the
// sandbox's state, so that a restarted daemon can adopt and remove it.
type Attachment struct {
	Index  int    `json:"index"`
	Policy Policy `json:"policy"`
	// Hostname is the sandbox's hostname: group members resolve each
	// other by it (and by id).
	Hostname string `json:"hostname,omitempty"`
	// Tap says the interface is a VM's tap (AttachTap), not a veth.
	Tap bool `json:"tap,omitempty"`
	// Owner names the backend whose VM the tap is (AttachTap): two
	// backends attach taps (microvm, fullvm), and each sweeps its own
	// (SweepTaps). Empty in records from before, all the microvm
	// backend's.
	Owner string `json:"owner,omitempty"`
}

// LogGroup is the NFLOG group the daemon's rules log refused packets to.
func (n *Node) LogGroup() uint16 { return n.fw.logGroup }

// SandboxOfInterface is the sandbox whose veth's host end is the
// interface named name, if it is one of this node's.
func (n *Node) SandboxOfInterface(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, n.prefix)
	if !ok {
		return "", false
	}
	i, err := strconv.ParseInt(rest, 16, 32)
	if err != nil {
		return "", false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.used[int(i)]
	if !ok {
		return "", false
	}
	return m.id, true
}

// SandboxOfIfindex is the sandbox whose veth's host end has interface
// index idx. One RTM_GETLINK of that index: Go's net.InterfaceByIndex
// dumps every interface of the node (thousands of veths) to find one.
func (n *Node) SandboxOfIfindex(idx int) (string, bool) {
	l, err := netlink.LinkByIndex(idx)
	if err != nil {
		return "", false
	}
	return n.SandboxOfInterface(l.Attrs().Name)
}

// Prefix is the start of the host ends' interface names.
func (n *Node) Prefix() string { return n.prefix }

// Table is the name of the daemon's nftables table (family inet).
func (n *Node) Table() string { return n.fw.table.Name }

// Ifname is the host end of the sandbox's veth with index i.
func (n *Node) Ifname(i int) string { return n.prefix + strconv.FormatInt(int64(i), 16) }

// Addrs are the node's end and the sandbox's end of /31 number i.
func (n *Node) Addrs(i int) (host, sandbox netip.Addr) {
	b := n.subnet.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(2 * i)
	host = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return host, host.Next()
}

func (n *Node) size() int { return 1 << (32 - n.subnet.Bits()) / 2 }

// alloc takes a free /31 for id. The search starts after the last one
// taken, so an address is reused as late as possible: replies to a
// deleted sandbox's connections must not reach its successor.
// An index Reserve took for id is id's.
func (n *Node) alloc(id string) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, m := range n.used {
		if m.id == id && !m.attached {
			return i, nil
		}
	}
	size := n.size()
	for k := range size {
		i := (n.next + k) % size
		if _, ok := n.used[i]; !ok {
			n.used[i] = &member{id: id}
			n.next = (i + 1) % size
			return i, nil
		}
	}
	return 0, errdefs.Exhaustedf("network subnet %s: all %d sandbox addresses in use", n.subnet, size)
}

// Prefer reserves /31 i for sandbox id's next Attach, if it is free: a
// restored sandbox keeps its address where it can. It reports whether it
// did.
func (n *Node) Prefer(id string, i int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i < 0 || i >= n.size() {
		return false
	}
	if m, ok := n.used[i]; ok {
		return m.id == id && !m.attached
	}
	n.used[i] = &member{id: id}
	return true
}

func (n *Node) free(i int, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m := n.used[i]; m != nil && m.id == id {
		delete(n.used, i)
	}
}

// Reserve takes the /31 that Attach will give sandbox id and returns the
// node's end of it, the sandbox's gateway and nameserver: its
// /etc/resolv.conf is written before its network is made. Release undoes
// it where Attach never comes.
func (n *Node) Reserve(id string) (gateway netip.Addr, err error) {
	i, err := n.alloc(id)
	if err != nil {
		return netip.Addr{}, err
	}
	gw, _ := n.Addrs(i)
	return gw, nil
}

// Release frees what Reserve took for id, unless Attach used it.
func (n *Node) Release(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, m := range n.used {
		if m.id == id && !m.attached {
			delete(n.used, i)
		}
	}
}

// Sandbox is what the resolver knows of a sandbox asking it.
type Sandbox struct {
	ID       string
	Hostname string
	Policy   Policy
}

// SandboxOfAddr is the attached sandbox whose address is a.
func (n *Node) SandboxOfAddr(a netip.Addr) (Sandbox, bool) {
	if !a.Is4() || !n.subnet.Contains(a) {
		return Sandbox{}, false
	}
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	s := n.subnet.Addr().As4()
	base := uint32(s[0])<<24 | uint32(s[1])<<16 | uint32(s[2])<<8 | uint32(s[3])
	off := v - base
	if off%2 == 0 { // a gateway, never a sandbox
		return Sandbox{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.used[int(off/2)]
	if !ok || !m.attached {
		return Sandbox{}, false
	}
	return Sandbox{ID: m.id, Hostname: m.hostname, Policy: m.policy}, true
}

// GroupMember is the address of the member of group whose hostname or
// id is name (lower case), if there is one.
func (n *Node) GroupMember(group, name string) (netip.Addr, bool) {
	if group == "" {
		return netip.Addr{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, m := range n.used {
		if m.attached && m.policy.Group == group && (strings.EqualFold(m.hostname, name) || m.id == name) {
			_, a := n.Addrs(i)
			return a, true
		}
	}
	return netip.Addr{}, false
}

// AllowResolved lets sandbox id reach addrs for ttl (ClampTTL) under
// its name rules for hosts (Policy.Hosts of the name it asked for): the
// resolver calls it before it answers, so the sandbox's connect to what
// it was answered finds the address allowed. An address answered again
// gets the new answer's timeout.
func (n *Node) AllowResolved(id string, hosts []string, addrs []netip.Addr, ttl time.Duration) error {
	if len(hosts) == 0 || len(addrs) == 0 {
		return nil
	}
	if err := n.fw.allowResolved(id, hosts, addrs, ClampTTL(ttl)); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "sandbox "+id+": allow resolved addresses")
	}
	return nil
}

// ResolvedAddrs lists what sandbox id's name rule for host allows now
// (tests, Cut).
func (n *Node) ResolvedAddrs(id, host string) ([]netip.Addr, error) {
	return n.fw.resolved(id, host)
}

// SetResolver makes the sandboxes' DNS (UDP and TCP port 53 to their
// gateway) go to the daemon's resolver, listening on port of every
// address of the node; 0 refuses it as any other traffic to the node.
// Where the daemon's table exists (sandboxes adopted from an earlier
// daemon) its base chains are rewritten at once.
func (n *Node) SetResolver(port uint16) error {
	n.fw.mu.Lock()
	defer n.fw.mu.Unlock()
	n.fw.dnsPort = port
	n.fw.ready = false
	c, err := n.fw.connLocked()
	if err != nil {
		return err
	}
	if t, err := c.ListTableOfFamily(n.fw.table.Name, nftables.TableFamilyINet); err != nil || t == nil {
		return nil
	}
	_, err = n.fw.ensureLocked()
	return err
}

// Attach gives sandbox id (its network namespace is that of pid) an
// interface and policy p: a veth pair whose sandbox end is eth0 with the
// /31's odd address and a default route through the node's end, and the
// sandbox's rules. All or nothing.
func (n *Node) Attach(id, hostname string, pid int, p Policy) (_ Attachment, retErr error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		if errors.Is(err, unix.ESRCH) || errors.Is(err, os.ErrNotExist) {
			return Attachment{}, errdefs.Wrap(errdefs.NotFound, err, "sandbox network namespace")
		}
		return Attachment{}, errdefs.Wrap(errdefs.Internal, err, "open sandbox network namespace")
	}
	defer ns.Close()
	return n.AttachNS(id, hostname, ns, p)
}

// AttachNS is Attach to the network namespace ns (a restore's, which no
// process holds yet). Like Attach it runs from the node's namespace.
func (n *Node) AttachNS(id, hostname string, ns netns.NsHandle, p Policy) (Attachment, error) {
	return n.attach(id, hostname, p, false, "", func(i int) error { return n.link(id, ns, i) })
}

// attach takes a /31 for sandbox id, adds its rules for policy p, then
// has mk make the interface of that /31 (a veth, or a VM's tap: tap);
// all or nothing.
func (n *Node) attach(id, hostname string, p Policy, tap bool, owner string, mk func(i int) error) (_ Attachment, retErr error) {
	if p.IsNone() {
		return Attachment{}, errdefs.Invalidf("network: attach with mode none")
	}
	var cu cleanup.Cleanup
	defer func() {
		if retErr != nil {
			_ = cu.Clean()
		}
	}()
	i, err := n.alloc(id)
	if err != nil {
		return Attachment{}, err
	}
	cu.Add(func() error { n.free(i, id); return nil })
	// Rules first: the interface never exists without them.
	ifname := n.Ifname(i)
	_, addr := n.Addrs(i)
	if err := n.fw.add(id, ifname, p, addr); err != nil {
		return Attachment{}, errdefs.Wrap(errdefs.Internal, err, "sandbox "+id+": network rules")
	}
	cu.Add(func() error { return n.fw.remove(id, ifname, p, addr) })
	if err := mk(i); err != nil {
		return Attachment{}, err
	}
	cu.Release()
	n.mark(i, id, hostname, p)
	n.mu.Lock()
	n.used[i].tap, n.used[i].owner = tap, owner
	n.mu.Unlock()
	return Attachment{Index: i, Policy: p, Hostname: hostname, Tap: tap, Owner: owner}, nil
}

// mark records /31 i as sandbox id's, attached with policy p.
func (n *Node) mark(i int, id, hostname string, p Policy) {
	n.mu.Lock()
	defer n.mu.Unlock()
	old := n.used[i]
	m := &member{id: id, hostname: hostname, policy: p, attached: true}
	if old != nil && old.id == id {
		m.tap, m.owner = old.tap, old.owner
	}
	n.used[i] = m
}

// link makes the veth pair of /31 i with its sandbox end in network
// namespace ns, and configures both ends from here: the sandbox's init waits
// for its config meanwhile, so the sandbox starts with its network up.
func (n *Node) link(id string, ns netns.NsHandle, i int) (retErr error) {
	hostAddr, sbAddr := n.Addrs(i)
	name := n.Ifname(i)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "create veth "+name)
	}
	defer func() {
		if retErr != nil {
			// Its peer goes with it.
			_ = netlink.LinkDel(veth)
		}
	}()
	host, err := netlink.LinkByName(name)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "find veth "+name)
	}
	// The alias names the sandbox for whoever lists the node's
	// interfaces (ip link; leak checks). The kernel ignores it in the
	// create.
	if err := netlink.LinkSetAlias(host, id); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "alias of "+name)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipnet(hostAddr, 31)}); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "address of "+name)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "set "+name+" up")
	}
	// Route messages only: the library's default also opens an XFRM and
	// a netfilter socket, two more per create, and a node whose
	// xfrm_user is a module not loaded refuses the first
	// (EPROTONOSUPPORT; the v2 VM's kernel, TestContainerOnCgroupV2InAVM).
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "netlink in sandbox network namespace")
	}
	defer h.Close()
	peer, err := h.LinkByName("eth0")
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "find sandbox eth0")
	}
	if err := h.AddrAdd(peer, &netlink.Addr{IPNet: ipnet(sbAddr, 31)}); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "address of sandbox eth0")
	}
	if err := h.LinkSetUp(peer); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "set sandbox eth0 up")
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: net.IP(hostAddr.AsSlice())}); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "sandbox default route")
	}
	// Setting a veth up only asks for it: the kernel turns its carrier
	// on and gives it a queue from a work item, and until then it drops
	// what it is given. A sandbox's first SYN lost that way is resent a
	// second later; wait instead until both ends are up.
	if err := waitUp(netlink.LinkByName, name); err != nil {
		return err
	}
	return waitUp(h.LinkByName, "eth0")
}

// upTimeout bounds the wait for a veth's carrier (one work item of the
// kernel's; microseconds on an idle node).
const upTimeout = 2 * time.Second

func waitUp(byName func(string) (netlink.Link, error), name string) error {
	deadline := time.Now().Add(upTimeout)
	for delay := 20 * time.Microsecond; ; delay = min(2*delay, 5*time.Millisecond) {
		l, err := byName(name)
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "find "+name)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Unavailablef("veth %s not up after %v (state %s)", name, upTimeout, l.Attrs().OperState)
		}
		time.Sleep(delay)
	}
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// SetPolicy replaces the rules of an attached sandbox (whose network
// namespace is pid's) in one nftables transaction, then cuts its TCP
// connections that p forbids (Cut).
func (n *Node) SetPolicy(id string, pid int, a Attachment, p Policy) error {
	if err := n.SetTapPolicy(id, a, p); err != nil {
		return err
	}
	if p.Mode == Open {
		// Forbids nothing Cut would look at: spare the scan (~1.5 ms here,
		// the kernel walks every TCP socket of the node for it).
		return nil
	}
	return n.Cut(pid, a, p)
}

// Cut aborts the TCP connections of the sandbox with attachment a (its
// network namespace is pid's) whose peer p does not allow, as `ss -K`
// does (SOCK_DESTROY): the sandbox's end fails at once with
// ECONNABORTED. The rules alone would only drop the peer's packets (a
// reset goes to a packet's sender, never to the sandbox on the way in),
// leaving a download hanging rather than cut. Connections over lo or to
// the sandbox's own address are its own business. UDP has no
// connection to abort: its packets are dropped both ways.
func (n *Node) Cut(pid int, a Attachment, p Policy) error {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		if errors.Is(err, unix.ESRCH) || errors.Is(err, os.ErrNotExist) {
			return nil // gone: nothing to cut
		}
		return errdefs.Wrap(errdefs.Internal, err, "open sandbox network namespace")
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_INET_DIAG)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "sock_diag in sandbox network namespace")
	}
	defer h.Close()
	socks, err := h.SocketDiagTCP(unix.AF_INET)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "list sandbox TCP sockets")
	}
	_, self := n.Addrs(a.Index)
	// What the name rules allow now, listed once per host.
	resolved := map[string][]netip.Addr{}
	for _, r := range p.Allow {
		if r.Host == "" {
			continue
		}
		if _, ok := resolved[r.Host]; !ok {
			id, _ := n.SandboxOfInterface(n.Ifname(a.Index))
			if resolved[r.Host], err = n.fw.resolved(id, r.Host); err != nil {
				return errdefs.Wrap(errdefs.Internal, err, "list resolved addresses")
			}
		}
	}
	var errs []error
	for _, s := range socks {
		if s.State == tcpListen || s.State == tcpClose {
			continue
		}
		remote, ok := netip.AddrFromSlice(s.ID.Destination.To4())
		if !ok || remote.IsLoopback() || remote.IsUnspecified() || remote == self {
			continue
		}
		// Group members (fixed at create) stay reachable; no other
		// address of the subnet ever was.
		if p.Group != "" && n.subnet.Contains(remote) {
			continue
		}
		if p.Allows(remote, s.ID.DestinationPort, "tcp") || allowsResolved(p, resolved, remote, s.ID.DestinationPort) {
			continue
		}
		err := h.SocketDestroy(&net.TCPAddr{IP: s.ID.Source, Port: int(s.ID.SourcePort)},
			&net.TCPAddr{IP: s.ID.Destination, Port: int(s.ID.DestinationPort)})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "abort forbidden connections")
	}
	return nil
}

// allowsResolved reports whether a name rule of p allows TCP to
// addr:port, resolved listing each host's allowed addresses.
func allowsResolved(p Policy, resolved map[string][]netip.Addr, addr netip.Addr, port uint16) bool {
	for _, r := range p.Allow {
		if r.Host != "" && (r.Port == 0 || r.Port == port) && (r.Proto == "" || r.Proto == "tcp") && slices.Contains(resolved[r.Host], addr) {
			return true
		}
	}
	return false
}

// TCP states as sock_diag reports them (include/net/tcp_states.h).
const (
	tcpClose  = 7
	tcpListen = 10
)

// Detach removes sandbox id's interface (if its namespace has not taken
// it already) and rules, and frees its /31. Idempotent.
func (n *Node) Detach(id string, a Attachment) error {
	name := n.Ifname(a.Index)
	var errs []error
	if l, err := netlink.LinkByName(name); err == nil {
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete veth %s: %w", name, err))
		}
	}
	_, addr := n.Addrs(a.Index)
	if err := n.fw.remove(id, name, a.Policy, addr); err != nil {
		errs = append(errs, err)
	}
	if err := forgetFlows(addr); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		n.free(a.Index, id)
	}
	return errors.Join(errs...)
}

// forgetFlows deletes the connection-tracking entries of addr (sent from
// it, or to it by a group member): an established entry would otherwise
// let the old peers' packets into the next sandbox given the address
// (the ingress chain accepts what conntrack calls established). The
// kernel has no delete-by-address, so this lists the node's table: ~1 ms
// per 10,000 entries.
func forgetFlows(addr netip.Addr) error {
	ip := net.IP(addr.AsSlice())
	var src, dst netlink.ConntrackFilter
	if err := src.AddIP(netlink.ConntrackOrigSrcIP, ip); err != nil {
		return err
	}
	if err := dst.AddIP(netlink.ConntrackOrigDstIP, ip); err != nil {
		return err
	}
	return retryDump(func() error {
		_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, &src, &dst)
		if err != nil {
			return fmt.Errorf("forget the connections of %s: %w", addr, err)
		}
		return nil
	})
}

// dumpTries bounds the retries of a netlink dump the kernel interrupted
// (NLM_F_DUMP_INTR: the table changed meanwhile, as it does while other
// sandboxes come and go): its results may lack entries.
const dumpTries = 5

func retryDump(f func() error) error {
	var err error
	for range dumpTries {
		if err = f(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return err
}

// linkList lists the node's interfaces, whole.
func linkList() ([]netlink.Link, error) {
	var ls []netlink.Link
	err := retryDump(func() (err error) {
		ls, err = netlink.LinkList()
		return err
	})
	return ls, err
}

// Adopt marks an attachment of a sandbox of an earlier daemon as taken.
func (n *Node) Adopt(id string, a Attachment) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a.Index < 0 || a.Index >= n.size() {
		return errdefs.Invalidf("sandbox %s: network index %d outside subnet %s", id, a.Index, n.subnet)
	}
	if other, ok := n.used[a.Index]; ok && other.id != id {
		return errdefs.Conflictf("sandbox %s: network index %d is sandbox %s's", id, a.Index, other.id)
	}
	n.used[a.Index] = &member{id: id, hostname: a.Hostname, policy: a.Policy, attached: true, tap: a.Tap, owner: a.Owner}
	return nil
}

// Sweep removes the interfaces and rules of every sandbox not in keep:
// those of sandboxes that died while no daemon ran, and of creates a
// crash interrupted. The daemon's backends share the node (the VM
// backends' taps beside the container backend's veths) and each sweeps
// with the ids of its own sandboxes only: Sweep (veths) keeps every
// attached or adopted tap whatever keep says, SweepTaps the veths and
// the other VM backend's taps.
func (n *Node) Sweep(keep map[string]bool) error { return n.sweep(keep, false, "") }

// SweepTaps is Sweep for VM backend owner (AttachTap): keep lists its
// VMs, and the attached veths of containers and taps of other owners
// stay.
func (n *Node) SweepTaps(owner string, keep map[string]bool) error {
	return n.sweep(keep, true, owner)
}

func (n *Node) sweep(keep map[string]bool, taps bool, owner string) error {
	n.mu.Lock()
	owned := map[string]bool{}
	kept := map[netip.Addr]bool{}
	keepAll := map[string]bool{}
	for id, k := range keep {
		keepAll[id] = k
	}
	for i, m := range n.used {
		if keep[m.id] || m.attached && (m.tap != taps || m.owner != owner) {
			keepAll[m.id] = true
			owned[n.Ifname(i)] = true
			_, a := n.Addrs(i)
			kept[a] = true
		}
	}
	n.mu.Unlock()
	var errs []error
	links, err := linkList()
	if err != nil {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	for _, l := range links {
		name := l.Attrs().Name
		if strings.HasPrefix(name, n.prefix) && !owned[name] {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete veth %s: %w", name, err))
			}
			if i, err := strconv.ParseInt(strings.TrimPrefix(name, n.prefix), 16, 32); err == nil && int(i) < n.size() {
				_, a := n.Addrs(int(i))
				errs = append(errs, forgetFlows(a))
			}
		}
	}
	errs = append(errs, n.fw.sweep(keepAll, kept))
	return errors.Join(errs...)
}

// Leftovers lists what of the daemon's networking is on the node: host
// interfaces (name to the sandbox id of their alias) and the ids with
// rules (leak checks).
func (n *Node) Leftovers() (links map[string]string, ids []string, err error) {
	ls, err := linkList()
	if err != nil {
		return nil, nil, err
	}
	links = map[string]string{}
	for _, l := range ls {
		if strings.HasPrefix(l.Attrs().Name, n.prefix) {
			links[l.Attrs().Name] = l.Attrs().Alias
		}
	}
	ids, err = n.fw.sandboxes()
	return links, ids, err
}

// Groups lists the daemon's groups with their members' addresses (leak
// checks).
func (n *Node) Groups() (map[string][]netip.Addr, error) { return n.fw.groups() }

// HasTable reports whether the daemon's nftables table exists.
func (n *Node) HasTable() bool {
	n.fw.mu.Lock()
	defer n.fw.mu.Unlock()
	c, err := n.fw.connLocked()
	if err != nil {
		return false
	}
	t, err := c.ListTableOfFamily(n.fw.table.Name, nftables.TableFamilyINet)
	return err == nil && t != nil
}

// RemoveUnused removes the daemon's table when no sandbox has rules in
// it: a stopped daemon leaves nothing of its own on the node.
func (n *Node) RemoveUnused() error {
	ids, err := n.fw.sandboxes()
	if err != nil || len(ids) > 0 {
		return err
	}
	if gs, err := n.fw.groups(); err != nil || len(gs) > 0 {
		return err
	}
	return n.fw.removeTable()
}

// Close lets go of the netlink socket.
func (n *Node) Close() error { return n.fw.close() }

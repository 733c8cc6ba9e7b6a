package netpolicy

import (
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// AttachTap gives sandbox id, a VM, its network: the same /31, rules and
// interface name as a container's veth (Attach), but the node's end is a
// tap whose other end is the VM's virtio-net device. The VM's kernel is
// the sandbox's network stack, so the tap takes the place of the veth's
// host end and nothing else changes: the rules match the interface by
// name and the sandbox by its address, the resolver and the policy-drop
// log find the sandbox by the same /31 and name, and Sweep, Detach and
// the leak checks (Leftovers) see the tap as a veth. (A tap inside a
// namespace of the VM's own, bridged to a veth, would give the same rules
// one more hop, a bridge and a namespace to leak, for nothing.)
//
// tap is the only descriptor of the tap, which is not persistent: QEMU
// is given it (-netdev tap,fd=N) and the caller closes its own copy once
// QEMU started, so the tap goes when QEMU goes, killed or crashed; its
// rules stay until Detach or Sweep. owner names the VM backend
// (Attachment.Owner, SweepTaps).
func (n *Node) AttachTap(owner, id, hostname string, p Policy) (a Attachment, tap *os.File, err error) {
	a, err = n.attach(id, hostname, p, true, owner, func(i int) error {
		tap, err = n.tap(id, i)
		return err
	})
	return a, tap, err
}

// tap makes the tap of /31 i and configures the node's end: alias,
// address, up. The guest configures its own end.
func (n *Node) tap(id string, i int) (_ *os.File, retErr error) {
	name := n.Ifname(i)
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "open /dev/net/tun")
	}
	f := os.NewFile(uintptr(fd), "tap "+name)
	defer func() {
		if retErr != nil {
			f.Close() // the last descriptor: the tap goes with it
		}
	}()
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "tap "+name)
	}
	// No packet information header; a virtio-net header, which QEMU
	// passes through to the guest's driver (checksum and segmentation
	// offloads).
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create tap "+name)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "find tap "+name)
	}
	// The alias names the sandbox, as a veth's does.
	if err := netlink.LinkSetAlias(l, id); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "alias of "+name)
	}
	host, _ := n.Addrs(i)
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet(host, 31)}); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "address of "+name)
	}
	// Its carrier is on while a descriptor is attached (ours, then
	// QEMU's), so it is up at once: no wait as for a veth.
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "set "+name+" up")
	}
	return f, nil
}

// SetTapPolicy moves VM sandbox id, attached through a tap (AttachTap),
// to policy p: its rules change in one nftables transaction (SetPolicy's
// first step). Unlike SetPolicy it aborts no connection: the VM's
// sockets are in its guest's kernel, out of the node's sock_diag (which,
// asked in QEMU's network namespace, would name the node's own sockets).
// A connection p forbids has its packets dropped both ways from now on.
func (n *Node) SetTapPolicy(id string, a Attachment, p Policy) error {
	if p.IsNone() {
		return errdefs.Invalidf("network: set policy none: detach instead")
	}
	if err := n.fw.set(id, p); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "sandbox "+id+": network rules")
	}
	n.mark(a.Index, id, a.Hostname, p)
	return nil
}

// Package testnet makes test hosts: network namespaces with a veth to the
// node's namespace, the only destinations (besides loopback and the
// node's own addresses, which must refuse) of the network tests' and
// `warren bench network`'s traffic. Addresses are of 198.18.0.0/15, the
// benchmarking range, never routed: nothing leaves the machine.
package testnet

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Host is a network namespace with a veth to the node's namespace: the
// node's end has Gateway, the host's end Addr, of a /30 of its own. Its
// default route points at the node, so only the node's rules keep it
// out of anything.
type Host struct {
	NS      netns.NsHandle
	Addr    netip.Addr
	Gateway netip.Addr // a node address
	link    netlink.Link
}

// NewHost makes a test host; Close removes it.
func NewHost() (_ *Host, retErr error) {
	// A /30 of a block this process claimed (claim.go).
	base, err := hostBase()
	if err != nil {
		return nil, err
	}
	gw, addr := base.Next(), base.Next().Next()
	ns, err := NewNetns()
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			ns.Close()
		}
	}()
	// Named for its /30, which no other process has.
	b := base.As4()
	name := fmt.Sprintf("wth%02x%02x%02x", b[1], b[2], b[3])
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("test host veth: %w", err)
	}
	h := &Host{NS: ns, Addr: addr, Gateway: gw, link: veth}
	defer func() {
		if retErr != nil {
			_ = netlink.LinkDel(veth)
		}
	}()
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, err
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(gw, 30)}); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, err
	}
	err = InNetns(ns, func() error {
		for _, n := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			if n == "eth0" {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(addr, 30)}); err != nil {
					return err
				}
				if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(gw.AsSlice())}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("configure test host: %w", err)
	}
	return h, nil
}

// Close removes the host's veth and lets go of its namespace (which
// dies with the last socket in it).
func (h *Host) Close() error {
	err := netlink.LinkDel(h.link)
	h.NS.Close()
	return err
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// NewNetns makes an empty network namespace; closing the handle (and
// every socket in it) ends it.
func NewNetns() (netns.NsHandle, error) {
	return onThread(func() (netns.NsHandle, error) { return netns.New() })
}

// InNetns runs f on a thread in network namespace ns: sockets f makes
// are that namespace's.
func InNetns(ns netns.NsHandle, f func() error) error {
	_, err := onThread(func() (netns.NsHandle, error) {
		if err := netns.Set(ns); err != nil {
			return 0, err
		}
		return 0, f()
	})
	return err
}

// onThread runs f locked to a thread and puts the thread back in the
// caller's network namespace afterwards. A thread left to die instead
// (a goroutine exiting locked) would kill every child started from it
// with Pdeathsig, such as the e2e tests' daemons.
func onThread(f func() (netns.NsHandle, error)) (netns.NsHandle, error) {
	type res struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- res{0, err}
			return // the thread dies locked
		}
		defer orig.Close()
		ns, err := f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		ch <- res{ns, err}
	}()
	r := <-ch
	return r.ns, r.err
}

// Listen listens on TCP addr in namespace ns (0: the caller's).
func Listen(ns netns.NsHandle, addr string) (net.Listener, error) {
	var ln net.Listener
	mk := func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}
	if ns == 0 {
		return ln, mk()
	}
	return ln, InNetns(ns, mk)
}

// Echo echoes what every connection to ln sends, until ln is closed.
func Echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
	}
}

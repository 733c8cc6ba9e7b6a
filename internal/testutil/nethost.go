package testutil

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Test hosts are the only destinations of network tests' traffic besides
// loopback and the node's own addresses (which tests expect to refuse
// it): network namespaces the test makes, on 198.18.0.0/15 (the
// benchmarking range, never routed). Nothing leaves the machine.

var hostSeq atomic.Int32

// TestHost is a network namespace with a veth to the node's namespace:
// the node's end has Gateway, the host's end Addr, of a /30 of its own.
// Its default route points at the node, so only the node's rules keep
// it out of anything.
type TestHost struct {
	NS      netns.NsHandle
	Addr    netip.Addr
	Gateway netip.Addr // a node address
}

// NewTestHost makes a test host; it is removed with the test.
func NewTestHost(t testing.TB) *TestHost {
	t.Helper()
	RequireRoot(t)
	k := int(hostSeq.Add(1))
	// The pid spreads test binaries of several packages over the range.
	base := netip.AddrFrom4([4]byte{198, 18 + byte(k/64%2), byte(os.Getpid() % 256), byte(4 * (k % 64))})
	gw, addr := base.Next(), base.Next().Next()
	ns := NewNetns(t)
	name := fmt.Sprintf("wth%d-%d", os.Getpid()%10000, k)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(gw, 30)}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	InNetns(t, ns, func() error {
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
	return &TestHost{NS: ns, Addr: addr, Gateway: gw}
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// NewNetns makes an empty network namespace, closed with the test.
func NewNetns(t testing.TB) netns.NsHandle {
	t.Helper()
	type res struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ns, err := onThread(func() (netns.NsHandle, error) { return netns.New() })
		ch <- res{ns, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.ns.Close() })
	return r.ns
}

// InNetns runs f on a thread in network namespace ns: sockets f makes
// are that namespace's. It fails the test if f fails.
func InNetns(t testing.TB, ns netns.NsHandle, f func() error) {
	t.Helper()
	if err := InNetnsErr(ns, f); err != nil {
		t.Fatal(err)
	}
}

// InNetnsErr is InNetns returning f's error.
func InNetnsErr(ns netns.NsHandle, f func() error) error {
	_, err := onThread(func() (netns.NsHandle, error) {
		if err := netns.Set(ns); err != nil {
			return 0, err
		}
		return 0, f()
	})
	return err
}

// onThread runs f locked to a thread and puts the thread back in the
// test's network namespace afterwards. A thread left to die instead
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

// Listen listens on TCP addr in namespace ns (0: the test's own),
// closed with the test.
func Listen(t testing.TB, ns netns.NsHandle, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	mk := func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}
	if ns == 0 {
		if err := mk(); err != nil {
			t.Fatal(err)
		}
	} else {
		InNetns(t, ns, mk)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// EchoServer listens on addr in ns and echoes what every connection
// sends; it returns the port.
func EchoServer(t testing.TB, ns netns.NsHandle, addr string) int {
	t.Helper()
	ln := Listen(t, ns, addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

package testutil

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/warrenrl/warren/internal/testnet"
)

// TestHost is a test host (internal/testnet) removed with the test.
type TestHost = testnet.Host

// NewTestHost makes a test host; it is removed with the test.
func NewTestHost(t testing.TB) *TestHost {
	t.Helper()
	RequireRoot(t)
	h, err := testnet.NewHost()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// NewNetns makes an empty network namespace, closed with the test.
func NewNetns(t testing.TB) netns.NsHandle {
	t.Helper()
	ns, err := testnet.NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// InNetns runs f on a thread in network namespace ns and fails the test
// if f fails.
func InNetns(t testing.TB, ns netns.NsHandle, f func() error) {
	t.Helper()
	if err := testnet.InNetns(ns, f); err != nil {
		t.Fatal(err)
	}
}

// InNetnsErr is InNetns returning f's error.
func InNetnsErr(ns netns.NsHandle, f func() error) error { return testnet.InNetns(ns, f) }

// Listen listens on TCP addr in namespace ns (0: the test's own),
// closed with the test.
func Listen(t testing.TB, ns netns.NsHandle, addr string) net.Listener {
	t.Helper()
	ln, err := testnet.Listen(ns, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// EchoServer listens on addr in ns and echoes what every connection
// sends; it returns the port.
func EchoServer(t testing.TB, ns netns.NsHandle, addr string) int {
	t.Helper()
	ln := Listen(t, ns, addr)
	go testnet.Echo(ln)
	return ln.Addr().(*net.TCPAddr).Port
}

// Subnet is a /24 for a test's sandboxes (a daemon's or a
// netpolicy.Node's subnet) that no other process on the node uses
// (testnet.Subnet), held until the test binary ends.
func Subnet(t testing.TB) netip.Prefix {
	t.Helper()
	p, err := testnet.Subnet()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

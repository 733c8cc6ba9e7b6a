package testnet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Test binaries of several packages run at once on one node, each with
// sandbox subnets and test hosts of its own. Addresses picked from the
// pid alone collided now and then (two binaries whose pids matched
// modulo 256 gave their test hosts the same /30, and a sandbox's
// connection reached the other binary's host). So every block a process
// uses is claimed: a lock on a file named for it under ClaimDir, which
// the kernel drops when the process ends however it ends, and a block
// that a route of the node already covers (a daemon's sandboxes, a
// leftover) is passed over.

// ClaimDir holds the claims' lock files (tmpfs: gone at boot).
const ClaimDir = "/run/warren-testnet"

var (
	claimMu sync.Mutex
	claims  []*os.File // held open (locked) for the process's life
)

// claim takes the lock of block name; false if another process (or an
// earlier claim of this one) holds it.
func claim(name string) (bool, error) {
	if err := os.MkdirAll(ClaimDir, 0o700); err != nil {
		return false, err
	}
	f, err := os.OpenFile(filepath.Join(ClaimDir, name), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, err
	}
	// flock locks belong to the open file: a second open of the same
	// name in this process is refused as well.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("claim %s: %w", name, err)
	}
	claimMu.Lock()
	claims = append(claims, f)
	claimMu.Unlock()
	return true, nil
}

// routed reports whether a route of the node's main table, other than a
// default route, overlaps p.
func routed(p netip.Prefix) (bool, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return false, err
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		a, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		if ones == 0 {
			continue // a default route (0.0.0.0/0)
		}
		if netip.PrefixFrom(a, ones).Masked().Overlaps(p) {
			return true, nil
		}
	}
	return false, nil
}

// claimBlock claims the first of n candidate blocks, from one the pid
// picks on, that no other process holds and no route covers.
func claimBlock(n int, block func(i int) netip.Prefix) (netip.Prefix, error) {
	start := (os.Getpid()*131 + int(spread.Add(1))*7) % n
	for i := range n {
		p := block((start + i) % n)
		ok, err := claim(p.Addr().String() + "_" + fmt.Sprint(p.Bits()))
		if err != nil {
			return netip.Prefix{}, err
		}
		if !ok {
			continue
		}
		if used, err := routed(p); err != nil {
			return netip.Prefix{}, err
		} else if used {
			continue // keep the claim: nobody else should try it either
		}
		return p, nil
	}
	return netip.Prefix{}, errors.New("testnet: every candidate block is claimed or routed")
}

var spread atomic.Int32

// Subnet claims a /24 for a test's sandboxes (a daemon's or a
// netpolicy.Node's subnet) among 10.100.0.0-10.254.255.0, less
// 10.234.0.0/16 (the daemon's default, netpolicy.DefaultSubnet), held
// until the process ends.
func Subnet() (netip.Prefix, error) {
	const lo, hi = 100, 255
	return claimBlock((hi-lo)*256, func(i int) netip.Prefix {
		b := lo + i/256
		if b == 234 {
			b = 99 // 10.99 instead of the default's 10.234
		}
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(b), byte(i % 256), 0}), 24)
	})
}

// hostBlocks hands out the /30s of test hosts from /24s of 198.18.0.0/15
// this process claimed.
var hostBlocks struct {
	sync.Mutex
	block netip.Prefix
	used  int
}

// hostBase returns the first address of a free /30 for a test host.
func hostBase() (netip.Addr, error) {
	hostBlocks.Lock()
	defer hostBlocks.Unlock()
	if !hostBlocks.block.IsValid() || hostBlocks.used == 64 {
		// 198.19.255.0/24 is left to `warren bench network`'s peer pair.
		p, err := claimBlock(511, func(i int) netip.Prefix {
			return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, byte(18 + i/256), byte(i % 256), 0}), 24)
		})
		if err != nil {
			return netip.Addr{}, err
		}
		hostBlocks.block, hostBlocks.used = p, 0
	}
	a := hostBlocks.block.Addr().As4()
	a[3] = byte(4 * hostBlocks.used)
	hostBlocks.used++
	return netip.AddrFrom4(a), nil
}

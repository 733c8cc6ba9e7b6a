package guest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/etcfiles"
)

// DiskSerial is the serial of the block device that holds the sandbox's
// writable layer when it has a disk limit (warren.disk=1): an ext4 image
// of the limit's size, made on the host.
const DiskSerial = "upper"

// mountUpper mounts the filesystem of the sandbox's writable layer at
// dir: the disk's ext4 where the sandbox has a disk limit (writes past
// it fail with ENOSPC in the sandbox), a tmpfs (guest memory) otherwise.
func mountUpper(dir string) error {
	if cmdlineInt("disk") != 1 {
		return unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0755")
	}
	dev, err := findBlock(DiskSerial, 10*time.Second)
	if err != nil {
		return err
	}
	// discard: what the sandbox deletes is given back to the host's
	// sparse file.
	if err := unix.Mount(dev, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "discard"); err != nil {
		return fmt.Errorf("mount the sandbox's disk (%s): %w", dev, err)
	}
	return os.Chmod(dir, 0o755)
}

// networkUp configures eth0 (the VM's virtio-net device, on a tap of the
// host) from warren.ip and warren.gw as the host gives a container's
// veth end: the /31's odd address, a default route through the even one.
// Without warren.ip the VM has lo alone, as a container with network
// mode none.
func networkUp() error {
	ip := cmdlineString("ip")
	if ip == "" {
		return nil
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return fmt.Errorf("warren.ip: %w", err)
	}
	gw, err := netip.ParseAddr(cmdlineString("gw"))
	if err != nil {
		return fmt.Errorf("warren.gw: %w", err)
	}
	// The driver binds the device as its module loads; the interface
	// appears from that (udev-less: the kernel names it).
	var l netlink.Link
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l, err = netlink.LinkByName("eth0"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no eth0 after 10s: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(31, 32)}}); err != nil {
		return fmt.Errorf("address of eth0: %w", err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set eth0 up: %w", err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// writeResolvConf gives a sandbox with a network the resolver a
// container gets: the daemon's, at its gateway. It is written into the
// sandbox's root (its writable layer), replacing what the image has (a
// symlink included: it is removed, not followed out of the root).
func writeResolvConf() error {
	gw := cmdlineString("gw")
	if gw == "" {
		return nil
	}
	a, err := netip.ParseAddr(gw)
	if err != nil {
		return fmt.Errorf("warren.gw: %w", err)
	}
	etc := filepath.Join(RootDir, "etc")
	if fi, err := os.Lstat(etc); err != nil || !fi.IsDir() {
		// An image whose /etc is missing or not a directory keeps
		// its own (as the container backend does).
		return nil
	}
	p := filepath.Join(etc, "resolv.conf")
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.WriteFile(p, etcfiles.ResolvConf(a), 0o644)
}

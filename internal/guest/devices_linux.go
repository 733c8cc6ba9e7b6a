package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

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
// mode none. Ioctls and one rtnetlink message: a netlink library would
// add a quarter of a megabyte to every VM's initramfs.
func networkUp() error {
	ip := cmdlineString("ip")
	if ip == "" {
		return nil
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil || !addr.Is4() {
		return fmt.Errorf("warren.ip %q: want IPv4", ip)
	}
	gw, err := netip.ParseAddr(cmdlineString("gw"))
	if err != nil || !gw.Is4() {
		return fmt.Errorf("warren.gw %q: want IPv4", cmdlineString("gw"))
	}
	return configureEth0(addr, gw, false)
}

// configureEth0 gives eth0 addr on a /31, up, with a default route
// through gw. again: eth0 was configured before (a VM restored on another
// tap): it goes down first, which drops its routes and its neighbours
// (the old gateway's MAC address is the old tap's).
func configureEth0(addr, gw netip.Addr, again bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("eth0")
	if err != nil {
		return err
	}
	// The driver binds the device as its module loads; the interface
	// appears from that (no udev: the kernel names it).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err = unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no eth0 after 10s: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	index := ifr.Uint32()
	set := func(req uint, a netip.Addr, what string) error {
		ifr, _ := unix.NewIfreq("eth0")
		if err := ifr.SetInet4Addr(a.AsSlice()); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, req, ifr); err != nil {
			return fmt.Errorf("%s of eth0: %w", what, err)
		}
		return nil
	}
	if again {
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
			return fmt.Errorf("eth0 flags: %w", err)
		}
		ifr.SetUint16(ifr.Uint16() &^ unix.IFF_UP)
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
			return fmt.Errorf("set eth0 down: %w", err)
		}
	}
	if err := set(unix.SIOCSIFADDR, addr, "address"); err != nil {
		return err
	}
	if err := set(unix.SIOCSIFNETMASK, netip.AddrFrom4([4]byte{255, 255, 255, 254}), "netmask"); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("eth0 flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set eth0 up: %w", err)
	}
	return defaultRoute(index, gw)
}

// defaultRoute adds the default route through gw on interface index
// (RTM_NEWROUTE) and waits for the kernel's answer.
func defaultRoute(index uint32, gw netip.Addr) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	attr := func(typ uint16, data []byte) []byte {
		b := binary.NativeEndian.AppendUint16(nil, uint16(unix.SizeofRtAttr+len(data)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		return append(b, data...) // 4-byte data: aligned
	}
	body := []byte{unix.AF_INET, 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST}
	body = binary.NativeEndian.AppendUint32(body, 0) // rtm_flags
	body = append(body, attr(unix.RTA_GATEWAY, gw.AsSlice())...)
	body = append(body, attr(unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, index))...)
	msg := binary.NativeEndian.AppendUint32(nil, uint32(unix.SizeofNlMsghdr+len(body)))
	msg = binary.NativeEndian.AppendUint16(msg, unix.RTM_NEWROUTE)
	msg = binary.NativeEndian.AppendUint16(msg, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	msg = binary.NativeEndian.AppendUint32(msg, 1) // seq
	msg = binary.NativeEndian.AppendUint32(msg, 0) // pid: the kernel's
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	// The ack: an NLMSG_ERROR whose error is 0, or the failure's -errno.
	if n < unix.SizeofNlMsghdr+4 || binary.NativeEndian.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return fmt.Errorf("default route: unexpected answer (%d bytes)", n)
	}
	if e := int32(binary.NativeEndian.Uint32(buf[unix.SizeofNlMsghdr:])); e != 0 {
		return fmt.Errorf("default route: %w", unix.Errno(-e))
	}
	return nil
}

// writeResolvConf gives a sandbox with a network the resolver a
// container gets: the daemon's, at its gateway (warren.dns; absent with
// keep_etc, where the image's file stays). It is written into the
// sandbox's root (its writable layer), replacing what the image has (a
// symlink included: it is removed, not followed out of the root).
func writeResolvConf() error {
	ns := cmdlineString("dns")
	if ns == "" {
		return nil
	}
	a, err := netip.ParseAddr(ns)
	if err != nil {
		return fmt.Errorf("warren.dns: %w", err)
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

package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	return configureLink("eth0", addr, gw, false)
}

// configureLink gives interface name (eth0) addr on a /31, up, with a
// default route through gw. again: it was configured before (a VM
// restored on another tap): it goes down first, which drops its routes
// and its neighbours (the old gateway's MAC address is the old tap's).
func configureLink(name string, addr, gw netip.Addr, again bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
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
			return fmt.Errorf("no %s after 10s: %w", name, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	index := ifr.Uint32()
	set := func(req uint, a netip.Addr, what string) error {
		ifr, _ := unix.NewIfreq(name)
		if err := ifr.SetInet4Addr(a.AsSlice()); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, req, ifr); err != nil {
			return fmt.Errorf("%s of %s: %w", what, name, err)
		}
		return nil
	}
	if again {
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
			return fmt.Errorf("%s flags: %w", name, err)
		}
		ifr.SetUint16(ifr.Uint16() &^ unix.IFF_UP)
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
			return fmt.Errorf("set %s down: %w", name, err)
		}
	}
	if err := set(unix.SIOCSIFADDR, addr, "address"); err != nil {
		return err
	}
	if err := set(unix.SIOCSIFNETMASK, netip.AddrFrom4([4]byte{255, 255, 255, 254}), "netmask"); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("%s flags: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
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
	return writeResolv(RootDir, a)
}

// writeResolv writes root's /etc/resolv.conf naming nameserver a.
func writeResolv(root string, a netip.Addr) error {
	etc := filepath.Join(root, "etc")
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

// configureMAC is configureLink for the interface of hardware address
// mac, as a full OS's udev names it (linkOfMAC), configured again under
// its new name should udev rename it meanwhile (ENODEV: the old name is
// gone; once up, it keeps its name).
func configureMAC(mac string, addr, gw netip.Addr) error {
	deadline := time.Now().Add(linkWait)
	for {
		name, err := linkOfMAC(mac, time.Until(deadline))
		if err != nil {
			return err
		}
		err = configureLink(name, addr, gw, true)
		if !errors.Is(err, unix.ENODEV) || time.Now().After(deadline) {
			return err
		}
		log.Printf("network: %s renamed while being configured: again", name)
	}
}

// linkWait bounds the wait for a full OS's interface (linkOfMAC): its
// udev loads the driver and names the interface during the boot, which
// the agent may answer before; a loaded node under TCG boots in minutes.
const linkWait = 2 * time.Minute

// linkOfMAC is the name of the interface whose hardware address is mac,
// once the OS's udev is done naming it. udev may rename a new interface
// (eth0 to enp0s5: ID_NET_NAME in its database entry, /run/udev/data/n
// and its index), and the kernel refuses to rename one that is up; the
// entry is written before the rename (ID_RENAMING=1, systemd 252), so
// done is the entry there naming the interface as it is called now.
// (The fullvm image boots with net.ifnames=0, so udev keeps eth0; this
// holds on an image that does not.) Without udev running (no
// /run/udev/control) the kernel's name stands; after renameWait the
// interface is configured under whatever name it has (a rename that
// never comes must not cost the sandbox its network).
func linkOfMAC(mac string, within time.Duration) (string, error) {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return "", fmt.Errorf("network: MAC address %q: %w", mac, err)
	}
	deadline := time.Now().Add(within)
	var seen time.Time
	for ; ; time.Sleep(20 * time.Millisecond) {
		ifs, err := net.Interfaces()
		if err != nil {
			return "", fmt.Errorf("network: list interfaces: %w", err)
		}
		for _, ifc := range ifs {
			if !bytes.Equal(ifc.HardwareAddr, hw) {
				continue
			}
			if seen.IsZero() {
				seen = time.Now()
			}
			if udevNamed(ifc.Index, ifc.Name) {
				return ifc.Name, nil
			}
			if time.Since(seen) > renameWait {
				log.Printf("network: udev has not named %s (MAC %s) in %v: configured under that name", ifc.Name, mac, renameWait)
				return ifc.Name, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("network: no interface with MAC address %s within %v", mac, within)
		}
	}
}

// renameWait bounds the wait for udev's name once the interface is
// there: udev renames within seconds of the driver binding it (under
// 15 s of a TCG boot here).
const renameWait = 30 * time.Second

// udevNamed says udev is done naming interface index, now called name,
// or runs not at all.
func udevNamed(index int, name string) bool {
	if _, err := os.Stat("/run/udev/control"); err != nil {
		return true
	}
	b, err := os.ReadFile("/run/udev/data/n" + strconv.Itoa(index))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if want, ok := strings.CutPrefix(l, "E:ID_NET_NAME="); ok {
			return want == name
		}
	}
	return true // nothing to rename it to
}

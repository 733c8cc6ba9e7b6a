package microvm

import (
	"net/netip"
	"os"
	"strings"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
)

// Net is a VM's network: its tap's descriptor (netpolicy.AttachTap),
// passed to QEMU as fd 3, and the guest's end of the /31 with its
// gateway (the node's end, where the daemon's resolver answers).
type Net struct {
	Tap           *os.File
	Addr, Gateway netip.Addr
	// Resolv has the agent write the sandbox's resolv.conf naming the
	// gateway: the sandbox gets Warren's /etc files (Spec.Etc; not
	// with keep_etc), as a container's is written.
	Resolv bool
}

// deviceArgs are QEMU's arguments and the kernel command line's
// additions for cfg's network and disk, if any.
func deviceArgs(cfg Config) (args []string, cmdline string, _ error) {
	if n := cfg.Net; n != nil {
		// The guest's agent configures eth0 from the command line
		// (address, route, resolv.conf): no DHCP to wait for.
		cmdline += " warren.ip=" + n.Addr.String() + " warren.gw=" + n.Gateway.String()
		if n.Resolv {
			cmdline += " warren.dns=" + n.Gateway.String()
		}
		args = append(args, "-netdev", "tap,id=net0,fd=3",
			"-device", "virtio-net-device,netdev=net0")
	}
	if cfg.Disk != "" {
		if strings.ContainsAny(cfg.Disk, ",=") {
			return nil, "", errdefs.Invalidf("disk path %q has a character QEMU's option syntax takes (, or =)", cfg.Disk)
		}
		// The host's page cache is not the guest's memory: the
		// writes go to the sparse file, bounded by its size.
		cmdline += " warren.disk=1"
		args = append(args,
			"-drive", "file="+cfg.Disk+",if=none,id="+guest.DiskSerial+",format=raw,cache=unsafe,discard=unmap",
			"-device", "virtio-blk-device,drive="+guest.DiskSerial+",serial="+guest.DiskSerial)
	}
	return args, cmdline, nil
}

// deviceModules are the guest modules cfg's devices need beyond
// guestModules. Each set of modules is an initramfs of its own (cached by
// content), so a VM without a network or a disk loads and unpacks
// neither driver (ext4 is 2 MB): boot time matters.
func deviceModules(cfg Config) []string {
	var out []string
	if cfg.Net != nil {
		out = append(out, "virtio_net")
	}
	if cfg.Disk != "" {
		out = append(out, "ext4")
	}
	return out
}

var (
	_ backend.Networked = (*sandbox)(nil)
	_ backend.Resolved  = (*sandbox)(nil)
)

// NetworkAddress is the VM's address on the node's sandbox subnet, ""
// in mode none.
func (s *sandbox) NetworkAddress() string {
	if s.att == nil {
		return ""
	}
	_, addr := s.net.Addrs(s.att.Index)
	return addr.String()
}

// Nameserver is the VM's gateway, where Warren's resolver answers it;
// invalid in mode none.
func (s *sandbox) Nameserver() netip.Addr {
	if s.att == nil {
		return netip.Addr{}
	}
	gw, _ := s.net.Addrs(s.att.Index)
	return gw
}

package microvm

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Accelerators, the values of `warren serve --vm-accel`.
const (
	AccelAuto = "auto" // KVM where it can run stock guest kernels, else TCG
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// kvmAPIVersion is KVM_GET_API_VERSION's answer on every kernel since
// 2.6.22; the ioctl is _IO(KVMIO=0xAE, 0x00).
const (
	kvmAPIVersion    = 12
	kvmGetAPIVersion = 0xAE00
)

// ResolveAccel turns an --vm-accel value into whether VMs boot under KVM,
// and why, for the daemon's log. "auto" takes KVM when /dev/kvm answers
// as KVM does and is not PVM's: a host whose kvm_pvm module serves
// /dev/kvm (these development machines) runs only guests with a PVM
// kernel, and QEMU with Debian's stock kernel spins or aborts there
// ("failed to set MSR 0x10a"). "kvm" is taken as asked (a VM that then
// fails to boot says why); anything else is Invalid.
func ResolveAccel(v string) (kvm bool, why string, err error) {
	switch v {
	case AccelTCG:
		return false, "asked for (--vm-accel tcg)", nil
	case AccelKVM:
		return true, "asked for (--vm-accel kvm)", nil
	case AccelAuto, "":
		kvm, why := probeKVM("/dev/kvm", "/sys/module/kvm_pvm")
		return kvm, why, nil
	default:
		return false, "", errdefs.Invalidf("--vm-accel %q: auto, kvm or tcg", v)
	}
}

// probeKVM: dev opens read-write and answers KVM_GET_API_VERSION with 12,
// and pvm (the kvm_pvm module's directory) is absent.
func probeKVM(dev, pvm string) (bool, string) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Sprintf("no usable %s (%v): TCG", dev, err)
	}
	defer unix.Close(fd)
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil || v != kvmAPIVersion {
		return false, fmt.Sprintf("%s answers KVM_GET_API_VERSION with %d (%v), not %d: TCG", dev, v, err, kvmAPIVersion)
	}
	if _, err := os.Stat(pvm); err == nil {
		return false, fmt.Sprintf("%s is PVM's (%s), which runs only PVM guest kernels: TCG", dev, pvm)
	}
	return true, dev + " is KVM"
}

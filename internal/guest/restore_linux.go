package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// ioctls of random(4): RNDADDENTROPY (_IOW('R', 3, int[2])) mixes bytes
// into the input pool crediting their entropy; RNDRESEEDCRNG (_IO('R', 7))
// reseeds the generator from it now.
const (
	rndAddEntropy = 0x40085203
	rndReseedCRNG = 0x5207
	maxSeedBytes  = 512
)

// restored is "restored": the VM was restored from a checkpoint, with
// the memory of the moment it was saved. Its random number generator's
// state is the checkpoint's (every fork of one checkpoint would draw the
// same numbers), so the host's seed is mixed in and the generator
// reseeded at once; its clock stood still while the VM was on disk, so
// it is set to the host's.
func restored(w io.Writer, r *Restored) {
	if r == nil || len(r.Seed) == 0 || len(r.Seed) > maxSeedBytes {
		fail(w, errdefs.Invalid, errors.New("restored: a seed of 1 to 512 bytes is needed"))
		return
	}
	if err := reseed(r.Seed); err != nil {
		fail(w, errdefs.Internal, err)
		return
	}
	if r.UnixNano > 0 {
		ts := unix.NsecToTimespec(r.UnixNano)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			fail(w, errdefs.Internal, fmt.Errorf("set the clock: %w", err))
			return
		}
	}
	_ = WriteFrame(w, KindExit, []byte("{}"))
}

func reseed(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reseed: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info: entropy_count (bits), buf_size (bytes), buf.
	buf := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(seed)))
	copy(buf[8:], seed)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("reseed: RNDADDENTROPY: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndReseedCRNG, 0); e != 0 {
		return fmt.Errorf("reseed: RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// renetwork is "network": the VM was restored on another tap, whose /31
// may be another (a fork's always is): eth0 takes the new address and
// gateway. Connections of the old address end. A full OS's agent gets
// its network so after the boot (its kernel command line is the image's):
// the interface named by n.MAC, and the resolver in root's resolv.conf.
func renetwork(w io.Writer, n *Network, root string) {
	var addr, gw, ns netip.Addr
	var err error
	if n != nil {
		if addr, err = netip.ParseAddr(n.Addr); err == nil {
			gw, err = netip.ParseAddr(n.Gateway)
		}
		if err == nil && n.Nameserver != "" {
			ns, err = netip.ParseAddr(n.Nameserver)
		}
	}
	if n == nil || err != nil || !addr.Is4() || !gw.Is4() {
		fail(w, errdefs.Invalid, fmt.Errorf("network: an IPv4 address and gateway are needed (%v)", err))
		return
	}
	if n.MAC != "" {
		err = configureMAC(n.MAC, addr, gw)
	} else {
		err = configureLink("eth0", addr, gw, true)
	}
	if err != nil {
		fail(w, errdefs.Internal, err)
		return
	}
	if ns.IsValid() {
		if err := writeResolv(root, ns); err != nil {
			fail(w, errdefs.Internal, fmt.Errorf("network: resolv.conf: %w", err))
			return
		}
	}
	_ = WriteFrame(w, KindExit, []byte("{}"))
}

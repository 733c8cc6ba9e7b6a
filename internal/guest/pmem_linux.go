package guest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// pmemLayers are the guest-physical addresses of the layers the host
// mapped as persistent memory (warren.pmem=ADDR,ADDR..., hex, bottom
// layer first), or nil where they are virtio block devices. The host maps
// each layer file as a read-only part of the guest's memory and marks it
// persistent (memmap=SIZE!ADDR); the kernel's legacy pmem driver makes
// it /dev/pmemN, which EROFS mounts with DAX: the guest reads the host's
// page cache of the file and keeps no copy of its own.
func pmemLayers() []uint64 {
	v := cmdlineString("pmem")
	if v == "" {
		return nil
	}
	var out []uint64
	for _, s := range strings.Split(v, ",") {
		a, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
		if err != nil {
			return nil
		}
		out = append(out, a)
	}
	return out
}

// findPmem is the pmem block device whose namespace starts at addr.
func findPmem(addr uint64, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		rs, _ := filepath.Glob("/sys/block/pmem*/device/resource")
		for _, p := range rs {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			a, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 64)
			if err != nil || a != addr {
				continue
			}
			dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p)))
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no pmem device at %#x after %v", addr, wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

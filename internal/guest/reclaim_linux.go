package guest

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
)

// reclaim drops the guest's clean page cache and reclaimable slab, then
// compacts its free memory: the balloon's free page reporting returns
// only whole free blocks (2 MiB), and scattered frees make few of them.
// The sandbox's files live on tmpfs (the overlay's upper, /tmp) and are
// not dropped; nor is anonymous memory (the guest has no swap).
func (s *server) reclaim(st net.Conn) {
	var r ReclaimResult
	r.FreeBefore, r.CachedBefore = meminfo()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		fail(st, errdefs.Internal, fmt.Errorf("drop caches: %w", err))
		return
	}
	// Best effort: a kernel without compaction still reports what is
	// whole already.
	_ = os.WriteFile("/proc/sys/vm/compact_memory", []byte("1"), 0)
	r.FreeAfter, r.CachedAfter = meminfo()
	b, _ := json.Marshal(r)
	_ = WriteFrame(st, KindExit, b)
}

// meminfo is the guest's MemFree and Cached, in bytes.
func meminfo() (free, cached uint64) {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "MemFree":
			free = n << 10
		case "Cached":
			cached = n << 10
		}
	}
	return free, cached
}

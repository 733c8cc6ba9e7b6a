package bench

import (
	"bufio"
	"bytes"
	"os"
	"sort"
	"strconv"
	"strings"
)

// readSlabinfo returns the bytes held by each slab cache (active objects
// times object size), or nil where /proc/slabinfo is not readable.
func readSlabinfo() map[string]int64 {
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return nil
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// name active_objs num_objs objsize ...; the header lines start
		// with "slabinfo" and "#".
		if len(f) < 4 || f[0] == "slabinfo" || strings.HasPrefix(f[0], "#") {
			continue
		}
		active, err1 := strconv.ParseInt(f[1], 10, 64)
		size, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 == nil && err2 == nil {
			out[f[0]] += active * size
		}
	}
	return out
}

// SlabDelta is one slab cache's growth per sandbox.
type SlabDelta struct {
	Cache string  `json:"cache"`
	KiB   float64 `json:"kib"`
}

// topSlabDeltas returns the k caches that grew most from before to after,
// per n sandboxes: where the kernel's share of a sandbox goes.
func topSlabDeltas(before, after map[string]int64, n float64, k int) []SlabDelta {
	if before == nil || after == nil || n <= 0 {
		return nil
	}
	var out []SlabDelta
	for name, a := range after {
		if d := float64(a-before[name]) / 1024 / n; d >= 0.5 {
			out = append(out, SlabDelta{Cache: name, KiB: round(d, 1)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].KiB > out[j].KiB })
	if len(out) > k {
		out = out[:k]
	}
	return out
}

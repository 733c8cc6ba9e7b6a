package cli

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// byteUnits are the suffixes parseBytes accepts, Kubernetes style: binary
// with "i", decimal without.
var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"B", 1},
}

// parseBytes parses a size such as 512Mi, 1.5Gi, 100M or 4096.
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num, mult := s, 1.0
	// Longest suffix first, so "KiB" is not read as "B".
	best := ""
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) && len(u.suffix) > len(best) {
			best, num, mult = u.suffix, strings.TrimSuffix(s, u.suffix), u.mult
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("invalid size %q (examples: 512Mi, 2Gi, 100M, 4096)", s)
	}
	v := f * mult
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return int64(math.Round(v)), nil
}

// formatBytes prints a size with a binary unit.
func formatBytes(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + "B"
	}
	units := []string{"Ki", "Mi", "Gi", "Ti", "Pi"}
	f := float64(n)
	i := -1
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f >= 100 || f == math.Trunc(f) {
		return fmt.Sprintf("%.0f%s", f, units[i])
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}

// parseKVs parses repeated KEY=VALUE flags.
func parseKVs(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--%s wants KEY=VALUE, got %q", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

func formatKVs(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

func stateName(s warrenv1.SandboxState) string {
	if _, ok := warrenv1.SandboxState_name[int32(s)]; !ok {
		// A newer daemon's state.
		return fmt.Sprintf("state-%d", int32(s))
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "SANDBOX_STATE_"))
}

// formatAge prints how long ago unixMs was, coarsely.
func formatAge(unixMs int64, now time.Time) string {
	if unixMs == 0 {
		return "-"
	}
	return humanDuration(now.Sub(time.UnixMilli(unixMs)))
}

// formatExpiry prints the time left until unixMs.
func formatExpiry(unixMs int64, now time.Time) string {
	if unixMs == 0 {
		return "never"
	}
	d := time.UnixMilli(unixMs).Sub(now)
	if d <= 0 {
		return "expired"
	}
	return humanDuration(d)
}

func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

func formatCPU(millis int64) string {
	if millis == 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(millis)/1000, 'f', -1, 64)
}

func formatTime(unixMs int64) string {
	if unixMs == 0 {
		return "-"
	}
	return time.UnixMilli(unixMs).Local().Format(time.RFC3339)
}

// durationSeconds rounds a duration up to whole seconds.
func durationSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

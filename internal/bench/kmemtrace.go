package bench

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// KmemSite is one kernel call site's slab objects that a sandbox keeps
// allocated, per sandbox.
type KmemSite struct {
	Site    string  `json:"site"`  // the allocating function
	Cache   string  `json:"cache"` // slab cache, or kmalloc-<size> ("-cg" when memcg-accounted)
	Objects float64 `json:"objects"`
	KiB     float64 `json:"kib"`
}

// kmemTrace is the result of tracing the slab allocations of a few extra
// sandboxes: which call sites the memory they keep comes from.
type kmemTrace struct {
	Sandboxes int
	KiB       float64 // all live objects / sandboxes
	Sites     []KmemSite
	Overrun   bool // the trace buffer lost events: the numbers undercount
}

var kmemEvents = []string{"kmalloc", "kfree", "kmem_cache_alloc", "kmem_cache_free"}

// tracefsDir finds the mounted tracefs.
func tracefsDir() (string, error) {
	for _, d := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if _, err := os.Stat(filepath.Join(d, "events/kmem/kmalloc/enable")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no tracefs with kmem events (mount -t tracefs none /sys/kernel/tracing)")
}

// traceKmem runs f (which creates n sandboxes) with the kernel's kmem
// tracepoints on, then drops the caches and waits for RCU frees, and
// returns the slab objects allocated meanwhile that are still allocated,
// by call site, divided by n. Everything the machine allocates in that
// window counts (the daemon, kernel workers), so the machine should be
// otherwise idle. Pointers in the trace are hashed but stable within a
// boot, which is all the matching of allocations to frees needs.
func traceKmem(n int, f func() error) (*kmemTrace, error) {
	dir, err := tracefsDir()
	if err != nil {
		return nil, err
	}
	w := func(file, v string) error { return os.WriteFile(filepath.Join(dir, file), []byte(v), 0) }
	oldSize, _ := os.ReadFile(filepath.Join(dir, "buffer_size_kb"))
	oldOverwrite, _ := os.ReadFile(filepath.Join(dir, "options/overwrite"))
	restore := func() {
		_ = w("tracing_on", "0")
		for _, e := range kmemEvents {
			_ = w("events/kmem/"+e+"/enable", "0")
		}
		_ = w("trace", "")
		if s := strings.TrimSpace(string(oldSize)); s != "" && !strings.Contains(s, "expanded") {
			_ = w("buffer_size_kb", s)
		}
		if s := strings.TrimSpace(string(oldOverwrite)); s != "" {
			_ = w("options/overwrite", s)
		}
	}
	defer restore()
	if err := w("tracing_on", "0"); err != nil {
		return nil, fmt.Errorf("tracefs: %w", err)
	}
	_ = w("trace", "")
	// A full buffer drops new events rather than the oldest: the
	// allocations at the start are the ones that matter (a lost free makes
	// an object look kept, a lost allocation hides it).
	_ = w("options/overwrite", "0")
	// ~7,000 events per sandbox at ~60 bytes each, per CPU at worst.
	if err := w("buffer_size_kb", strconv.Itoa(max(16<<10, n*1024))); err != nil {
		return nil, fmt.Errorf("trace buffer: %w", err)
	}
	for _, e := range kmemEvents {
		if err := w("events/kmem/"+e+"/enable", "1"); err != nil {
			return nil, fmt.Errorf("enable kmem:%s: %w", e, err)
		}
	}
	if err := w("tracing_on", "1"); err != nil {
		return nil, err
	}
	ferr := f()
	// Transient objects (dentries of lookups, RCU-freed ones) go now.
	dropCaches()
	time.Sleep(2 * time.Second)
	dropCaches()
	_ = w("tracing_on", "0")
	if ferr != nil {
		return nil, ferr
	}
	tr, err := parseKmemTrace(filepath.Join(dir, "trace"), n)
	if err != nil {
		return nil, err
	}
	cpus, _ := filepath.Glob(filepath.Join(dir, "per_cpu/cpu*/stats"))
	for _, c := range cpus {
		b, _ := os.ReadFile(c)
		for _, l := range strings.Split(string(b), "\n") {
			for _, k := range []string{"overrun: ", "dropped events: "} {
				if v, ok := strings.CutPrefix(l, k); ok && strings.TrimSpace(v) != "0" {
					tr.Overrun = true
				}
			}
		}
	}
	return tr, nil
}

var kmemLine = regexp.MustCompile(`(kmalloc|kmem_cache_alloc|kfree|kmem_cache_free): call_site=(\S+) ptr=(\S+)(?: name=(\S+))?(?: bytes_req=\d+ bytes_alloc=(\d+))?.*?(?:accounted=(\w+))?$`)

func parseKmemTrace(path string, n int) (*kmemTrace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type obj struct {
		site, cache string
		bytes       int
	}
	live := map[string]obj{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := kmemLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		switch m[1] {
		case "kfree", "kmem_cache_free":
			delete(live, m[3])
			continue
		}
		b, _ := strconv.Atoi(m[5])
		cache := m[4]
		if cache == "" {
			cache = "kmalloc-" + strconv.Itoa(b)
			if m[6] == "true" {
				cache = "kmalloc-cg-" + strconv.Itoa(b)
			}
		}
		site, _, _ := strings.Cut(m[2], "+")
		live[m[3]] = obj{site, cache, b}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	type key struct{ site, cache string }
	bytes, count := map[key]int{}, map[key]int{}
	total := 0
	for _, o := range live {
		k := key{o.site, o.cache}
		bytes[k] += o.bytes
		count[k]++
		total += o.bytes
	}
	tr := &kmemTrace{Sandboxes: n, KiB: round(float64(total)/1024/float64(n), 1)}
	for k, b := range bytes {
		tr.Sites = append(tr.Sites, KmemSite{Site: k.site, Cache: k.cache,
			Objects: round(float64(count[k])/float64(n), 2), KiB: round(float64(b)/1024/float64(n), 2)})
	}
	slices.SortFunc(tr.Sites, func(a, b KmemSite) int {
		return cmp.Or(cmp.Compare(b.KiB, a.KiB), cmp.Compare(a.Site, b.Site), cmp.Compare(a.Cache, b.Cache))
	})
	return tr, nil
}

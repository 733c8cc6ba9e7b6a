package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/warrenrl/warren/internal/testutil"
)

// Lines in the kernel's format: three allocations, one of them freed, and
// a free of something allocated before the trace began.
const sampleTrace = `# tracer: nop
 warren-1 [001] ..... 1.000001: kmalloc: call_site=alloc_pipe_info+0xd7/0x230 ptr=00000000aaaaaaaa bytes_req=640 bytes_alloc=1024 gfp_flags=GFP_KERNEL_ACCOUNT|__GFP_ZERO node=-1 accounted=true
 warren-1 [001] ..... 1.000002: kmem_cache_alloc: call_site=alloc_empty_file+0x3c/0x110 ptr=00000000bbbbbbbb name=filp bytes_req=184 bytes_alloc=192 gfp_flags=GFP_KERNEL node=-1 accounted=true
 warren-1 [001] ..... 1.000003: kmalloc: call_site=alloc_shrinker_info+0x5d/0x230 ptr=00000000cccccccc bytes_req=520 bytes_alloc=1024 gfp_flags=GFP_KERNEL node=-1 accounted=false
 warren-1 [001] ..... 1.000004: kmem_cache_free: call_site=__fput+0x141/0x2a0 ptr=00000000bbbbbbbb name=filp
 warren-1 [001] ..... 1.000005: kfree: call_site=ida_alloc_range+0x39b/0x400 ptr=00000000dddddddd
`

func TestParseKmemTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace")
	if err := os.WriteFile(path, []byte(sampleTrace), 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := parseKmemTrace(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []KmemSite{
		{Site: "alloc_pipe_info", Cache: "kmalloc-cg-1024", Objects: 0.5, KiB: 0.5},
		{Site: "alloc_shrinker_info", Cache: "kmalloc-1024", Objects: 0.5, KiB: 0.5},
	}
	if tr.KiB != 1 || len(tr.Sites) != len(want) || tr.Sites[0] != want[0] || tr.Sites[1] != want[1] {
		t.Errorf("got %.2f KiB %+v, want 1 KiB %+v", tr.KiB, tr.Sites, want)
	}
}

// TestTraceKmem traces the kernel for real: memory cgroups created while
// tracing show up under the functions that allocate them.
func TestTraceKmem(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := tracefsDir(); err != nil {
		t.Skip(err)
	}
	root := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(root, "memory.limit_in_bytes")); err != nil {
		root = "/sys/fs/cgroup" // cgroup v2
	}
	base := filepath.Join(root, "warren-kmemtrace-"+strconv.Itoa(os.Getpid()))
	const n = 4
	t.Cleanup(func() {
		for i := 0; i < n; i++ {
			os.Remove(filepath.Join(base, strconv.Itoa(i)))
		}
		os.Remove(base)
	})
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	tr, err := traceKmem(n, func() error {
		for i := 0; i < n; i++ {
			if err := os.Mkdir(filepath.Join(base, strconv.Itoa(i)), 0o755); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range tr.Sites {
		if s.Site == "mem_cgroup_css_alloc" && s.Objects >= 1 {
			found = true
		}
	}
	if !found || tr.KiB <= 0 {
		t.Errorf("no mem_cgroup_css_alloc objects among %.1f KiB per cgroup: %+v", tr.KiB, tr.Sites[:min(len(tr.Sites), 10)])
	}
	t.Logf("%.1f KiB of slab per memory cgroup; top: %+v", tr.KiB, tr.Sites[:min(len(tr.Sites), 5)])
}

package guest

// ReclaimResult is the "reclaim" op's answer: the guest's free memory
// and page cache (/proc/meminfo, bytes) before and after it dropped its
// caches.
type ReclaimResult struct {
	FreeBefore, FreeAfter     uint64 `json:",omitempty"`
	CachedBefore, CachedAfter uint64 `json:",omitempty"`
}

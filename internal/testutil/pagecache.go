package testutil

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// DropFromCache evicts path's pages from the page cache, so that the next
// read of it goes to the disk.
func DropFromCache(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

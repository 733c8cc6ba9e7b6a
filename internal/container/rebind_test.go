package container

import (
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// TestThrowawayThreadNeverMain: fn never runs on the process's main
// thread, which the runtime would keep in whatever state fn left it (a
// sandbox's mount namespace, which /proc/self would then show).
func TestThrowawayThreadNeverMain(t *testing.T) {
	var onMain, ran atomic.Int32
	var wg sync.WaitGroup
	for range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = throwawayThread(func() error {
				ran.Add(1)
				if unix.Gettid() == unix.Getpid() {
					onMain.Add(1)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	if ran.Load() != 400 || onMain.Load() != 0 {
		t.Fatalf("ran %d of 400, %d on the main thread", ran.Load(), onMain.Load())
	}
}

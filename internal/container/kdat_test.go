package container

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCRIUKdatCache: a CRIU process the backend starts loads its kernel
// data from the daemon's cache instead of probing the kernel, sees every
// entry of the node's /run where it is, and the node's /run is left as it
// was (no criu.kdat appears there).
func TestCRIUKdatCache(t *testing.T) {
	requireCRIU(t)
	hostHad := fileExists("/run/criu.kdat")
	before, err := os.ReadDir("/run")
	if err != nil {
		t.Fatal(err)
	}
	warmKdat()
	for deadline := time.Now().Add(20 * time.Second); currentKdat() == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no kernel data cache 20 s after warming it")
		}
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "check.log")
	cmd := exec.Command(CRIUPath, "check", "-v4", "-o", log)
	if err := startCRIU(cmd.Start); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "Loaded kdat cache from /run/criu.kdat") {
		t.Errorf("CRIU did not load the cache: %s", b)
	}
	// What such a CRIU sees in /run: the node's entries and the cache.
	ls := exec.Command("ls", "-A", "/run")
	var out strings.Builder
	ls.Stdout = &out
	if err := startCRIU(ls.Start); err != nil {
		t.Fatal(err)
	}
	if err := ls.Wait(); err != nil {
		t.Fatal(err)
	}
	seen := strings.Fields(out.String())
	for _, e := range before {
		if strings.HasPrefix(e.Name(), "criu.kdat") {
			continue // the node's leftovers are not bound in
		}
		if !slices.Contains(seen, e.Name()) {
			t.Errorf("/run/%s is not in CRIU's /run (%v)", e.Name(), seen)
		}
	}
	if !slices.Contains(seen, "criu.kdat") {
		t.Errorf("no criu.kdat in CRIU's /run: %v", seen)
	}
	if !hostHad && fileExists("/run/criu.kdat") {
		t.Errorf("the node's /run got a criu.kdat")
	}
	// Many starts, and the process's own view (/proc/self, the main
	// thread's) never becomes a private one: no start ran on the main
	// thread, which outlives it.
	for range 100 {
		c := exec.Command("true")
		if err := startCRIU(c.Start); err != nil {
			t.Fatal(err)
		}
		_ = c.Wait()
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), "warren-criu-run") {
		t.Errorf("the process's main thread is in a CRIU mount namespace")
	}
}

package microvm

import (
	"fmt"
	"os"
	"testing"

	"github.com/warrenrl/warren/internal/cgroups"
)

// TestMain gives this process's VMs a cgroup parent of their own, which
// it removes at the end (a leftover group makes that fail loudly).
func TestMain(m *testing.M) {
	defaultCgroupParent = fmt.Sprintf("warren-test-microvm-%d", os.Getpid())
	code := m.Run()
	if os.Geteuid() == 0 {
		if err := cgroups.RemoveParent(defaultCgroupParent); err != nil {
			fmt.Fprintln(os.Stderr, "remove the test cgroup parent:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

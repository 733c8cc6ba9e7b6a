package fullvm

import (
	"fmt"
	"os"
	"testing"

	"github.com/warrenrl/warren/internal/cgroups"
)

// testCgroupParent is this process's parent of the VMs' QEMU cgroups,
// removed at the end (a leftover group makes that fail loudly).
var testCgroupParent = fmt.Sprintf("warren-test-fullvm-%d", os.Getpid())

func TestMain(m *testing.M) {
	code := m.Run()
	if os.Geteuid() == 0 {
		if err := cgroups.RemoveParent(testCgroupParent); err != nil {
			fmt.Fprintln(os.Stderr, "remove the test cgroup parent:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

package fullvm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/testutil"
)

// testNetwork gives the test its own sandbox networking: a name (nftables
// table, interface prefix) and a subnet no other process takes
// (testutil.Subnet), and removes whatever its sandboxes left when it ends.
func testNetwork(t *testing.T) netpolicy.Options {
	return conformance.NodeNetwork(t, fmt.Sprintf("warren-test-fullvm-%d", os.Getpid()), testutil.Subnet(t), Name)
}

// TestConformance runs the shared backend suite on full VMs. Not in the
// default run: each sub-test boots a Debian VM (about a minute under TCG
// here), and what VMs refuse fails (docs/FULLVM.md lists what passes).
// WARREN_FULLVM_CONFORMANCE=1 runs it; WARREN_FULLVM_TRANSPORT=vsock
// over vsock.
func TestConformance(t *testing.T) {
	if os.Getenv("WARREN_FULLVM_CONFORMANCE") != "1" {
		t.Skip("minutes per sub-test under TCG, and the fullvm backend does not pass the whole suite (docs/FULLVM.md): WARREN_FULLVM_CONFORMANCE=1 runs it")
	}
	img := testImage(t)
	state := t.TempDir()
	netOpts := testNetwork(t)
	conformance.Run(t, conformance.Harness{
		FixedCPUs: true,
		New: func(t *testing.T) backend.Backend {
			// Each backend its own node, as each daemon: the suite
			// adopts and sweeps with fresh ones.
			n, err := netpolicy.New(netOpts)
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(Options{StateDir: state, CgroupParent: testCgroupParent, ImageDir: img, Network: n,
				Transport: os.Getenv("WARREN_FULLVM_TRANSPORT")})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		// The root is the image's disk: layers are passed, not used.
		Layers: func(t *testing.T) []backend.Layer { return testLayers },
		// The whole VM is the sandbox: PID 1 is the image's systemd.
		Init:         "systemd",
		WholeMachine: true,
		// TCG on a loaded node, as microvm's.
		Patience: time.Minute,
		// Each a Debian boot of ~20 CPU-seconds under TCG: 16 at once on
		// 2 cores took the node's load to ~40 and past the boot timeout.
		Concurrent: 4,
		Resources: func(t *testing.T) []string {
			var out []string
			ents, _ := os.ReadDir(filepath.Join(state, "vms"))
			for _, e := range ents {
				out = append(out, "vm dir "+e.Name())
			}
			procs, _ := os.ReadDir("/proc")
			for _, p := range procs {
				b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
				if err == nil && strings.Contains(string(b), state) {
					out = append(out, "process "+strings.ReplaceAll(string(b), "\x00", " ")[:40])
				}
			}
			groups, _ := cgroups.List(testCgroupParent)
			for _, g := range groups {
				out = append(out, "cgroup "+g)
			}
			return append(out, conformance.NetworkResources(t, netOpts)...)
		},
		Kill: func(t *testing.T, sb backend.Sandbox) {
			if err := syscall.Kill(sb.(*sandbox).VMPid(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
	})
}

package microvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
)

// TestConformance runs the shared backend suite on microVMs.
func TestConformance(t *testing.T) {
	cfg := testConfig(t)
	state := t.TempDir()
	var once sync.Once
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T) backend.Backend {
			b, err := New(Options{StateDir: state, QEMU: cfg.QEMU, GuestAgent: cfg.GuestAgent})
			if err != nil {
				t.Fatal(err)
			}
			once.Do(func() {})
			return b
		},
		Layers: func(t *testing.T) []backend.Layer {
			return []backend.Layer{{Digest: "sha256:busybox", Blob: cfg.Layers[0]}}
		},
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
			return out
		},
		Kill: func(t *testing.T, sb backend.Sandbox) {
			pid := sb.(*sandbox).vm.Pid()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
	})
	_ = exec.Command
	_ = strconv.Itoa
}

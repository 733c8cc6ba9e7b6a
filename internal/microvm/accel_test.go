package microvm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/errdefs"
)

// TestResolveAccel: auto takes KVM only from a /dev/kvm that answers as
// KVM and is not PVM's; explicit values are taken; others are Invalid.
func TestResolveAccel(t *testing.T) {
	if kvm, _, err := ResolveAccel(AccelTCG); kvm || err != nil {
		t.Errorf("tcg: %v %v", kvm, err)
	}
	if kvm, _, err := ResolveAccel(AccelKVM); !kvm || err != nil {
		t.Errorf("kvm: %v %v", kvm, err)
	}
	if _, _, err := ResolveAccel("hvf"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "auto, kvm or tcg") {
		t.Errorf("hvf: %v, want invalid naming the values", err)
	}
	dir := t.TempDir()
	// Not a KVM device: a regular file answers no ioctl.
	notKVM := filepath.Join(dir, "kvm")
	if err := os.WriteFile(notKVM, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if kvm, why := probeKVM(notKVM, filepath.Join(dir, "pvm")); kvm || !strings.Contains(why, "KVM_GET_API_VERSION") {
		t.Errorf("a regular file as /dev/kvm: %v %q", kvm, why)
	}
	if kvm, why := probeKVM(filepath.Join(dir, "none"), filepath.Join(dir, "pvm")); kvm || !strings.Contains(why, "no usable") {
		t.Errorf("no /dev/kvm: %v %q", kvm, why)
	}
	// The node's own: a real /dev/kvm, PVM's or not.
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skipf("no /dev/kvm on this node: %v", err)
	}
	_, pvmErr := os.Stat("/sys/module/kvm_pvm")
	kvm, why := probeKVM("/dev/kvm", "/sys/module/kvm_pvm")
	if pvmErr == nil && (kvm || !strings.Contains(why, "PVM")) {
		t.Errorf("a PVM host's /dev/kvm: %v %q, want TCG because of PVM", kvm, why)
	}
	// A KVM /dev/kvm without PVM: auto must take it.
	if kvm2, why2 := probeKVM("/dev/kvm", filepath.Join(dir, "pvm")); !kvm2 {
		t.Errorf("/dev/kvm without kvm_pvm: %q, want KVM", why2)
	}
	t.Logf("auto on this node: KVM %v (%s)", kvm, why)
}

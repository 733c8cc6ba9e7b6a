package fullvm

import (
	"bufio"
	"context"
	"image/color"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/netpolicy"
)

// TestReadPPM: a screendump's PPM (comments and all whitespace QEMU or
// another writer may put in its header) decodes to its pixels; what is
// not a P6 of maxval 255 is refused.
func TestReadPPM(t *testing.T) {
	data := "P6\n# a comment\n2 1\n255\n" + "\x01\x02\x03\xfa\xfb\xfc"
	img, err := readPPM(bufio.NewReader(strings.NewReader(data)))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 2 || b.Dy() != 1 {
		t.Fatalf("bounds %v", b)
	}
	if c := img.At(1, 0); c != (color.NRGBA{0xfa, 0xfb, 0xfc, 0xff}) {
		t.Fatalf("pixel (1,0) %v", c)
	}
	for _, bad := range []string{"P5\n2 1\n255\n\x00\x00", "P6\n2 1\n65535\n", "P6\n2 1\n255\n\x00", "P6 x"} {
		if _, err := readPPM(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestScale: the pointer's pixel maps onto QEMU's absolute axis, its
// corners to 0 and the axis's end.
func TestScale(t *testing.T) {
	if scale(0, 1280) != 0 || scale(1279, 1280) != absMax || scale(640, 1281) != absMax/2 {
		t.Fatalf("scale: %d %d %d", scale(0, 1280), scale(1279, 1280), scale(640, 1281))
	}
}

// testLayers stand for an image's layers, which the daemon always passes
// and a fullvm VM does not use (its root is the disk image): a directory
// that is there, as a missing one is refused.
var testLayers = []backend.Layer{{Digest: "sha256:unused", Dir: "/"}}

// TestCreateWithoutImageNamesTheScript: a node without the image refuses
// a fullvm create as Unsupported, saying which script builds it, and
// leaves no VM directory.
func TestCreateWithoutImageNamesTheScript(t *testing.T) {
	state := t.TempDir()
	b, err := New(Options{StateDir: state, CgroupParent: testCgroupParent, QEMU: "/bin/true", QEMUImg: "/bin/true", ImageDir: t.TempDir() + "/none"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Create(context.Background(), backend.Spec{ID: "x", Layers: testLayers})
	if errdefs.CategoryOf(err) != errdefs.Unsupported || !strings.Contains(err.Error(), ImageScript) {
		t.Fatalf("create without an image: %v, want unsupported naming %s", err, ImageScript)
	}
	if _, err := b.Create(context.Background(), backend.Spec{ID: "y", Layers: testLayers, DiskBytes: 1 << 30}); errdefs.CategoryOf(err) != errdefs.Unsupported {
		t.Fatalf("create with a disk limit: %v, want unsupported", err)
	}
	if _, err := b.Create(context.Background(), backend.Spec{ID: "z"}); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("create without layers: %v, want invalid", err)
	}
	// Without the node's sandbox networking a policy that allows
	// anything is refused, not dropped.
	open := netpolicy.Policy{Mode: netpolicy.Open}
	if _, err := b.Create(context.Background(), backend.Spec{ID: "n", Layers: testLayers, Network: open}); errdefs.CategoryOf(err) != errdefs.Unsupported || !strings.Contains(err.Error(), "no sandbox networking") {
		t.Fatalf("create with a network and no node networking: %v, want unsupported", err)
	}
	// An image whose features file does not say "network" (its agent
	// would configure eth0, which udev renames) is refused before a
	// boot.
	img := t.TempDir()
	for f, body := range map[string]string{"disk.qcow2": "", "features": "disk-limit\n"} {
		if err := os.WriteFile(filepath.Join(img, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := netpolicy.New(netpolicy.Options{Name: "warren-test-fullvm-unit"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	old, err := New(Options{StateDir: state, CgroupParent: testCgroupParent, QEMU: "/bin/true", QEMUImg: "/bin/true", ImageDir: img, Network: n})
	if err != nil {
		t.Fatal(err)
	}
	_, err = old.Create(context.Background(), backend.Spec{ID: "old", Layers: testLayers, Network: open})
	if errdefs.CategoryOf(err) != errdefs.Unsupported || !strings.Contains(err.Error(), ImageScript) {
		t.Fatalf("create with a network on an image from before: %v, want unsupported naming %s", err, ImageScript)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) > 0 {
		t.Fatalf("VM directories left: %v", ents)
	}
}

// TestGuestMAC: each /31 of a subnet of up to a /16 gives its VM's
// interface a MAC address of its own, a unicast one of QEMU's prefix.
func TestGuestMAC(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1<<16; i += 2 {
		a := netip.AddrFrom4([4]byte{10, 234, byte(i >> 8), byte(i + 1)})
		m := guestMAC(a)
		hw, err := net.ParseMAC(m)
		if err != nil || len(hw) != 6 || !strings.HasPrefix(m, "52:54:00:") || seen[m] {
			t.Fatalf("guestMAC(%s) = %q (%v): want a new 52:54:00 address", a, m, err)
		}
		seen[m] = true
	}
}

package e2e

import (
	"bytes"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/fullvm"
	"github.com/warrenrl/warren/internal/guestkernel"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestFullVMThroughTheAPI: with backend "fullvm", a sandbox is a q35 VM
// of the Debian image booted by its own boot loader, whose agent (a
// systemd service) runs exec; Screenshot gives a PNG of a screen that is
// not blank, SendInput's text is typed into the shell on the screen (the
// guest runs it), Sandbox.vnc names a VNC socket. Created with an
// allowlist, the VM reaches the allowed test host and not the other,
// through its virtio-net device on a tap of the node; its gateway and
// resolver are the node's end; Update moves it to the other host, and the
// rules survive a daemon restart (the microvm backend's sweep, whose taps
// share the node, leaves the full VM's alone); a VM cannot lose its
// network device (Unsupported, nothing changes). Delete leaves no QEMU,
// VM directory, tap, network namespace or nftables rule of it. One VM for
// all of it: each boot is ~30 s of TCG.
func TestFullVMThroughTheAPI(t *testing.T) {
	img := fullVMImage(t)
	// The microvm backend too (where the node boots microVMs), as a
	// daemon runs them: its sweep at the restart must keep the full VM's
	// tap.
	args := []string{"--fullvm-image", img}
	if _, err := guestkernel.Find(guestkernel.Dir); err == nil {
		args = append(args, "--guest-agent", testutil.StaticBinary(t, "./cmd/warren-guest"))
	}
	e := newEnv(t, envOptions{serveArgs: args})
	ctx := ctxFor(t, 12*time.Minute)
	h := newTwoHosts(t)
	t0 := time.Now()
	sb := e.create(&warrenv1.CreateRequest{Id: "fv1", Image: imageName, Backend: "fullvm",
		Network: policy("allowlist", rule(h.a.Addr.String()+"/32", 0, ""))})
	t.Logf("create to RUNNING: %v", time.Since(t0))
	if _, err := os.Stat(sb.GetVnc()); err != nil || !strings.HasPrefix(sb.GetVnc(), e.stateDir) {
		t.Fatalf("Sandbox.vnc %q: %v", sb.GetVnc(), err)
	}
	if r := e.sh("fv1", "cat /proc/1/comm; hostname"); string(r.GetStdout()) != "systemd\nfv1\n" {
		t.Fatalf("exec in the full VM: %q %q", r.GetStdout(), r.GetStderr())
	}

	// The screen and the keyboard.
	shot, err := e.c.Screenshot(ctx, "fv1")
	if err != nil {
		t.Fatal(err)
	}
	png1, err := png.Decode(bytes.NewReader(shot.GetPng()))
	if err != nil {
		t.Fatal(err)
	}
	if png1.Bounds() != image.Rect(0, 0, int(shot.GetWidth()), int(shot.GetHeight())) || !notBlank(png1) {
		t.Fatalf("screenshot %dx%d (%v): blank or the wrong size", shot.GetWidth(), shot.GetHeight(), png1.Bounds())
	}
	// Typed into tty1's shell (root logged in there by the image), run
	// by it: its output is on the first console's screen (/dev/vcs1).
	// The shell may not be up yet: typed again until it is.
	var screen string
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); {
		if err := e.c.SendInput(ctx, "fv1", nil, "echo typed-$((6*7))\n"); err != nil {
			t.Fatal(err)
		}
		for poll := time.Now().Add(20 * time.Second); time.Now().Before(poll); time.Sleep(time.Second) {
			screen = string(e.sh("fv1", "cat /dev/vcs1").GetStdout())
			if strings.Contains(screen, "typed-42") {
				break
			}
		}
		if strings.Contains(screen, "typed-42") {
			break
		}
	}
	if !strings.Contains(screen, "typed-42") {
		t.Fatalf("the typed command's output is not on the screen: %q", screen)
	}
	if err := e.c.SendInput(ctx, "fv1", nil, "é"); !client.IsInvalid(err) {
		t.Fatalf("text with no US key: %v, want invalid", err)
	}
	if err := e.c.SendInput(ctx, "fv1", []*warrenv1.SendInputEvent{{Kind: "key", Key: "no-such-key"}}, ""); !client.IsInvalid(err) {
		t.Fatalf("an unknown key: %v, want invalid", err)
	}
	e.create(&warrenv1.CreateRequest{Id: "ct1"})
	if _, err := e.c.Screenshot(ctx, "ct1"); !client.IsUnsupported(err) {
		t.Fatalf("a container's screenshot: %v, want unsupported", err)
	}

	// The network.
	gw := e.gateway("fv1")
	if gw == "" || sb.GetNetworkAddress() == "" {
		t.Fatalf("gateway %q, network address %q", gw, sb.GetNetworkAddress())
	}
	if got := e.shOK("fv1", "grep ^nameserver /etc/resolv.conf"); got != "nameserver "+gw+"\n" {
		t.Errorf("resolv.conf: %q, want the gateway %s", got, gw)
	}
	h.policyMoves(ctx, t, e, "fv1")

	if err := e.c.Delete(ctx, "fv1"); err != nil {
		t.Fatal(err)
	}
	vms := filepath.Join(e.stateDir, "fullvm", "vms")
	vmGone(t, filepath.Join(vms, "fv1"))
	if ents, _ := os.ReadDir(vms); len(ents) > 0 {
		t.Errorf("VM directories left: %v", ents)
	}
	if out, _ := exec.Command("pgrep", "-f", vms).Output(); len(out) > 0 {
		t.Errorf("QEMU processes left: %s", out)
	}
	e.expectNoResources("fv1", "after delete")
}

// notBlank: some pixel differs from the first.
func notBlank(img image.Image) bool {
	r := img.Bounds()
	bg := img.At(r.Min.X, r.Min.Y)
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if img.At(x, y) != bg {
				return true
			}
		}
	}
	return false
}

// fullVMImage builds the fullvm image with this tree's agent, as `make
// build` builds it (cached per agent: seconds once the rootfs is), and
// returns its directory: not the shared name the script points at it,
// which another build on the node may move before the daemon boots a VM.
// It skips where the node cannot build or boot one.
func fullVMImage(t *testing.T) string {
	t.Helper()
	for _, c := range []string{"qemu-system-x86_64", "qemu-img", "debootstrap"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("no %s: the fullvm image cannot be built or booted here", c)
		}
	}
	root := testutil.ModuleRoot()
	agent := filepath.Join(t.TempDir(), "warren-guest")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", agent, "./cmd/warren-guest")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(root, fullvm.ImageScript), agent).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("debootstrap failed")) {
			t.Skipf("debootstrap failed (no network to the mirror?):\n%s", out)
		}
		t.Fatalf("%s: %v\n%s", fullvm.ImageScript, err, out)
	}
	// Its last line: "<dir>/bookworm -> bookworm-<key> (...)", <dir>
	// $WARREN_VM_DIR/images.
	m := regexp.MustCompile(`(?m)(\S+) -> (\S+) \(`).FindAllSubmatch(out, -1)
	if len(m) == 0 {
		t.Fatalf("%s named no image:\n%s", fullvm.ImageScript, out)
	}
	last := m[len(m)-1]
	return filepath.Join(filepath.Dir(string(last[1])), string(last[2]))
}

package image

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBuildDebian runs debootstrap (minutes, network to the apt mirror,
// root): only with WARREN_TEST_DEBIAN=1.
func TestBuildDebian(t *testing.T) {
	if os.Getenv("WARREN_TEST_DEBIAN") != "1" {
		t.Skip("set WARREN_TEST_DEBIAN=1 to run debootstrap")
	}
	if os.Geteuid() != 0 {
		t.Skip("debootstrap needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	dst := filepath.Join(t.TempDir(), "debian")
	var progress bytes.Buffer
	start := time.Now()
	if err := BuildDebian(ctx, dst, &progress); err != nil {
		t.Fatalf("BuildDebian: %v\n%s", err, tail(progress.String(), 4000))
	}
	t.Logf("debootstrap took %v", time.Since(start).Round(time.Second))
	if !strings.Contains(progress.String(), "Base system installed successfully") {
		t.Errorf("progress lacks debootstrap's success line:\n%s", tail(progress.String(), 2000))
	}
	for _, p := range []string{"usr/bin/python3", "usr/bin/git", "etc/debian_version"} {
		if _, err := os.Stat(filepath.Join(dst, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	if debs, _ := filepath.Glob(filepath.Join(dst, "var/cache/apt/archives/*.deb")); len(debs) > 0 {
		t.Errorf("apt cache not cleaned: %d debs", len(debs))
	}
	if lists, _ := filepath.Glob(filepath.Join(dst, "var/lib/apt/lists/*_Packages")); len(lists) > 0 {
		t.Errorf("apt lists not cleaned: %v", lists)
	}
	for _, argv := range [][]string{{"/usr/bin/python3", "-c", "print(6*7)"}, {"/usr/bin/git", "--version"}} {
		out, err := exec.CommandContext(ctx, "chroot", append([]string{dst}, argv...)...).CombinedOutput()
		if err != nil {
			t.Errorf("chroot %v: %v\n%s", argv, err, out)
		}
		t.Logf("%v: %s", argv, strings.TrimSpace(string(out)))
	}

	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	img, err := s.ImportDir(ctx, "debian:bookworm", dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("import took %v: %+v", time.Since(start).Round(time.Second), img)
	dirs, release, err := s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := os.Stat(filepath.Join(dirs[0], "usr/bin/python3")); err != nil {
		t.Fatal(err)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

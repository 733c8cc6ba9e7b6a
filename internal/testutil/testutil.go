// Package testutil holds helpers shared by tests that need real parts: a
// statically linked binary to serve as sandbox init, a busybox image, root.
package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	binMu    sync.Mutex
	binCache = map[string]string{}
)

// RequireRoot skips a test that needs root; CI runs as root, so there the
// test always runs.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, mounts, cgroups)")
	}
}

// ModuleRoot returns the repository root.
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// StaticBinary builds the main package pkg (a path relative to the module
// root, e.g. "./cmd/warren") statically, as `make build` does (pure Go,
// CGO_ENABLED=0), once per test process, and returns its path. A binary
// that stands in for a sandbox's init runs in roots that have no libc.
func StaticBinary(t testing.TB, pkg string) string {
	t.Helper()
	return Binary(t, pkg, "CGO_ENABLED=0")
}

// Binary builds the main package pkg with a plain `go build` in the
// environment plus env (e.g. "CGO_ENABLED=1": the default, dynamically
// linked build), once per test process and env, and returns its path.
func Binary(t testing.TB, pkg string, env ...string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	key := strings.Join(append([]string{pkg}, env...), " ")
	if p, ok := binCache[key]; ok {
		return p
	}
	dir := scratchDir(t)
	out := filepath.Join(dir, strings.NewReplacer("/", "_", ".", "_", " ", "_", "=", "_").Replace(key))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = ModuleRoot()
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s (%s): %v\n%s", pkg, strings.Join(env, " "), err, b)
	}
	binCache[key] = out
	return out
}

// BusyboxRoot returns a directory holding a busybox root filesystem, built
// once per test process from the busybox-static package's binary.
func BusyboxRoot(t testing.TB) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binCache["busybox-root"]; ok {
		return p
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal("busybox not found: apt-get install busybox-static")
	}
	dir := filepath.Join(scratchDir(t), "busybox-root")
	for _, d := range []string{"bin", "etc", "tmp", "root", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.Chmod(filepath.Join(dir, "tmp"), 0o1777)
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Fields(string(list)) {
		if a != "busybox" {
			_ = os.Symlink("busybox", filepath.Join(dir, "bin", a))
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	binCache["busybox-root"] = dir
	return dir
}

// scratchDir returns a directory for this test process's cached binaries
// and roots: <tmp>/warren-test/<pid>. Test processes cannot clean up after
// themselves (the cache outlives each test), so each one removes the
// directories of processes that no longer exist.
func scratchDir(t testing.TB) string {
	t.Helper()
	base := filepath.Join(os.TempDir(), "warren-test")
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != os.Getpid() {
			if _, err := os.Stat("/proc/" + e.Name()); os.IsNotExist(err) {
				_ = os.RemoveAll(filepath.Join(base, e.Name()))
			}
		}
	}
	dir := filepath.Join(base, strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

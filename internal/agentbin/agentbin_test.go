package agentbin

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/testutil"
)

// TestEmbeddedAgents: this build embeds the agent for its own
// architecture, and each committed agent is an ELF for its architecture.
func TestEmbeddedAgents(t *testing.T) {
	if err := Check(Binary(), runtime.GOARCH); err != nil {
		t.Fatal(err)
	}
	for arch := range machines {
		b, err := os.ReadFile("warren-agent-" + arch)
		if err != nil {
			t.Fatal(err)
		}
		if err := Check(b, arch); err != nil {
			t.Errorf("warren-agent-%s: %v", arch, err)
		}
		if arch == runtime.GOARCH && !bytes.Equal(b, Binary()) {
			t.Errorf("the embedded agent is not warren-agent-%s", arch)
		}
	}
}

// TestCheckRefusesWrongMachine: an agent for another architecture (the
// arm64 one on amd64 and back), no agent, and a file that is not an ELF
// are refused, each with what to do.
func TestCheckRefusesWrongMachine(t *testing.T) {
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}
	for arch, o := range other {
		b, err := os.ReadFile("warren-agent-" + o)
		if err != nil {
			t.Fatal(err)
		}
		err = Check(b, arch)
		if errdefs.CategoryOf(err) != errdefs.Internal || !strings.Contains(err.Error(), "built for linux/"+o) ||
			!strings.Contains(err.Error(), "this daemon is linux/"+arch) || !strings.Contains(err.Error(), "go generate ./internal/agentbin") {
			t.Errorf("%s agent on %s: %v", o, arch, err)
		}
	}
	bin := Binary()
	for name, c := range map[string]struct {
		bin    []byte
		arch   string
		cat    errdefs.Category
		substr string
	}{
		"riscv64":   {bin, "riscv64", errdefs.Unsupported, "no sandbox agent is built for linux/riscv64"},
		"empty":     {nil, runtime.GOARCH, errdefs.Internal, "embeds no sandbox agent"},
		"not ELF":   {[]byte("#!/bin/sh\necho hi\n"), runtime.GOARCH, errdefs.Internal, "not an ELF"},
		"truncated": {bin[:40], runtime.GOARCH, errdefs.Internal, "not an ELF"},
	} {
		err := Check(c.bin, c.arch)
		if errdefs.CategoryOf(err) != c.cat || !strings.Contains(err.Error(), c.substr) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A dynamically linked executable of the right machine: this test's
	// own binary where it is one.
	if self, err := os.ReadFile("/proc/self/exe"); err == nil && bytes.Contains(self[:min(len(self), 4096)], []byte("/ld-linux")) {
		if err := Check(self, runtime.GOARCH); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Errorf("dynamic executable: %v", err)
		}
	}
}

// TestFileAgent: without a memfd the agent is written to <dir>/agent,
// root-owned, mode 0555, and exec'd from there; a later start reuses the
// file, one that differs is replaced, and one changed after the check is
// refused before it runs.
func TestFileAgent(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	var warned []string
	a, err := Open(Options{Dirs: []string{dir}, NoMemfd: true, Warn: func(msg string, args ...any) { warned = append(warned, msg) }})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.Path(), filepath.Join(dir, "agent", "warren-agent-")) || len(warned) != 1 {
		t.Fatalf("path %q, warnings %q", a.Path(), warned)
	}
	var st unix.Stat_t
	if err := unix.Stat(a.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o555 || st.Uid != 0 {
		t.Errorf("mode %o uid %d", st.Mode&0o7777, st.Uid)
	}
	if err := unix.Stat(filepath.Dir(a.Path()), &st); err != nil || st.Mode&0o777 != 0o700 {
		t.Errorf("agent directory mode %o: %v", st.Mode&0o777, err)
	}
	f, err := a.File()
	if err != nil {
		t.Fatal(err)
	}
	assertRuns(t, f)

	// A second start finds the same file and keeps it.
	var ino uint64
	if err := unix.Stat(a.Path(), &st); err == nil {
		ino = st.Ino
	}
	a2, err := Open(Options{Dirs: []string{dir}, NoMemfd: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(a2.Path(), &st); err != nil || st.Ino != ino || a2.Path() != a.Path() {
		t.Errorf("second start did not reuse %s: %s, %v", a.Path(), a2.Path(), err)
	}
	a2.f.Close()

	// Changed after the check: refused at the next use.
	if err := os.Chmod(a.Path(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.Path(), []byte("#!/bin/sh\ntouch /tmp/pwned\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := a.File(); errdefs.CategoryOf(err) != errdefs.Internal || !strings.Contains(err.Error(), "changed after the daemon wrote it") {
		t.Errorf("changed agent: %v", err)
	}
	// ... and replaced by the next start.
	a3, err := Open(Options{Dirs: []string{dir}, NoMemfd: true})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(a3.Path()); err != nil || !bytes.Equal(b, Binary()) {
		t.Errorf("the next start did not rewrite the agent: %v", err)
	}
	if f, err := a3.File(); err != nil {
		t.Error(err)
	} else {
		assertRuns(t, f)
	}
	ents, _ := os.ReadDir(filepath.Dir(a3.Path()))
	if len(ents) != 1 {
		t.Errorf("agent directory holds %d entries, want 1", len(ents))
	}
	a3.f.Close()
	a.f.Close()
}

// TestFileAgentNoexec: a directory on a noexec filesystem is skipped for
// the next one; with none left the error says why.
func TestFileAgentNoexec(t *testing.T) {
	testutil.RequireRoot(t)
	noexec, ok := t.TempDir(), t.TempDir()
	if err := unix.Mount("tmpfs", noexec, "tmpfs", unix.MS_NOEXEC, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(noexec, unix.MNT_DETACH) })
	a, err := Open(Options{Dirs: []string{noexec, ok}, NoMemfd: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.Path(), ok+"/") {
		t.Errorf("agent at %s, want below %s", a.Path(), ok)
	}
	a.f.Close()
	_, err = Open(Options{Dirs: []string{noexec}, NoMemfd: true})
	if errdefs.CategoryOf(err) != errdefs.Internal || !strings.Contains(err.Error(), noexec+": mounted noexec") {
		t.Errorf("only noexec: %v", err)
	}
}

// TestMemfdRefused: where the kernel refuses executable memfds
// (vm.memfd_noexec=2, set in a pid namespace of the test's own), Open
// falls back to the file, says so, and the file runs.
func TestMemfdRefused(t *testing.T) {
	if !testutil.RunWithNoexecMemfd(t) {
		return
	}
	if _, err := openMemfd(Binary()); !errors.Is(err, unix.EACCES) {
		t.Fatalf("executable memfd with vm.memfd_noexec=2: %v, want EACCES", err)
	}
	dir := t.TempDir()
	var warned []any
	a, err := Open(Options{Dirs: []string{dir}, Warn: func(msg string, args ...any) { warned = append(warned, msg); warned = append(warned, args...) }})
	if err != nil {
		t.Fatal(err)
	}
	if a.Path() == "" || len(warned) == 0 {
		t.Fatalf("not the file agent: path %q, warnings %v", a.Path(), warned)
	}
	t.Logf("warning: %v", warned)
	f, err := a.File()
	if err != nil {
		t.Fatal(err)
	}
	assertRuns(t, f)
}

// assertRuns execs f as a child's /proc/self/fd/3 with no variables: the
// agent then says it was not told what to be.
func assertRuns(t *testing.T, f *os.File) {
	t.Helper()
	cmd := exec.Command("/proc/self/fd/3")
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "is not set") {
		t.Errorf("agent run: %v, %q", err, out)
	}
}

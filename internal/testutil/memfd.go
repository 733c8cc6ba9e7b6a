package testutil

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// noexecMemfdEnv marks the inner run of RunWithNoexecMemfd.
const noexecMemfdEnv = "WARREN_TEST_NOEXEC_MEMFD"

// RunWithNoexecMemfd runs the calling test again in a new pid namespace
// whose vm.memfd_noexec is 2, where the kernel refuses executable memfds
// (the sysctl is per pid namespace since Linux 6.3, and a child namespace
// cannot relax it, so the host is untouched). It returns true in that
// inner run, which does the test's work; in the outer run it waits for
// the inner one, fails the test if it failed, and returns false.
//
// The inner run has its own /proc (unshare --mount-proc, in a private
// mount namespace) and its own TMPDIR: the scratch directory's sweep must
// not take the host's live test processes, whose pids it cannot see, for
// dead ones.
func RunWithNoexecMemfd(t *testing.T) bool {
	t.Helper()
	RequireRoot(t)
	if os.Getenv(noexecMemfdEnv) != "" {
		if b, err := os.ReadFile("/proc/sys/vm/memfd_noexec"); err != nil || strings.TrimSpace(string(b)) != "2" {
			t.Fatalf("inner run: vm.memfd_noexec is %q (%v), want 2", b, err)
		}
		return true
	}
	if _, err := os.Stat("/proc/sys/vm/memfd_noexec"); err != nil {
		t.Skip("kernel has no vm.memfd_noexec (Linux < 6.3)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare (util-linux) not found")
	}
	args := []string{"--pid", "--fork", "--mount-proc", "sh", "-c",
		`echo 2 > /proc/sys/vm/memfd_noexec && exec "$@"`, "sh",
		os.Args[0], "-test.run=^" + t.Name() + "$", "-test.count=1", "-test.v"}
	cmd := exec.Command(unshare, args...)
	cmd.Env = append(os.Environ(), noexecMemfdEnv+"=1", "TMPDIR="+t.TempDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("inner run with vm.memfd_noexec=2:\n%s", out.String())
	if err != nil {
		t.Fatalf("inner run failed: %v", err)
	}
	if !strings.Contains(out.String(), "--- PASS: "+t.Name()) {
		t.Fatalf("inner run did not pass %s", t.Name())
	}
	return false
}

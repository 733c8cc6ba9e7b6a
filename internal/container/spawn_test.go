package container

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fdSize reads a process's file table size (FDSize): an exec keeps the
// table it forked with.
func fdSize(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "FDSize:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no FDSize")
	return 0
}

// TestSpawnerForksFromASmallTable: an init spawned while the daemon holds
// thousands of descriptors (a pidfd per sandbox) starts with a file table
// of the default size, so the fork and the exec's close-on-exec pass do
// not grow with the node's sandboxes; a plain fork's child inherits the
// daemon's table size. The spawned process gets its files at the
// positions asked.
func TestSpawnerForksFromASmallTable(t *testing.T) {
	var fds []int
	t.Cleanup(func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	})
	for range 4000 {
		fd, err := unix.FcntlInt(0, unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Skipf("cannot hold 4,000 descriptors: %v", err)
		}
		fds = append(fds, fd)
	}
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	run := func(files []*os.File) (pid, pidfd int) {
		pid, pidfd, err := spawnInit("/bin/sh", files, 0)
		if err != nil {
			t.Fatal(err)
		}
		return pid, pidfd
	}
	// spawnInit passes argv[0] "warren-init": sh reads the script from
	// its stdin.
	script, err := os.CreateTemp(t.TempDir(), "script")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := script.WriteString("echo started >&3; exec sleep 30\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := script.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	if sharedSpawner() == nil {
		t.Skip("no spawner on this kernel (unshare(CLONE_FILES) or pidfd_getfd refused)")
	}
	pid, pidfd := run([]*os.File{script, out, out, out})
	defer func() {
		_ = unix.Kill(pid, unix.SIGKILL)
		_, _ = unix.Wait4(pid, nil, 0, nil)
		_ = unix.Close(pidfd)
	}()
	for i := 0; ; i++ {
		b, _ := os.ReadFile(out.Name())
		if strings.Contains(string(b), "started") {
			break
		}
		if i > 1000 {
			t.Fatalf("the spawned shell did not write to its fd 3: %q", b)
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil)
	}
	if n := fdSize(t, pid); n > 256 {
		t.Errorf("spawned init's file table holds %d slots: it was forked from the daemon's", n)
	}

	// The same from the daemon's own table, for contrast.
	plain, err := os.StartProcess("/bin/sleep", []string{"sleep", "30"}, &os.ProcAttr{Sys: &syscall.SysProcAttr{}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = plain.Kill(); _, _ = plain.Wait() }()
	for i := 0; i < 500 && fdSize(t, plain.Pid) < 4000; i++ {
		unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil) // until it is past its exec
	}
	if n := fdSize(t, plain.Pid); n < 4000 {
		t.Errorf("a plain fork's child has %d slots, want the daemon's 4,000+: FDSize does not show what this test relies on", n)
	}
}

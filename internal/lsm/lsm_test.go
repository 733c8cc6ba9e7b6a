package lsm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/testutil"
)

const childEnv = "_WARREN_LSM_TEST_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(child(dir))
	}
	os.Exit(m.Run())
}

// probe makes the calls the policy refuses and prints each errno.
func probe() string {
	var out []string
	fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	if e == 0 {
		unix.Close(int(fd))
	}
	out = append(out, "vsock="+name(e))
	mnt, err := os.MkdirTemp("", "lsm-mnt-")
	if err == nil {
		merr := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k")
		if merr == nil {
			unix.Unmount(mnt, 0)
		}
		out = append(out, "mount="+errName(merr))
		os.Remove(mnt)
	}
	f, err := os.CreateTemp("", "lsm-ioctl-")
	if err == nil {
		flags := uint32(0x80) // FS_NOATIME_FL
		_, _, e := unix.RawSyscall(unix.SYS_IOCTL, f.Fd(), unix.FS_IOC_SETFLAGS, uintptr(unsafe.Pointer(&flags)))
		out = append(out, "setflags="+name(e))
		f.Close()
		os.Remove(f.Name())
	}
	return strings.Join(out, " ")
}

func name(e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	return unix.ErrnoName(e)
}

func errName(err error) string {
	var e syscall.Errno
	if err == nil {
		return "ok"
	}
	if errors.As(err, &e) {
		return name(e)
	}
	return err.Error()
}

// child moves itself into the cgroup at dir, then probes.
func child(dir string) int {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		fmt.Println("join cgroup:", err)
		return 1
	}
	fmt.Println(probe())
	return 0
}

// unifiedRoot is the cgroup v2 hierarchy: /sys/fs/cgroup on v2,
// /sys/fs/cgroup/unified on the hybrid layout.
func unifiedRoot(t *testing.T) string {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	t.Skip("no cgroup v2 hierarchy on this node (pure v1): the policy keys sandboxes by their v2 cgroup")
	return ""
}

// TestPolicyRefusesOnlyInSandboxCgroups loads the policy on the real
// kernel, names one cgroup as a sandbox's, and checks that a root process
// in it is refused a vsock socket, a mount and FS_IOC_SETFLAGS (each of
// which succeeds for the same process outside it), with one event per
// refusal carrying the cgroup's id.
func TestPolicyRefusesOnlyInSandboxCgroups(t *testing.T) {
	testutil.RequireRoot(t)
	g, err := Load()
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	dir := filepath.Join(unifiedRoot(t), fmt.Sprintf("warren-lsm-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(dir)
	id, err := CgroupID(dir)
	if err != nil {
		t.Fatal(err)
	}

	run := func(in string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+in)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	// Not yet a sandbox's cgroup: everything works.
	if got := run(dir); got != "vsock=ok mount=ok setflags=ok" {
		t.Fatalf("outside the policy: %s (the probes must succeed for the test to mean anything)", got)
	}
	if err := g.Add(id); err != nil {
		t.Fatal(err)
	}
	if got := run(dir); got != "vsock=EPERM mount=EPERM setflags=EPERM" {
		t.Errorf("in a sandbox's cgroup: %s", got)
	}
	want := map[Hook]uint64{HookSocket: afVsock, HookMount: 0, HookIoctl: 0x6602}
	evs := make(chan Event, 8)
	go func() {
		for {
			ev, err := g.Read()
			if err != nil {
				close(evs)
				return
			}
			evs <- ev
		}
	}()
	deadline := time.After(5 * time.Second)
	for len(want) > 0 {
		select {
		case ev := <-evs:
			if ev.CgroupID != id {
				t.Errorf("event %v of cgroup %d, want %d", ev, ev.CgroupID, id)
			}
			arg, ok := want[ev.Hook]
			if ok && (ev.Hook != HookIoctl && ev.Arg != arg || ev.Hook == HookIoctl && ev.Arg&0xffff != arg) {
				t.Errorf("event %v: arg %#x, want %#x", ev, ev.Arg, arg)
			}
			delete(want, ev.Hook)
		case <-deadline:
			t.Fatalf("no event for %v", want)
		}
	}
	// Out of the policy again once removed.
	if err := g.Remove(id); err != nil {
		t.Fatal(err)
	}
	if got := run(dir); got != "vsock=ok mount=ok setflags=ok" {
		t.Errorf("after Remove: %s", got)
	}
}

package seccomp

import (
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

const childEnv = "_WARREN_SECCOMP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// install puts this whole process (every thread: TSYNC) under the
// default filter, with no_new_privs, as the init stage does.
func install() error {
	f, err := Default()
	if err != nil {
		return err
	}
	b, err := hex.DecodeString(f)
	if err != nil {
		return err
	}
	prog := unix.SockFprog{Len: uint16(len(b) / 8), Filter: (*unix.SockFilter)(unsafe.Pointer(&b[0]))}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return e
	}
	return nil
}

// probes are calls made under the filter and the errno each must give
// (0: success).
var probes = []struct {
	name string
	call func() syscall.Errno
	want syscall.Errno
}{
	{"getpid", func() syscall.Errno { _, _, e := unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0); return e }, 0},
	{"bpf", func() syscall.Errno { _, _, e := unix.RawSyscall(unix.SYS_BPF, 0, 0, 0); return e }, unix.EPERM},
	{"perf_event_open", func() syscall.Errno {
		_, _, e := unix.RawSyscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0, 0, 0, 0)
		return e
	}, unix.EPERM},
	{"userfaultfd", func() syscall.Errno { _, _, e := unix.RawSyscall(unix.SYS_USERFAULTFD, 0, 0, 0); return e }, unix.EPERM},
	{"keyctl", func() syscall.Errno { _, _, e := unix.RawSyscall(unix.SYS_KEYCTL, 0, 0, 0); return e }, unix.EPERM},
	{"unshare user namespace", func() syscall.Errno {
		_, _, e := unix.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)
		return e
	}, unix.EPERM},
	{"clone3", func() syscall.Errno { _, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0); return e }, unix.ENOSYS},
	{"socket vsock", func() syscall.Errno {
		_, _, e := unix.RawSyscall(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0)
		return e
	}, unix.EAFNOSUPPORT},
	{"ioctl FICLONE, high bits set", func() syscall.Errno {
		_, _, e := unix.RawSyscall(unix.SYS_IOCTL, 1, 0xffffffff00000000|unix.FICLONE, 0)
		return e
	}, unix.EOPNOTSUPP},
	{"ioctl FS_IOC_SETFLAGS", func() syscall.Errno {
		_, _, e := unix.RawSyscall(unix.SYS_IOCTL, 1, unix.FS_IOC_SETFLAGS, 0)
		return e
	}, unix.EPERM},
	{"sync", func() syscall.Errno { _, _, e := unix.RawSyscall(unix.SYS_SYNC, 0, 0, 0); return e }, 0},
	{"unknown call 1023", func() syscall.Errno { _, _, e := unix.RawSyscall(1023, 0, 0, 0); return e }, unix.ENOSYS},
}

func child() int {
	if err := install(); err != nil {
		os.Stdout.WriteString("install: " + err.Error() + "\n")
		return 1
	}
	for _, p := range probes {
		os.Stdout.WriteString(p.name + "=" + strconvErrno(p.call()) + "\n")
	}
	return 0
}

func strconvErrno(e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	return unix.ErrnoName(e)
}

// TestKernelAppliesPolicy installs the compiled default filter in a child
// process on the real kernel and checks what each probed call returns:
// the kernel's verifier takes the program, and its verdicts are the
// policy's.
func TestKernelAppliesPolicy(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	for _, p := range probes {
		if want := strconvErrno(p.want); got[p.name] != want {
			t.Errorf("%s under the filter: %q, want %s", p.name, got[p.name], want)
		}
	}
}

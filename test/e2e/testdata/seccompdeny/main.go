// Command seccompdeny is a test program that runs inside a sandbox: it
// installs a seccomp filter with SECCOMP_FILTER_FLAG_LOG that refuses
// acct(2) with EPERM (what Warren's own logged filter will do to the
// calls it denies), calls acct, prints the error, and lives on for a
// second, so that the daemon can attribute the kernel's audit record to
// its sandbox by its pid.
package main

import (
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	runtime.LockOSThread() // the filter binds this thread only
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_ACCT},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "no_new_privs:", err)
		os.Exit(1)
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_LOG, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		fmt.Fprintln(os.Stderr, "seccomp:", e)
		os.Exit(1)
	}
	_, _, e := unix.Syscall(unix.SYS_ACCT, 0, 0, 0)
	fmt.Println(e.Error())
	time.Sleep(time.Second)
}

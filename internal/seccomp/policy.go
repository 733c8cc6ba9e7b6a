package seccomp

import (
	"fmt"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// The calls every sandbox may make, on both architectures: what programs
// of a normal Linux machine use, from shells and compilers to test suites
// and databases. Calls whose arguments matter are in checked(); calls
// that are refused on purpose are in denied().
var allowed = []uintptr{
	// Files and descriptors.
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_READV, unix.SYS_WRITEV, unix.SYS_PREAD64, unix.SYS_PWRITE64,
	unix.SYS_PREADV, unix.SYS_PWRITEV, unix.SYS_PREADV2, unix.SYS_PWRITEV2, unix.SYS_OPENAT, unix.SYS_OPENAT2,
	unix.SYS_CLOSE, unix.SYS_CLOSE_RANGE, unix.SYS_LSEEK, unix.SYS_FSTAT, unix.SYS_NEWFSTATAT, unix.SYS_STATX,
	unix.SYS_STATFS, unix.SYS_FSTATFS, unix.SYS_TRUNCATE, unix.SYS_FTRUNCATE, unix.SYS_FALLOCATE,
	unix.SYS_FSYNC, unix.SYS_FDATASYNC, unix.SYS_SYNC_FILE_RANGE, unix.SYS_FADVISE64, unix.SYS_READAHEAD,
	unix.SYS_GETDENTS64, unix.SYS_GETCWD, unix.SYS_CHDIR, unix.SYS_FCHDIR, unix.SYS_CHROOT,
	unix.SYS_MKDIRAT, unix.SYS_MKNODAT, unix.SYS_UNLINKAT, unix.SYS_RENAMEAT, unix.SYS_RENAMEAT2,
	unix.SYS_LINKAT, unix.SYS_SYMLINKAT, unix.SYS_READLINKAT, unix.SYS_FCHMOD, unix.SYS_FCHMODAT,
	unix.SYS_FCHMODAT2, unix.SYS_FCHOWN, unix.SYS_FCHOWNAT, unix.SYS_FACCESSAT, unix.SYS_FACCESSAT2,
	unix.SYS_UTIMENSAT, unix.SYS_UMASK, unix.SYS_DUP, unix.SYS_DUP3, unix.SYS_FCNTL, unix.SYS_FLOCK,
	unix.SYS_PIPE2, unix.SYS_SENDFILE, unix.SYS_SPLICE, unix.SYS_TEE, unix.SYS_VMSPLICE,
	unix.SYS_COPY_FILE_RANGE, unix.SYS_MEMFD_CREATE, unix.SYS_CACHESTAT,
	unix.SYS_SETXATTR, unix.SYS_LSETXATTR, unix.SYS_FSETXATTR, unix.SYS_GETXATTR, unix.SYS_LGETXATTR,
	unix.SYS_FGETXATTR, unix.SYS_LISTXATTR, unix.SYS_LLISTXATTR, unix.SYS_FLISTXATTR, unix.SYS_REMOVEXATTR,
	unix.SYS_LREMOVEXATTR, unix.SYS_FREMOVEXATTR, unix.SYS_SETXATTRAT, unix.SYS_GETXATTRAT,
	unix.SYS_LISTXATTRAT, unix.SYS_REMOVEXATTRAT,
	// Events and asynchronous I/O (io_uring is not here: see denied).
	unix.SYS_INOTIFY_INIT1, unix.SYS_INOTIFY_ADD_WATCH, unix.SYS_INOTIFY_RM_WATCH, unix.SYS_EVENTFD2,
	unix.SYS_SIGNALFD4, unix.SYS_TIMERFD_CREATE, unix.SYS_TIMERFD_SETTIME, unix.SYS_TIMERFD_GETTIME,
	unix.SYS_EPOLL_CREATE1, unix.SYS_EPOLL_CTL, unix.SYS_EPOLL_PWAIT, unix.SYS_EPOLL_PWAIT2,
	unix.SYS_PPOLL, unix.SYS_PSELECT6, unix.SYS_IO_SETUP, unix.SYS_IO_DESTROY, unix.SYS_IO_SUBMIT,
	unix.SYS_IO_CANCEL, unix.SYS_IO_GETEVENTS, unix.SYS_IO_PGETEVENTS,
	// Memory.
	unix.SYS_BRK, unix.SYS_MMAP, unix.SYS_MUNMAP, unix.SYS_MPROTECT, unix.SYS_MREMAP, unix.SYS_MSYNC,
	unix.SYS_MINCORE, unix.SYS_MADVISE, unix.SYS_PROCESS_MADVISE, unix.SYS_MLOCK, unix.SYS_MLOCK2,
	unix.SYS_MUNLOCK, unix.SYS_MLOCKALL, unix.SYS_MUNLOCKALL, unix.SYS_REMAP_FILE_PAGES,
	unix.SYS_MEMBARRIER, unix.SYS_MBIND, unix.SYS_SET_MEMPOLICY, unix.SYS_GET_MEMPOLICY,
	unix.SYS_SET_MEMPOLICY_HOME_NODE, unix.SYS_MIGRATE_PAGES, unix.SYS_MOVE_PAGES, unix.SYS_PKEY_ALLOC,
	unix.SYS_PKEY_FREE, unix.SYS_PKEY_MPROTECT, unix.SYS_MSEAL,
	// Processes, threads, signals, credentials, scheduling.
	unix.SYS_EXECVE, unix.SYS_EXECVEAT, unix.SYS_EXIT, unix.SYS_EXIT_GROUP, unix.SYS_WAIT4, unix.SYS_WAITID,
	unix.SYS_KILL, unix.SYS_TKILL, unix.SYS_TGKILL, unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK,
	unix.SYS_RT_SIGRETURN, unix.SYS_RT_SIGPENDING, unix.SYS_RT_SIGTIMEDWAIT, unix.SYS_RT_SIGQUEUEINFO,
	unix.SYS_RT_TGSIGQUEUEINFO, unix.SYS_RT_SIGSUSPEND, unix.SYS_SIGALTSTACK, unix.SYS_GETPID,
	unix.SYS_GETPPID, unix.SYS_GETTID, unix.SYS_GETUID, unix.SYS_GETEUID, unix.SYS_GETGID, unix.SYS_GETEGID,
	unix.SYS_GETRESUID, unix.SYS_GETRESGID, unix.SYS_GETGROUPS, unix.SYS_SETUID, unix.SYS_SETGID,
	unix.SYS_SETREUID, unix.SYS_SETREGID, unix.SYS_SETRESUID, unix.SYS_SETRESGID, unix.SYS_SETGROUPS,
	unix.SYS_SETFSUID, unix.SYS_SETFSGID, unix.SYS_GETPGID, unix.SYS_SETPGID, unix.SYS_GETSID,
	unix.SYS_SETSID, unix.SYS_CAPGET, unix.SYS_CAPSET, unix.SYS_PRCTL, unix.SYS_PERSONALITY,
	unix.SYS_GETPRIORITY, unix.SYS_SETPRIORITY, unix.SYS_SCHED_YIELD, unix.SYS_SCHED_GETAFFINITY,
	unix.SYS_SCHED_SETAFFINITY, unix.SYS_SCHED_GETPARAM, unix.SYS_SCHED_SETPARAM,
	unix.SYS_SCHED_GETSCHEDULER, unix.SYS_SCHED_SETSCHEDULER, unix.SYS_SCHED_GET_PRIORITY_MAX,
	unix.SYS_SCHED_GET_PRIORITY_MIN, unix.SYS_SCHED_RR_GET_INTERVAL, unix.SYS_SCHED_GETATTR,
	unix.SYS_SCHED_SETATTR, unix.SYS_GETRLIMIT, unix.SYS_SETRLIMIT, unix.SYS_PRLIMIT64, unix.SYS_GETRUSAGE,
	unix.SYS_TIMES, unix.SYS_SYSINFO, unix.SYS_UNAME, unix.SYS_SET_TID_ADDRESS, unix.SYS_SET_ROBUST_LIST,
	unix.SYS_GET_ROBUST_LIST, unix.SYS_FUTEX, unix.SYS_FUTEX_WAITV, unix.SYS_FUTEX_WAKE,
	unix.SYS_FUTEX_WAIT, unix.SYS_FUTEX_REQUEUE, unix.SYS_RSEQ, unix.SYS_RESTART_SYSCALL,
	unix.SYS_IOPRIO_GET, unix.SYS_IOPRIO_SET, unix.SYS_GETCPU,
	// Debuggers and process tools work on the sandbox's own processes:
	// PID 1 (the agent) is not dumpable, and no CAP_SYS_PTRACE.
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_KCMP,
	unix.SYS_PIDFD_OPEN, unix.SYS_PIDFD_SEND_SIGNAL, unix.SYS_PIDFD_GETFD,
	// Programs that sandbox themselves (browsers, systemd units,
	// build tools) stack their own filters and Landlock rules on ours.
	unix.SYS_SECCOMP, unix.SYS_LANDLOCK_CREATE_RULESET, unix.SYS_LANDLOCK_ADD_RULE,
	unix.SYS_LANDLOCK_RESTRICT_SELF,
	// Time: reading it; adjtimex without modes is a read, the kernel
	// refuses changes without CAP_SYS_TIME.
	unix.SYS_CLOCK_GETTIME, unix.SYS_CLOCK_GETRES, unix.SYS_CLOCK_NANOSLEEP, unix.SYS_NANOSLEEP,
	unix.SYS_GETTIMEOFDAY, unix.SYS_GETITIMER, unix.SYS_SETITIMER, unix.SYS_TIMER_CREATE,
	unix.SYS_TIMER_SETTIME, unix.SYS_TIMER_GETTIME, unix.SYS_TIMER_GETOVERRUN, unix.SYS_TIMER_DELETE,
	unix.SYS_ADJTIMEX, unix.SYS_CLOCK_ADJTIME,
	// Sockets (the family is checked in socket(2)).
	unix.SYS_SOCKETPAIR, unix.SYS_BIND, unix.SYS_LISTEN, unix.SYS_ACCEPT, unix.SYS_ACCEPT4,
	unix.SYS_CONNECT, unix.SYS_GETSOCKNAME, unix.SYS_GETPEERNAME, unix.SYS_SENDTO, unix.SYS_RECVFROM,
	unix.SYS_SENDMSG, unix.SYS_RECVMSG, unix.SYS_SENDMMSG, unix.SYS_RECVMMSG, unix.SYS_SETSOCKOPT,
	unix.SYS_GETSOCKOPT, unix.SYS_SHUTDOWN,
	// System V and POSIX IPC, in the sandbox's own IPC namespace.
	unix.SYS_MSGGET, unix.SYS_MSGSND, unix.SYS_MSGRCV, unix.SYS_MSGCTL, unix.SYS_SEMGET, unix.SYS_SEMOP,
	unix.SYS_SEMTIMEDOP, unix.SYS_SEMCTL, unix.SYS_SHMGET, unix.SYS_SHMAT, unix.SYS_SHMDT, unix.SYS_SHMCTL,
	unix.SYS_MQ_OPEN, unix.SYS_MQ_UNLINK, unix.SYS_MQ_TIMEDSEND, unix.SYS_MQ_TIMEDRECEIVE,
	unix.SYS_MQ_NOTIFY, unix.SYS_MQ_GETSETATTR,
	unix.SYS_GETRANDOM,
}

// denied are refused with EPERM: the kernel's shared state, and what
// agents have abused or kernel exploits lean on. Most also need a
// capability a sandbox lacks; the filter refuses them before the kernel
// parses a single argument.
var denied = []uintptr{
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE, unix.SYS_KEXEC_LOAD,
	unix.SYS_KEXEC_FILE_LOAD, unix.SYS_REBOOT, unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_ACCT,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD, unix.SYS_FANOTIFY_INIT,
	unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_KEYCTL,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG,
	unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_MOUNT_SETATTR,
	unix.SYS_SETNS, unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD,
	unix.SYS_NAME_TO_HANDLE_AT, unix.SYS_OPEN_BY_HANDLE_AT, // "shocker": a handle opens any inode of the filesystem
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_SETHOSTNAME, unix.SYS_SETDOMAINNAME,
	unix.SYS_SYSLOG, unix.SYS_VHANGUP, unix.SYS_NFSSERVCTL, unix.SYS_LOOKUP_DCOOKIE,
	unix.SYS_MEMFD_SECRET, unix.SYS_PROCESS_MRELEASE,
	// io_uring runs work in kernel threads beside the filter and has been
	// the source of many privilege escalations; programs fall back to
	// epoll and threads (ENOSYS, as Docker's profile answers).
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
}

// Namespace flags of clone(2) and unshare(2). Without CAP_SYS_ADMIN the
// kernel refuses all but a user namespace, and a user namespace gives
// its creator every capability inside it: mounts, netfilter, the kernel
// code paths most exploits need.
const (
	cloneNewNS      = 0x00020000
	cloneNewCgroup  = 0x02000000
	cloneNewUTS     = 0x04000000
	cloneNewIPC     = 0x08000000
	cloneNewUser    = 0x10000000
	cloneNewPID     = 0x20000000
	cloneNewNet     = 0x40000000
	cloneNewTime    = 0x00000080 // unshare only: in clone(2) these bits are the exit signal
	cloneNamespaces = cloneNewNS | cloneNewCgroup | cloneNewUTS | cloneNewIPC | cloneNewUser | cloneNewPID | cloneNewNet
)

// Ioctl commands by their type and number (the low 16 bits), so that
// every size and direction variant and the 32-bit compat ones match.
const ioctlCmdMask = 0xffff

// deniedIoctls are filesystem-metadata and terminal ioctls. On the
// sandbox's own files most are harmless, but the filesystem beneath is
// the node's: XFS_IOC_SWAPEXT once shut a production filesystem down.
var deniedIoctls = []struct {
	cmd   uint32
	errno syscall.Errno
}{
	{0x586d, unix.EPERM},      // XFS_IOC_SWAPEXT
	{0x660f, unix.EPERM},      // EXT4_IOC_MOVE_EXT
	{0x6602, unix.EPERM},      // FS_IOC_SETFLAGS (and FS_IOC32_SETFLAGS)
	{0x5820, unix.EPERM},      // FS_IOC_FSSETXATTR (project ids and flags)
	{0x587d, unix.EPERM},      // FS_IOC_SHUTDOWN / XFS_IOC_GOINGDOWN
	{0x5877, unix.EPERM},      // FIFREEZE
	{0x5878, unix.EPERM},      // FITHAW
	{0x5879, unix.EPERM},      // FITRIM
	{0x6611, unix.EPERM},      // EXT4_IOC_SWAP_BOOT
	{0x662c, unix.EPERM},      // EXT4_IOC_SETFSUUID
	{0x9432, unix.EPERM},      // FS_IOC_SETFSLABEL
	{0x9409, unix.EOPNOTSUPP}, // FICLONE: cp --reflink=auto falls back to a copy
	{0x940d, unix.EOPNOTSUPP}, // FICLONERANGE
	{0x9436, unix.EOPNOTSUPP}, // FIDEDUPERANGE
	{0x5412, unix.EPERM},      // TIOCSTI: typing into another process's terminal
	{0x541c, unix.EPERM},      // TIOCLINUX
}

// afVsock is refused: vsock is not namespaced, so a connect could reach
// the hypervisor host of a VM node or its other guests.
const afVsock = 40

func checked() map[uintptr]Rule {
	ioctl := Rule{Action: Allow}
	for _, d := range deniedIoctls {
		ioctl.Checks = append(ioctl.Checks, ArgCheck{Arg: 1, Op: MaskedEqual, Mask: ioctlCmdMask, Value: d.cmd, Action: Errno(d.errno)})
	}
	return map[uintptr]Rule{
		unix.SYS_IOCTL: ioctl,
		unix.SYS_CLONE: {Action: Allow, Checks: []ArgCheck{
			{Arg: 0, Op: AnyBits, Mask: cloneNamespaces, Action: Errno(unix.EPERM)}}},
		unix.SYS_UNSHARE: {Action: Allow, Checks: []ArgCheck{
			{Arg: 0, Op: AnyBits, Mask: cloneNamespaces | cloneNewTime, Action: Errno(unix.EPERM)}}},
		// clone3 passes its flags in memory, which a filter cannot read:
		// ENOSYS makes glibc and musl fall back to clone, which is checked.
		unix.SYS_CLONE3: {Action: Errno(unix.ENOSYS)},
		unix.SYS_SOCKET: {Action: Allow, Checks: []ArgCheck{
			{Arg: 0, Op: MaskedEqual, Mask: 0xffffffff, Value: afVsock, Action: Errno(unix.EAFNOSUPPORT)}}},
		// Succeed without writing back anything: sync(2) and syncfs(2) of
		// an overlay flush the node's whole disk, every sandbox's dirty
		// pages, and a sandbox's files do not outlive its node anyway.
		unix.SYS_SYNC:   {Action: Errno(0)},
		unix.SYS_SYNCFS: {Action: Errno(0)},
	}
}

// DefaultPolicy is the policy of every sandbox on this architecture.
func DefaultPolicy() (*Policy, error) {
	a, ok := arches[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("seccomp: no policy for %s", runtime.GOARCH)
	}
	p := &Policy{Arch: a.audit, Default: Errno(unix.ENOSYS), Foreign: Errno(unix.ENOSYS), Rules: map[uint32]Rule{}}
	set := func(nr uintptr, r Rule) error {
		if _, dup := p.Rules[uint32(nr)]; dup {
			return fmt.Errorf("seccomp: call %d named twice in the policy", nr)
		}
		p.Rules[uint32(nr)] = r
		return nil
	}
	for _, list := range [][]uintptr{allowed, a.allowed} {
		for _, nr := range list {
			if err := set(nr, Rule{Action: Allow}); err != nil {
				return nil, err
			}
		}
	}
	for _, list := range [][]uintptr{denied, a.denied} {
		for _, nr := range list {
			if err := set(nr, Rule{Action: Errno(unix.EPERM)}); err != nil {
				return nil, err
			}
		}
	}
	for nr, r := range checked() {
		if err := set(nr, r); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// AuditPolicy judges only the calls DefaultPolicy refuses on purpose
// (denied, the refused ioctls, namespace flags and socket family), with
// the same errno, and allows everything else. Installed after the
// default filter with SECCOMP_FILTER_FLAG_LOG, it makes the kernel audit
// exactly those refusals (an AUDIT_SECCOMP record with the caller's pid,
// the call and the errno), which the daemon can count per sandbox: where
// two filters return errors, the newer one's decides and is logged; where
// it allows, the older one's error (ENOSYS for an unknown call, sync's
// no-op) stands unlogged, so probing unknown calls or syncing floods no
// log.
func AuditPolicy() (*Policy, error) {
	full, err := DefaultPolicy()
	if err != nil {
		return nil, err
	}
	p := &Policy{Arch: full.Arch, Default: Allow, Foreign: Allow, Rules: map[uint32]Rule{}}
	eperm := Errno(unix.EPERM)
	for nr, r := range full.Rules {
		switch {
		case len(r.Checks) > 0:
			p.Rules[nr] = Rule{Action: Allow, Checks: r.Checks}
		case r.Action == eperm:
			p.Rules[nr] = r
		}
	}
	return p, nil
}

// arch is what differs between architectures: the audit id and the
// calls only one of them has (amd64 keeps the pre-*at calls).
type arch struct {
	audit           uint32
	allowed, denied []uintptr
}

var arches = map[string]arch{}

// DeniedIoctls are the ioctl commands the policy refuses, by type and
// number (the low 16 bits): internal/lsm refuses the same ones.
func DeniedIoctls() []uint32 {
	out := make([]uint32, len(deniedIoctls))
	for i, d := range deniedIoctls {
		out[i] = d.cmd
	}
	return out
}

package seccomp

import "golang.org/x/sys/unix"

const auditArchX86_64 = 0xc000003e // AUDIT_ARCH_X86_64

func init() {
	arches["amd64"] = arch{
		audit: auditArchX86_64,
		// The calls x86-64 kept from before the *at family, which every
		// older binary and many current ones still make.
		allowed: []uintptr{
			unix.SYS_OPEN, unix.SYS_CREAT, unix.SYS_STAT, unix.SYS_LSTAT, unix.SYS_ACCESS, unix.SYS_PIPE,
			unix.SYS_POLL, unix.SYS_SELECT, unix.SYS_DUP2, unix.SYS_FORK, unix.SYS_VFORK, unix.SYS_PAUSE,
			unix.SYS_ALARM, unix.SYS_GETPGRP, unix.SYS_TIME, unix.SYS_UTIME, unix.SYS_UTIMES,
			unix.SYS_FUTIMESAT, unix.SYS_MKDIR, unix.SYS_RMDIR, unix.SYS_RENAME, unix.SYS_LINK,
			unix.SYS_UNLINK, unix.SYS_SYMLINK, unix.SYS_READLINK, unix.SYS_CHMOD, unix.SYS_CHOWN,
			unix.SYS_LCHOWN, unix.SYS_MKNOD, unix.SYS_GETDENTS, unix.SYS_EPOLL_CREATE, unix.SYS_EPOLL_WAIT,
			unix.SYS_INOTIFY_INIT, unix.SYS_EVENTFD, unix.SYS_SIGNALFD, unix.SYS_ARCH_PRCTL,
			unix.SYS_SET_THREAD_AREA, unix.SYS_GET_THREAD_AREA, unix.SYS_MAP_SHADOW_STACK,
			unix.SYS_URETPROBE,
		},
		// Port I/O and the LDT: hardware access and an old exploit path.
		denied: []uintptr{unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_MODIFY_LDT},
	}
}

// Command attack is what an agent would try against its sandbox, one
// attack per argument, for the adversarial tests (test/e2e): it runs
// inside a sandbox, makes the calls raw (no libc wrapper that would
// second-guess them) and prints one line per attack, "NAME ok" or
// "NAME ERRNO" (e.g. "bpf EPERM"), so that a test asserts the exact
// refusal. Static and pure Go, so it runs in the busybox image.
package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func raw(nr uintptr, a ...uintptr) syscall.Errno {
	var args [6]uintptr
	copy(args[:], a)
	_, _, e := unix.RawSyscall6(nr, args[0], args[1], args[2], args[3], args[4], args[5])
	return e
}

// ioctlOn opens path (creating it if asked) and issues cmd with arg on it.
func ioctlOn(path string, create bool, cmd, arg uintptr) syscall.Errno {
	flags := unix.O_RDONLY
	if create {
		flags = unix.O_RDWR | unix.O_CREAT
	}
	fd, err := unix.Open(path, flags, 0o644)
	if err != nil {
		return err.(syscall.Errno)
	}
	defer unix.Close(fd)
	return raw(unix.SYS_IOCTL, uintptr(fd), cmd, arg)
}

// twoFiles issues cmd on a file of the writable layer (/tmp) with
// another as its donor or target; onLayer takes the source from an image
// layer instead (/bin/busybox, opened read-only: what an agent can open).
func twoFiles(cmd uintptr) syscall.Errno { return twoFilesFrom(cmd, false) }

func twoFilesFrom(cmd uintptr, onLayer bool) syscall.Errno {
	var src int
	var err error
	if onLayer {
		src, err = unix.Open("/bin/busybox", unix.O_RDONLY, 0)
	} else {
		src, err = unix.Open("/tmp/attack-src", unix.O_RDWR|unix.O_CREAT, 0o644)
	}
	if err != nil {
		return err.(syscall.Errno)
	}
	defer unix.Close(src)
	if !onLayer {
		if _, err := unix.Write(src, make([]byte, 8192)); err != nil {
			return err.(syscall.Errno)
		}
	}
	dst, err := unix.Open("/tmp/attack-dst", unix.O_RDWR|unix.O_CREAT, 0o644)
	if err != nil {
		return err.(syscall.Errno)
	}
	defer unix.Close(dst)
	switch cmd {
	case unix.FICLONE:
		return raw(unix.SYS_IOCTL, uintptr(dst), cmd, uintptr(src))
	case 0xc028660f: // EXT4_IOC_MOVE_EXT: struct move_extent
		me := struct {
			reserved, donorFd           uint32
			origStart, donorStart, leng uint64
			moved                       uint64
		}{donorFd: uint32(dst), leng: 1}
		return raw(unix.SYS_IOCTL, uintptr(src), cmd, uintptr(unsafe.Pointer(&me)))
	}
	// XFS_IOC_SWAPEXT: a zeroed struct xfs_swapext naming the donor.
	var sx [192]byte
	*(*int64)(unsafe.Pointer(&sx[8])) = int64(dst)
	return raw(unix.SYS_IOCTL, uintptr(src), cmd, uintptr(unsafe.Pointer(&sx[0])))
}

var attacks = map[string]func() syscall.Errno{
	"bpf":             func() syscall.Errno { return raw(unix.SYS_BPF, 0, 0, 0) },
	"perf_event_open": func() syscall.Errno { return raw(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0, 0, 0) },
	"userfaultfd":     func() syscall.Errno { return raw(unix.SYS_USERFAULTFD, 0) },
	"keyctl":          func() syscall.Errno { return raw(unix.SYS_KEYCTL, 0, 0) },
	"add_key":         func() syscall.Errno { return raw(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0) },
	"init_module":     func() syscall.Errno { return raw(unix.SYS_INIT_MODULE, 0, 0, 0) },
	"finit_module":    func() syscall.Errno { return raw(unix.SYS_FINIT_MODULE, 0, 0, 0) },
	"kexec_load":      func() syscall.Errno { return raw(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0) },
	"open_by_handle":  func() syscall.Errno { return raw(unix.SYS_OPEN_BY_HANDLE_AT, 0, 0, 0) },
	"io_uring_setup":  func() syscall.Errno { return raw(unix.SYS_IO_URING_SETUP, 1, 0) },
	"unshare_user":    func() syscall.Errno { return raw(unix.SYS_UNSHARE, unix.CLONE_NEWUSER) },
	"unshare_user_net": func() syscall.Errno {
		return raw(unix.SYS_UNSHARE, unix.CLONE_NEWUSER|unix.CLONE_NEWNET)
	},
	"clone_user": func() syscall.Errno {
		// A fork that also asks for a user namespace; the child (if
		// any) exits at once.
		pid, _, e := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
		if e == 0 && pid == 0 {
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
		}
		return e
	},
	"clone3": func() syscall.Errno { return raw(unix.SYS_CLONE3, 0, 0) },
	"setns":  func() syscall.Errno { return raw(unix.SYS_SETNS, 0, 0) },
	"mount_tmpfs": func() syscall.Errno {
		src, _ := unix.BytePtrFromString("tmpfs")
		dst, _ := unix.BytePtrFromString("/mnt")
		return raw(unix.SYS_MOUNT, uintptr(unsafe.Pointer(src)), uintptr(unsafe.Pointer(dst)), uintptr(unsafe.Pointer(src)), 0, 0)
	},
	"vsock": func() syscall.Errno { return raw(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0) },
	"raw_socket": func() syscall.Errno {
		return raw(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	},
	"packet_socket": func() syscall.Errno { return raw(unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW, 0) },
	"sethostname": func() syscall.Errno {
		name := []byte("pwned")
		return raw(unix.SYS_SETHOSTNAME, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)))
	},
	"settimeofday": func() syscall.Errno {
		tv := unix.Timeval{Sec: 1}
		return raw(unix.SYS_SETTIMEOFDAY, uintptr(unsafe.Pointer(&tv)), 0)
	},
	"ptrace_pid1": func() syscall.Errno { return raw(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0, 0) },
	"sync":        func() syscall.Errno { return raw(unix.SYS_SYNC) },
	"ficlone":     func() syscall.Errno { return twoFiles(unix.FICLONE) },
	"move_ext":    func() syscall.Errno { return twoFiles(0xc028660f) },
	"swapext":     func() syscall.Errno { return twoFiles(0xc0c0586d) },
	// The same with a file of an image layer.
	"ficlone_layer":  func() syscall.Errno { return twoFilesFrom(unix.FICLONE, true) },
	"move_ext_layer": func() syscall.Errno { return twoFilesFrom(0xc028660f, true) },
	"swapext_layer":  func() syscall.Errno { return twoFilesFrom(0xc0c0586d, true) },
	// FS_NOATIME_FL: a flag a file's owner may set without a capability.
	"setflags_upper": func() syscall.Errno {
		flags := uint32(0x80)
		return ioctlOn("/tmp/attack-flags", true, unix.FS_IOC_SETFLAGS, uintptr(unsafe.Pointer(&flags)))
	},
	"setflags_layer": func() syscall.Errno {
		flags := uint32(0x80)
		return ioctlOn("/bin/busybox", false, unix.FS_IOC_SETFLAGS, uintptr(unsafe.Pointer(&flags)))
	},
	"getflags": func() syscall.Errno {
		var flags uint32
		return ioctlOn("/tmp/attack-flags", true, unix.FS_IOC_GETFLAGS, uintptr(unsafe.Pointer(&flags)))
	},
	"walk": walk,
	// sockets lists every unix socket file below / and every named one
	// in /proc/net/unix, then prints them ("sockets=" and the paths).
	"sockets": func() syscall.Errno {
		found := []string{}
		_ = filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type()&fs.ModeSocket != 0 {
				found = append(found, p)
			}
			return nil
		})
		if b, err := os.ReadFile("/proc/net/unix"); err == nil {
			for _, line := range strings.Split(string(b), "\n")[1:] {
				if f := strings.Fields(line); len(f) >= 8 {
					found = append(found, "net:"+f[7])
				}
			}
		}
		fmt.Printf("sockets=%s ", strings.Join(found, ","))
		return 0
	},
	// connect_path connects to the unix socket at $ATTACK_PATH.
	"connect_path": func() syscall.Errno {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return err.(syscall.Errno)
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: os.Getenv("ATTACK_PATH")}); err != nil {
			return err.(syscall.Errno)
		}
		return 0
	},
	// agent_fd opens PID 1's listening socket through /proc.
	"agent_fd": func() syscall.Errno {
		fd, err := unix.Open("/proc/1/fd/4", unix.O_RDONLY, 0)
		if err != nil {
			return err.(syscall.Errno)
		}
		unix.Close(fd)
		return 0
	},
	"euid": func() syscall.Errno {
		fmt.Printf("euid=%d ", unix.Geteuid())
		return 0
	},
}

// walk reads every regular file below / the way grep -r does (symlinks
// not followed, devices, FIFOs and sockets skipped), at most 1 MiB of
// each, and fails if a read blocks for 10 s, naming the file. It prints
// how many files it read and how many it could not open.
func walk() syscall.Errno {
	var cur atomic.Value
	cur.Store("")
	done := make(chan struct{})
	go func() {
		last, since := "", time.Now()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
			if p := cur.Load().(string); p != last {
				last, since = p, time.Now()
			} else if time.Since(since) > 10*time.Second {
				fmt.Printf("walk blocked-on=%s\n", p)
				os.Exit(0)
			}
		}
	}()
	read, refused := 0, 0
	buf := make([]byte, 64<<10)
	_ = filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		cur.Store(p)
		f, err := os.Open(p)
		if err != nil {
			refused++
			return nil
		}
		_, _ = io.CopyBuffer(io.Discard, io.LimitReader(f, 1<<20), buf)
		f.Close()
		read++
		return nil
	})
	close(done)
	fmt.Printf("walk read=%d refused=%d ", read, refused)
	return 0
}

func main() {
	for _, name := range os.Args[1:] {
		f, ok := attacks[name]
		if !ok {
			fmt.Printf("%s unknown\n", name)
			continue
		}
		e := f()
		if e == 0 {
			fmt.Printf("%s ok\n", name)
		} else {
			fmt.Printf("%s %s\n", name, unix.ErrnoName(e))
		}
	}
}

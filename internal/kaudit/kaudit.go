// Package kaudit turns the kernel's audit records of seccomp actions
// into security events of the sandboxes they happened in.
//
// A seccomp filter installed with SECCOMP_FILTER_FLAG_LOG makes the
// kernel emit an AUDIT_SECCOMP record (type 1326) for every action other
// than allow that /proc/sys/kernel/seccomp/actions_logged names: host
// pid, comm, exe, arch, syscall number and the filter's return code. The
// kernel multicasts every audit record to the AUDIT_NLGRP_READLOG
// netlink group, whether or not an auditd runs, to any socket bound to it
// with CAP_AUDIT_READ (CONFIG_AUDIT=y). Source reads that group and
// attributes each record to a sandbox by the pid (events.Attributor: the
// container backend reads the pid's cgroup); records of processes outside
// every sandbox, or gone before they were read (a KILL action), are
// counted as unattributed and dropped.
package kaudit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/events"
)

const (
	// auditNlgrpReadlog is AUDIT_NLGRP_READLOG of <linux/audit.h>: the
	// multicast group of every audit record.
	auditNlgrpReadlog = 1
	// recvBuffer is the socket's receive buffer: a burst of denials
	// beyond it is lost (ENOBUFS, counted) rather than queued without
	// bound in the kernel.
	recvBuffer = 1 << 20
)

// Source reads seccomp records from the kernel's audit multicast group
// (events.Source).
type Source struct {
	Attributor events.Attributor
	// Unattributed counts records of no known sandbox (host processes,
	// another daemon's sandboxes, processes gone before the lookup);
	// Lost counts records the kernel dropped from a full socket.
	Unattributed, Lost atomic.Uint64

	f *os.File
}

var _ events.Source = (*Source)(nil)

// Open subscribes to the audit multicast group. It fails without
// CAP_AUDIT_READ or a kernel built with CONFIG_AUDIT; the caller then
// runs without seccomp events.
func Open(a events.Attributor) (*Source, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_AUDIT)
	if err != nil {
		return nil, fmt.Errorf("audit netlink socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, recvBuffer)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (auditNlgrpReadlog - 1)}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("join the audit multicast group (needs CAP_AUDIT_READ): %w", err)
	}
	// Through the runtime's poller, so that Close wakes a blocked Read.
	return &Source{Attributor: a, f: os.NewFile(uintptr(fd), "audit-netlink")}, nil
}

// Run records every seccomp record of a sandbox into r until ctx ends.
func (s *Source) Run(ctx context.Context, r events.Recorder) error {
	stop := context.AfterFunc(ctx, func() { s.f.Close() })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.f.Read(buf)
		switch {
		case errors.Is(err, syscall.ENOBUFS):
			s.Lost.Add(1)
			continue
		case err != nil:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read audit records: %w", err)
		}
		typ, data, ok := auditMessage(buf[:n])
		if !ok || typ != unix.AUDIT_SECCOMP {
			continue
		}
		if e, ok := s.event(data); ok {
			r.Record(e)
		} else {
			s.Unattributed.Add(1)
		}
	}
}

// auditMessage reads the one netlink message of an audit datagram. Not
// syscall.ParseNetlinkMessage: the kernel sets nlmsg_len to the unpadded
// length of the text, which that parser refuses unless it happens to be
// a multiple of 4.
func auditMessage(b []byte) (typ uint16, data []byte, ok bool) {
	if len(b) < unix.NLMSG_HDRLEN {
		return 0, nil, false
	}
	h := (*unix.NlMsghdr)(unsafe.Pointer(&b[0]))
	if int(h.Len) < unix.NLMSG_HDRLEN || int(h.Len) > len(b) {
		return 0, nil, false
	}
	return h.Type, b[unix.NLMSG_HDRLEN:h.Len], true
}

// Close ends the subscription (and a Run in progress).
func (s *Source) Close() error { return s.f.Close() }

// event turns one record into an event of its sandbox.
func (s *Source) event(data []byte) (events.Event, bool) {
	rec, ok := ParseSeccomp(data)
	if !ok {
		return events.Event{}, false
	}
	process := ""
	id, nsPid, ok := s.Attributor.SandboxOfPid(rec.Pid)
	if ok {
		process = "pid " + strconv.Itoa(nsPid)
	} else if a, isAuid := s.Attributor.(AuditAttributor); isAuid && rec.Auid != unsetAuid {
		// The process is gone; its audit login uid still names the
		// sandbox (its pid inside is not known any more).
		id, ok = a.AuditSandbox(rec.Auid)
	}
	if !ok {
		return events.Event{}, false
	}
	return events.Event{
		Sandbox: id,
		Kind:    events.Seccomp,
		Process: process,
		Detail: fmt.Sprintf("system call %d (arch %s) of %s (%s): %s by the seccomp filter",
			rec.Syscall, rec.Arch, strconv.Quote(rec.Comm), strconv.Quote(rec.Exe), rec.Action()),
	}, true
}

// AuditAttributor finds a sandbox by the audit login uid its processes
// carry (the container backend sets one per sandbox): it attributes a
// record whose process is gone, which SandboxOfPid cannot.
type AuditAttributor interface {
	AuditSandbox(auid uint32) (string, bool)
}

// unsetAuid is the login uid of a process that never had one.
const unsetAuid = 4294967295

// Seccomp is the part of an AUDIT_SECCOMP record an event needs.
type Seccomp struct {
	Pid       int    // host pid
	Auid      uint32 // audit login uid (unsetAuid: none)
	Comm, Exe string
	Arch      string // AUDIT_ARCH_* in hex, e.g. c000003e (x86_64)
	Syscall   int
	Code      uint32 // the filter's action (its data, the errno, is cut off by the kernel)
}

// Action names the filter's action, with the errno of an errno action.
func (r Seccomp) Action() string {
	switch r.Code & unix.SECCOMP_RET_ACTION_FULL {
	case unix.SECCOMP_RET_KILL_PROCESS:
		return "process killed"
	case unix.SECCOMP_RET_KILL_THREAD:
		return "thread killed"
	case unix.SECCOMP_RET_TRAP:
		return "trapped (SIGSYS)"
	case unix.SECCOMP_RET_ERRNO:
		// The kernel logs the action without its data (6.18 does), so
		// the errno is usually not known.
		if n := r.Code & unix.SECCOMP_RET_DATA; n != 0 {
			return "refused with " + unix.ErrnoName(syscall.Errno(n))
		}
		return "refused with an error"
	case unix.SECCOMP_RET_USER_NOTIF:
		return "sent to the supervisor"
	case unix.SECCOMP_RET_TRACE:
		return "sent to the tracer"
	case unix.SECCOMP_RET_LOG:
		return "allowed and logged"
	}
	return fmt.Sprintf("action %#x", r.Code)
}

// ParseSeccomp reads an AUDIT_SECCOMP record's text:
// `audit(T:N): auid=… pid=123 comm="x" exe="/bin/x" sig=0 arch=c000003e
// syscall=163 compat=0 ip=0x… code=0x50001`. Values the kernel found
// unsafe to print (spaces, quotes) come hex-encoded without quotes.
func ParseSeccomp(data []byte) (Seccomp, bool) {
	r := Seccomp{Auid: unsetAuid}
	var havePid, haveSyscall bool
	if _, rest, ok := bytes.Cut(data, []byte("): ")); ok {
		data = rest
	}
	for _, f := range bytes.Fields(bytes.TrimRight(data, "\x00")) {
		k, v, ok := bytes.Cut(f, []byte("="))
		if !ok {
			continue
		}
		switch string(k) {
		case "pid":
			n, err := strconv.Atoi(string(v))
			r.Pid, havePid = n, err == nil
		case "auid":
			if n, err := strconv.ParseUint(string(v), 10, 32); err == nil {
				r.Auid = uint32(n)
			}
		case "comm":
			r.Comm = auditString(v)
		case "exe":
			r.Exe = auditString(v)
		case "arch":
			r.Arch = string(v)
		case "syscall":
			n, err := strconv.Atoi(string(v))
			r.Syscall, haveSyscall = n, err == nil
		case "code":
			n, _ := strconv.ParseUint(string(v), 0, 32)
			r.Code = uint32(n)
		}
	}
	return r, havePid && haveSyscall
}

// auditString decodes an audit value: "quoted" as is, else hex.
func auditString(v []byte) string {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return string(v[1 : len(v)-1])
	}
	out := make([]byte, len(v)/2)
	for i := range out {
		b, err := strconv.ParseUint(string(v[2*i:2*i+2]), 16, 8)
		if err != nil {
			return string(v)
		}
		out[i] = byte(b)
	}
	return string(out)
}

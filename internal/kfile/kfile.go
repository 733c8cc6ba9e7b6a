// Package kfile reads and writes the small files of the kernel's pseudo
// filesystems (cgroupfs, procfs) on hot paths.
package kfile

import (
	"os"

	"golang.org/x/sys/unix"
)

// Write and Read do what os.WriteFile and os.ReadFile do, without the
// runtime poller: an *os.File costs two fcntls and an epoll registration
// (kernfs files are pollable) plus its removal, five syscalls on top of
// open, write and close, and a sandbox's create and delete touch a dozen
// such files.
func Write(path, data string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	// A write that makes the kernel reclaim (memory.limit_in_bytes,
	// memory.force_empty, memory.reclaim) gives up with EINTR when a
	// signal arrives meanwhile, and Go's runtime signals its threads
	// (preemption, SIGCHLD) often enough that reclaim steps failed now and
	// then: it is the same write again. os.File retries EINTR; this did not.
	for {
		_, err = unix.Write(fd, []byte(data))
		if err != unix.EINTR {
			break
		}
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

func Read(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// Package agentbin holds the sandbox agent and the container init stage as
// one small standalone static binary, in a sealed memfd that the daemon
// execs as every sandbox's PID 1.
//
// The warren binary carries the same code (internal/agent,
// internal/container) in ELF constructors, but an agent running in the
// 24 MB Go binary keeps that binary's writable data and page tables alive
// in every sandbox: about 120 KiB each. This ~55 KB musl build keeps 12 KiB
// of anonymous memory and 12 KiB of page tables, and saves an exec of the
// Go binary per create.
package agentbin

import (
	"bytes"
	_ "embed"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

//go:generate ./build.sh

//go:embed warren-agent
var binary []byte

var (
	once   sync.Once
	memfd  *os.File
	memErr error
)

// Binary returns the agent's bytes.
func Binary() []byte { return binary }

// Memfd returns a read-only, sealed memfd holding the agent, made once per
// process and never closed: every sandbox's init is the same one, so its
// pages are in memory once per node and charged to the daemon.
func Memfd() (*os.File, error) {
	once.Do(func() { memfd, memErr = makeMemfd() })
	return memfd, memErr
}

func makeMemfd() (*os.File, error) {
	if !bytes.HasPrefix(binary, []byte("\x7fELF")) {
		return nil, fmt.Errorf("embedded agent is not an ELF binary (rebuild with go generate ./internal/agentbin)")
	}
	// MFD_EXEC is needed where vm.memfd_noexec defaults memfds to
	// non-executable; kernels before 6.3 reject the flag.
	fd, err := unix.MemfdCreate("warren-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if err == unix.EINVAL {
		fd, err = unix.MemfdCreate("warren-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:warren-agent")
	if _, err := f.Write(binary); err != nil {
		f.Close()
		return nil, fmt.Errorf("write agent memfd: %w", err)
	}
	// Sealed, nobody (not even a process that somehow reaches the fd) can
	// change the program every sandbox's PID 1 runs.
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal agent memfd: %w", err)
	}
	return f, nil
}

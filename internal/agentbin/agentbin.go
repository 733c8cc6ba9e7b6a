// Package agentbin holds the sandbox agent and the container init stage as
// one small standalone static binary per architecture, which the daemon
// execs as every sandbox's PID 1.
//
// It is the only copy of that code the daemon runs: the warren binary
// itself carries no C, so a plain `go build ./cmd/warren` (with or without
// cgo, static or dynamic) makes a working daemon. An agent running in the
// 24 MB Go binary would also keep that binary's writable data and page
// tables alive in every sandbox (about 120 KiB each); this ~55 KB musl
// build keeps 12 KiB of anonymous memory and 12 KiB of page tables.
//
// The daemon holds the binary in a sealed memfd. Where the kernel refuses
// an executable memfd (vm.memfd_noexec=2, or an LSM), it writes the binary
// to a root-owned mode-0555 file under its state directory instead, checks
// its SHA-256 through the descriptor it keeps, and execs that.
package agentbin

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

//go:generate ./build.sh

// machines are the ELF machines of the architectures an agent is built
// for (build.sh): the daemon refuses to start with an agent for another.
var machines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// Binary returns the agent's bytes for this build's architecture (nil on
// an architecture no agent is built for).
func Binary() []byte { return binary }

// Check reports whether bin is a static little-endian 64-bit ELF
// executable for goarch: the agent for this daemon.
func Check(bin []byte, goarch string) error {
	want, ok := machines[goarch]
	if !ok {
		return errdefs.Unsupportedf("no sandbox agent is built for linux/%s (internal/agentbin builds amd64 and arm64)", goarch)
	}
	if len(bin) == 0 {
		return errdefs.Internalf("this warren binary embeds no sandbox agent for linux/%s (rebuild it with go generate ./internal/agentbin)", goarch)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "embedded sandbox agent is not an ELF binary (rebuild with go generate ./internal/agentbin)")
	}
	defer f.Close()
	if f.Machine != want {
		return errdefs.Internalf("embedded sandbox agent is built for %s, this daemon is %s: the warren binary was built wrong (rebuild the agents with go generate ./internal/agentbin)",
			machineName(f.Machine), machineName(want))
	}
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Type != elf.ET_EXEC {
		return errdefs.Internalf("embedded sandbox agent is not a static 64-bit little-endian executable (%s, %s, %s)", f.Class, f.Data, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errdefs.Internalf("embedded sandbox agent is dynamically linked; it runs in sandbox roots without a loader")
		}
	}
	return nil
}

func machineName(m elf.Machine) string {
	for arch, am := range machines {
		if am == m {
			return "linux/" + arch + " (" + m.String() + ")"
		}
	}
	return m.String()
}

// Options configure Open.
type Options struct {
	// Dirs are where the agent may be written when memfds cannot be
	// executed, in order of preference; the first on a filesystem that
	// allows exec is used. Open creates <dir>/agent (mode 0700).
	Dirs []string
	// NoMemfd skips the memfd (tests of the file path).
	NoMemfd bool
	// Warn receives why the agent runs from a file (default: dropped).
	Warn func(msg string, args ...any)
}

// Agent is the agent ready to exec: a descriptor that a child execs as
// /proc/self/fd/<n>.
type Agent struct {
	f    *os.File
	path string // "" for the memfd

	mu    sync.Mutex
	ctime unix.Timespec // of the file when it was last verified
}

var (
	memOnce sync.Once
	memAg   *Agent
	memErr  error
)

// Open checks the embedded agent against this daemon's architecture and
// returns it ready to exec: from one sealed memfd per process (every
// sandbox's init is the same one, so its pages are in memory once per
// node, charged to the daemon), or where the kernel will not exec that,
// from a verified file in the first of opts.Dirs that allows exec.
func Open(opts Options) (*Agent, error) {
	if err := Check(binary, runtime.GOARCH); err != nil {
		return nil, err
	}
	why := "NoMemfd"
	if !opts.NoMemfd {
		memOnce.Do(func() { memAg, memErr = openMemfd(binary) })
		if memErr == nil {
			return memAg, nil
		}
		why = memErr.Error()
	}
	a, err := openFile(binary, opts.Dirs)
	if err != nil {
		return nil, fmt.Errorf("%w (and the memfd: %s)", err, why)
	}
	if opts.Warn != nil {
		opts.Warn("the kernel refuses to exec the sandbox agent from a memfd; sandboxes exec a verified copy from a file", "path", a.path, "reason", why)
	}
	return a, nil
}

// Path is the file the agent is exec'd from, or "" for the memfd.
func (a *Agent) Path() string { return a.path }

// File returns the descriptor to exec. A file-backed agent is checked
// again (fstat, and its hash if its ctime moved: any write or chmod
// moves it) so that a copy someone changed is never run as PID 1.
func (a *Agent) File() (*os.File, error) {
	if a.path == "" {
		return a.f, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Fstat(int(a.f.Fd()), &st); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "stat sandbox agent "+a.path)
	}
	if st.Ctim == a.ctime {
		return a.f, nil
	}
	if err := verify(a.f, binary); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "sandbox agent "+a.path+" changed after the daemon wrote it; restart the daemon to write it again")
	}
	a.ctime = st.Ctim
	return a.f, nil
}

func openMemfd(bin []byte) (*Agent, error) {
	// MFD_EXEC is needed where vm.memfd_noexec defaults memfds to
	// non-executable; kernels before 6.3 reject the flag. With
	// vm.memfd_noexec=2 it fails with EACCES.
	fd, err := unix.MemfdCreate("warren-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if err == unix.EINVAL {
		fd, err = unix.MemfdCreate("warren-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:warren-agent")
	if _, err := f.Write(bin); err != nil {
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
	if err := probe(f); err != nil {
		f.Close()
		return nil, err
	}
	return &Agent{f: f}, nil
}

// openFile writes bin to <dir>/agent/warren-agent-<sha256 prefix> in the
// first dir whose filesystem allows exec (or finds it there from an
// earlier start), verifies it through the descriptor it returns, and
// checks that the kernel will exec it.
func openFile(bin []byte, dirs []string) (*Agent, error) {
	var refused []string
	for _, dir := range dirs {
		var sfs unix.Statfs_t
		if err := unix.Statfs(dir, &sfs); err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", dir, err))
			continue
		}
		if sfs.Flags&unix.ST_NOEXEC != 0 {
			refused = append(refused, dir+": mounted noexec")
			continue
		}
		a, err := writeVerified(filepath.Join(dir, "agent"), bin)
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", dir, err))
			continue
		}
		return a, nil
	}
	return nil, errdefs.Internalf("no place to run the sandbox agent from: %s; give the state directory a filesystem mounted without noexec",
		strings.Join(refused, "; "))
}

func writeVerified(dir string, bin []byte) (*Agent, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(bin)
	name := "warren-agent-" + hex.EncodeToString(sum[:8])
	path := filepath.Join(dir, name)
	f, err := openOwn(path, bin)
	if err != nil {
		// Missing, or not what we would write: write it anew and replace
		// it in one rename, so an exec never sees a half-written file.
		if err := writeFile(dir, path, bin); err != nil {
			return nil, err
		}
		if f, err = openOwn(path, bin); err != nil {
			return nil, err
		}
	}
	removeOthers(dir, name)
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	if err := probe(f); err != nil {
		f.Close()
		return nil, err
	}
	return &Agent{f: f, path: path, ctime: st.Ctim}, nil
}

// openOwn opens path and returns it if it is a regular root-owned file of
// mode 0555 holding exactly bin.
func openOwn(path string, bin []byte) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 || st.Mode&0o7777 != 0o555 {
		f.Close()
		return nil, fmt.Errorf("%s is not a root-owned regular file of mode 0555", path)
	}
	if err := verify(f, bin); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// verify reads f from its start and compares it with bin. Reading it all
// also brings its pages into the page cache charged to the daemon's
// memory cgroup, not to the first sandbox that faults them in (whose
// cgroup would then linger after deletion while the page stays cached).
func verify(f *os.File, bin []byte) error {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<30)); err != nil {
		return fmt.Errorf("read %s: %w", f.Name(), err)
	}
	want := sha256.Sum256(bin)
	if !bytes.Equal(h.Sum(nil), want[:]) {
		return fmt.Errorf("%s does not hold the embedded agent (sha256 differs)", f.Name())
	}
	return nil
}

func writeFile(dir, path string, bin []byte) error {
	tmp, err := os.CreateTemp(dir, ".tmp-agent-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(bin)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// removeOthers removes agents an earlier daemon version wrote. Sandboxes
// running them keep their inode.
func removeOthers(dir, keep string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != keep && (strings.HasPrefix(e.Name(), "warren-agent-") || strings.HasPrefix(e.Name(), ".tmp-agent-")) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// probe execs f the way a sandbox's init is exec'd (as /proc/self/fd/3 of
// the child), without the variables that would make it the init stage or
// the agent: it then exits at once. An exec that the kernel or an LSM
// refuses fails here, at start, rather than in every create.
func probe(f *os.File) error {
	cmd := exec.Command("/proc/self/fd/3")
	cmd.Args = []string{"warren-agent-probe"}
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec the sandbox agent: %w", err)
	}
	timer := time.AfterFunc(10*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	var exitErr *exec.ExitError
	if err := cmd.Wait(); err != nil && !errors.As(err, &exitErr) {
		return fmt.Errorf("run the sandbox agent: %w", err)
	}
	return nil
}

package fidelity

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// regrtest's parallelism and per-module timeout. The modules mostly wait
// (sockets, subprocesses, sleeps): at -j2 the 92 candidate modules took
// 8 min 46 s of wall time for 2 min 13 s of CPU in the chroot alone, so
// each side runs 4 workers and the two sides run at the same time (8
// workers on 2 cores kept both sides under 5 minutes). A module that
// runs longer than moduleTimeout is killed by regrtest (faulthandler's
// dump_traceback_later) and reported "timed out": a hang fails the
// module, it does not stall CI. The slowest kept module, test_asyncio,
// took 1 min 15 s to 1 min 50 s of wall time here (its test cases 79 to
// 125 s), so 180 s leaves it room on a loaded machine.
const (
	workers       = 4
	moduleTimeout = 180 * time.Second
)

// junitPath is where both sides write regrtest's JUnit XML (the chroot's
// /tmp, the sandbox's /tmp).
const junitPath = "/tmp/fidelity-junit.xml"

// regrtestArgs is the command both sides run. Default resources (no -u):
// nothing reaches the network beyond this machine.
func regrtestArgs() []string {
	args := []string{"python3", "-m", "test",
		"-j" + strconv.Itoa(workers),
		"--timeout", strconv.Itoa(int(moduleTimeout / time.Second)),
		"--slowest",
		"--junit-xml", junitPath}
	for _, p := range ignored {
		args = append(args, "--ignore", p)
	}
	return append(args, modules...)
}

// ignored are test cases neither side runs (regrtest --ignore globs): in
// the chroot, on this machine, one hangs (a timeout would lose its whole
// module) and one changes the host:
var ignored = []string{
	// This VM has a vsock transport: the test's client connects to the
	// local CID and the server's accept() never returns (test_socket
	// timed out at 5 min in the chroot, 2026-12-01). Sandboxes have no
	// vsock device; nothing to compare.
	"*ThreadedVSOCKSocketStreamTest*",
	// Sets the clock (CLOCK_REALTIME) back an hour and forward again: in
	// the chroot that is the host's clock, under the CI run's other
	// timers. Sandboxes may not set it (no CAP_SYS_TIME).
	"*test_monotonic_settime",
}

// sideResult is what one side's run left: regrtest's output, its JUnit
// XML, and how long it took.
type sideResult struct {
	name     string
	output   []byte
	junit    []byte
	exit     int
	duration time.Duration
	err      error // the run itself failed (not a test)
}

// parse turns a side's output and JUnit XML into results.
func (s *sideResult) parse() (results, error) {
	mods, words, err := parseProgress(bytes.NewReader(s.output))
	if err != nil {
		return results{}, err
	}
	if len(mods) == 0 {
		return results{}, fmt.Errorf("%s: regrtest reported no module (exit %d):\n%s", s.name, s.exit, tail(string(s.output), 3000))
	}
	cases, err := parseJUnit(bytes.NewReader(s.junit))
	if err != nil {
		return results{}, fmt.Errorf("%s: %w", s.name, err)
	}
	return results{modules: mods, moduleWords: words, cases: cases}, nil
}

// chrootEnv is the environment of the chroot side: what a root login
// shell on Debian has (login(1) sets HOME, SHELL, USER, LOGNAME and
// /etc/login.defs' ENV_SUPATH; minbase sets no locale).
var chrootEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root", "SHELL=/bin/bash", "USER=root", "LOGNAME=root",
}

// makeChroot copies the image's tree and the layer into dir, as a
// normal machine's root filesystem: one ext4, the packages unpacked in
// it, the host's /etc/hosts (a machine's installer writes one that
// names its hostname; the image's, netbase's, names only localhost). A
// copy, because the tests write into it
// (__pycache__, /tmp) and the cached tree must stay as imported.
func makeChroot(ctx context.Context, in *inputs, dir string) error {
	for _, src := range []string{in.rootfs, in.layer} {
		if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src+"/.", dir+"/").CombinedOutput(); err != nil {
			return fmt.Errorf("copy %s: %v: %s", src, err, out)
		}
	}
	hosts, err := os.ReadFile("/etc/hosts")
	if err != nil {
		return fmt.Errorf("the chroot gets the host's /etc/hosts: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "etc/hosts"), hosts, 0o644)
}

// runChroot runs regrtest in root with
//
//	unshare --fork --pid --mount --uts --ipc --mount-proc=ROOT/proc --kill-child
//
// then, in that mount namespace (private: nothing propagates back),
// binds the host's /dev and /sys and chroots: a normal machine's /proc
// (its own pid namespace), /dev (with /dev/shm, /dev/pts), /sys and
// network, as root with every capability. The UTS and IPC namespaces
// only keep the tests' sethostname and SysV objects off the host; they
// start as copies of the host's. The soft limits are Debian 12's
// (systemd 252) for a login: open files 1024, stack 8 MiB (the hard
// ones stay the test process's: root here cannot raise them, no
// CAP_SYS_RESOURCE). Every signal's handling is the default again (env
// --default-signal), as in a login shell: a test process started in the
// background of a non-interactive shell inherits SIGINT ignored, and
// CPython's SIGINT tests (test_signal, test_threading's interrupt_main,
// multiprocessing) then fail in the chroot only. --kill-child ends the
// namespace with unshare, and
// the test kills unshare's group when its context ends.
func runChroot(ctx context.Context, root string) *sideResult {
	res := &sideResult{name: "chroot"}
	script := `set -e; ulimit -S -n 1024; ulimit -S -s 8192; mount --rbind /dev "$1/dev"; mount --rbind /sys "$1/sys"; r=$1; shift; exec chroot "$r" "$@"`
	args := []string{"--fork", "--pid", "--mount", "--uts", "--ipc", "--mount-proc=" + filepath.Join(root, "proc"), "--kill-child",
		"sh", "-c", script, "sh", root, "env", "-i", "--default-signal"}
	args = append(args, chrootEnv...)
	args = append(args, regrtestArgs()...)
	cmd := exec.CommandContext(ctx, "unshare", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	err := cmd.Run()
	res.duration = time.Since(start)
	res.output = out.Bytes()
	if ee, ok := err.(*exec.ExitError); ok {
		res.exit = ee.ExitCode()
	} else if err != nil {
		res.err = fmt.Errorf("run regrtest in the chroot: %w", err)
		return res
	}
	res.junit, res.err = os.ReadFile(filepath.Join(root, junitPath))
	return res
}

// sandboxResources: a machine like this one (2 cores, the chroot's
// limit), 8 GiB of the node's 24 (the suite's peak is far below), and
// pids for regrtest's workers and the multiprocessing tests' children.
var sandboxResources = &warrenv1.Resources{CpuMillis: 2000, MemoryBytes: 8 << 30, PidsMax: 8192}

// runSandbox runs regrtest in a new sandbox of img with layer on it, with
// the sandbox's own environment (what an agent's command gets).
func runSandbox(ctx context.Context, c *client.Client, img, layer string, timeout time.Duration) *sideResult {
	res := &sideResult{name: "sandbox"}
	sb, err := c.Create(ctx, &warrenv1.CreateRequest{
		Id: sandboxID, Image: img, Layers: []string{layer},
		Resources: sandboxResources, TimeoutSeconds: int64((timeout + 5*time.Minute) / time.Second),
	})
	if err != nil {
		res.err = fmt.Errorf("create the sandbox: %w", err)
		return res
	}
	start := time.Now()
	var out bytes.Buffer
	r, err := c.ExecStream(ctx, &warrenv1.ExecRequest{
		SandboxId: sb.Id, Argv: regrtestArgs(), TimeoutMs: timeout.Milliseconds(),
		OutputLimitBytes: 64 << 20,
	}, func(ev *warrenv1.ExecEvent) error {
		out.Write(ev.GetStdout())
		out.Write(ev.GetStderr())
		return nil
	})
	res.duration = time.Since(start)
	res.output = out.Bytes()
	if err != nil {
		res.err = fmt.Errorf("exec regrtest in the sandbox: %w", err)
		return res
	}
	if r.TimedOut {
		res.err = fmt.Errorf("regrtest in the sandbox ran past %v", timeout)
		return res
	}
	res.exit = int(r.ExitCode)
	res.junit, res.err = readAll(ctx, c, sb.Id, junitPath)
	return res
}

// sandboxID names the suite's one sandbox; it lives until the daemon's
// cleanup, for the re-run.
const sandboxID = "fidelity"

// rerunPath is the re-run's JUnit XML in the sandbox.
const rerunPath = "/tmp/fidelity-rerun.xml"

// rerunSandbox runs test cases ids of modules mods once more in the
// sandbox, in one worker with nothing else running, and returns their
// outcomes and regrtest's output.
func rerunSandbox(ctx context.Context, c *client.Client, ids, mods []string) (map[string]outcome, []byte, error) {
	argv := []string{"python3", "-m", "test", "-j1", "--timeout", strconv.Itoa(int(moduleTimeout / time.Second)), "--junit-xml", rerunPath}
	for _, id := range ids {
		argv = append(argv, "-m", id)
	}
	argv = append(argv, mods...)
	r, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sandboxID, Argv: argv,
		TimeoutMs: (time.Duration(len(mods)+1) * moduleTimeout).Milliseconds(), OutputLimitBytes: 16 << 20})
	if err != nil {
		return nil, nil, fmt.Errorf("re-run in the sandbox: %w", err)
	}
	out := append(r.Stdout, r.Stderr...)
	b, err := readAll(ctx, c, sandboxID, rerunPath)
	if err != nil {
		return nil, out, err
	}
	cases, err := parseJUnit(bytes.NewReader(b))
	return cases, out, err
}

// readAll reads a whole file of a sandbox.
func readAll(ctx context.Context, c *client.Client, id, path string) ([]byte, error) {
	var buf bytes.Buffer
	for {
		r, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: path, Offset: int64(buf.Len())})
		if err != nil {
			return nil, fmt.Errorf("read %s from the sandbox: %w", path, err)
		}
		buf.Write(r.Content)
		if r.Eof || len(r.Content) == 0 {
			return buf.Bytes(), nil
		}
	}
}

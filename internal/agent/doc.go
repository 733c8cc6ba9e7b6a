// Package agent is the init and exec agent that runs as PID 1 of every
// sandbox, and the Go client that talks to it.
//
// The agent is C code (agent_linux.c), not part of any Go build:
// internal/agentbin/build.sh compiles it with the container init stage into
// the standalone static binary that the daemon embeds and execs as every
// sandbox's PID 1 (sandbox roots have no libc of ours). An ELF constructor
// checks the environment: when EnvFD=<n> is set, fd n must be an AF_UNIX
// SOCK_STREAM socket that is already bound and listening, and the
// constructor never returns: it serves that socket for the life of the
// process, reaps every child (it is PID 1 or a child subreaper) and uses a
// few hundred KB of memory.
//
// # Protocol (version 3)
//
// One connection per process or request. Every frame is a little-endian u32 payload
// length, a u8 type, and the payload; payloads are at most 4 MiB.
//
// Client to agent:
//
//	'E' EXEC    u32 flags (bit0 stdin, bit1 stdout, bit2 stderr attached,
//	            bit3 DETACH, bit4 PTY), u32 uid, u32 gid, u32 argc, u32 envc,
//	            with DETACH: u32 cap, u32 rows, u32 cols, u32 taglen, taglen
//	            bytes of tag; then NUL-terminated strings: cwd, argc argv
//	            entries, envc "K=V" entries. The fds of the set bits ride on
//	            the frame as SCM_RIGHTS, in the order stdin, stdout, stderr.
//	'S' SIGNAL  i32 signo, u8 group (1: kill(-pid), 0: kill(pid)): this
//	            connection's process.
//	'P' PING    empty.
//
// EXEC with PTY but without DETACH runs the connection's process on a pty
// the agent makes (as below): STARTED then carries the master as
// SCM_RIGHTS, which the client reads and writes itself.
//
// Requests about background processes, by pid, on a fresh connection:
//
//	'L' LIST    empty. Reply: one 'l' per process in start order, then 'e'.
//	'A' ATTACH  i32 pid, u64 stdout offset, u64 stderr offset (all ones:
//	            skip that stream). Reply: 'O' frames, then 'X' (below).
//	'I' STDIN   i32 pid. Reply: 'R' with the stdin fd (the pty master with
//	            PTY) as SCM_RIGHTS; the client writes to it directly.
//	'C' CLOSEIN i32 pid: close the agent's stdin end (with PTY: write the
//	            EOF character ^D instead). Reply 'k'.
//	'K' KILL    i32 pid, i32 signo, u8 group. Reply 'k', or FAILED step
//	            "exited" once the process exited (its pid may be reused).
//	'W' WINSIZE i32 pid, u32 rows | cols << 16 (PTY only). Reply 'k'.
//	'D' FORGET  i32 pid (version 3): drop the oldest exited record with
//	            that pid, and its output. Reply 'k'; FAILED ESRCH
//	            "forget" if there is none, EBUSY "forget" if the pid's
//	            process still runs. Clients attached to the record finish
//	            reading it; it is no longer listed or found. An agent of
//	            version 2 fails the frame with step "proto" (EINVAL): its
//	            records stay until the sandbox goes, as they always did.
//
// An unknown pid fails with ESRCH; the step names the request ("attach",
// "stdin", "signal", "resize").
//
// Agent to client:
//
//	'R' STARTED i32 pid.
//	'F' FAILED  i32 errno, NUL-terminated step ("exec", "chdir", "setuid",
//	            "setgid", "setgroups", "fork", "proto", ...); the agent then
//	            closes the connection.
//	'X' EXITED  i32 exit code (-1 if signalled), i32 signal (0 if exited);
//	            the agent then closes the connection.
//	'p' PONG    u32 protocol version, u32 number of running processes.
//	'k' OK      empty.
//	'O' OUTPUT  u8 stream (1 stdout, 2 stderr), u64 offset, at most 32 KiB
//	            of data.
//	'l' RECORD  i32 pid, u32 seq, u8 flags (bit0 exited, bit1 pty, bit2
//	            stdin open), i32 exit code, i32 signal, u64 stdout start,
//	            u64 stdout total, u64 stderr start, u64 stderr total, u32 cap,
//	            u64 run time in ms (until now, or until the exit), the tag.
//	'e' END     empty: the list is complete.
//
// Closing the connection before EXITED kills the process group of the
// process: cancellation is close. The process runs in its own session
// (pgid == pid), with supplementary groups dropped, the requested uid, gid,
// cwd (empty means "/") and environment, the attached fds on 0, 1 and 2
// (/dev/null for the others), no other fds, default signal dispositions and
// an empty signal mask. argv[0] without a '/' is searched in the PATH of the
// request environment. Its resource limits are the agent's own as the agent
// was started (nofile with the soft limit the agent had before raising its
// own to the hard), then those in _WARREN_CHILD_RLIMITS at the agent's start
// ("RES:SOFT:HARD", ','-separated: limits meant for programs that the agent
// does not hold itself to; the container init stage sets it).
//
// # Jobs
//
// A JOB frame runs a whole job of the fncall backend (internal/fncall) and
// resets the sandbox, in one round trip; only an agent that is its pid
// namespace's PID 1 takes one (FAILED step "job", EPERM, elsewhere):
//
//	'J' JOB     u32 uid, u32 gid, u32 nsteps (1-64), u32 nwipe (0-16),
//	            the work directory and nwipe more directories the reset
//	            empties, NUL-terminated; then per step: u32 flags (bit0
//	            run the next step even if this one failed), u32 argc,
//	            u32 envc, u32 nin, u32 nout (0-64 each), u64 cpu ms,
//	            u64 wall ms (> 0), u64 memory bytes, u64 output cap per
//	            stream, u64 file size, u64 output file cap, u32 processes,
//	            u32 open files (0: no limit, for all but wall), u32 stdin
//	            length and the stdin bytes, argc + envc strings; nin input
//	            files: u32 mode, i32 from step (-1: inline), u32 length,
//	            the name, then the bytes (inline) or the earlier step's
//	            output name; nout output names. Names are relative, with
//	            no "." or ".." components.
//	'k' STEP    one per step run, as it ends (a client that loses the
//	            agent mid-job keeps the steps that ended): u32 status
//	            (1 accepted, 2 non-zero exit, 3 signalled, 4 time limit,
//	            5 memory limit, 6 output limit, 7 file error, 8 internal
//	            error), i32 exit code (-1 if
//	            signalled), i32 signal, u64 CPU µs, u64 wall µs, u64 peak
//	            resident bytes (the program's and its waited-for
//	            children's largest), u32 flags (bit0 stdout, bit1 stderr
//	            truncated), i32 errno and a NUL-terminated step name (why
//	            a file, output or internal error: "filein", "exec",
//	            "fork", "disk"...),
//	            u32 length + stdout, u32 length + stderr, u32 nout, and per
//	            output file: i32 errno (ENOENT missing, EFBIG over the cap,
//	            EACCES through a symlink), u32 length, the bytes.
//	'j' RESULT  after the last step and the reset: u32 steps run (the
//	            STEP frames sent), u32 reset errno (0: the sandbox is clean).
//
// Each step is a child in its own session with supplementary groups
// dropped, uid and gid as asked, cwd the work directory (made by the
// first job, owned by uid), the input files written there as that user
// (so a symlink an earlier step left leads only where the user may write
// anyway), stdin from a memfd, stdout and stderr pipes the agent reads up
// to the cap (one byte more ends the step: output limit), and the
// limits as rlimits: CPU in whole seconds (the agent compares the exact
// CPU time after), FSIZE (SIGXFSZ: output limit), NOFILE, NPROC, CORE 0.
// The agent waits on the pipes, its SIGCHLD signalfd and the wall
// deadline; when the step's process exits, or a limit is hit, it kills
// every process of the namespace (kill(-1)) and reaps until none is
// left (2 s at most: longer fails the reset). Output files are then read
// with openat2 beneath the work directory, through no symlink. A step
// that was accepted, exited non-zero or was signalled while the work
// directory's filesystem has under 64 KiB or no inode left (statvfs)
// filled the job's disk quota: output limit, errno ENOSPC, step "disk".
// After the
// last step the reset removes SysV IPC objects and empties the work
// directory (its mode back to 0755, its owner uid) and the wipe
// directories, walking at most 48 levels deep. The agent runs the job
// synchronously: a sandbox that takes jobs serves nothing else
// meanwhile. Peak memory over the limit is memory limit; a kill by the
// memory cgroup arrives as SIGKILL, which the container backend turns
// into memory limit by its OOM counter.
//
// # Background processes
//
// EXEC with DETACH starts a process the agent owns rather than the
// connection: the agent replies STARTED and closes, and the process runs
// on, whoever connects or not. The agent makes its stdio itself: three
// pipes, or with PTY one pty pair from the sandbox's own devpts
// (/dev/ptmx, opened in the sandbox's mount namespace; TIOCGPTPEER for
// the slave, which becomes the controlling terminal of the new session)
// at rows x cols. It reads stdout and stderr (the pty's master: one
// stream) whenever they have data, into one buffer per stream that keeps
// the latest cap bytes (1 MiB by default, 64 MiB at most): it starts at
// 4 KiB and doubles, so a quiet process costs a page per stream and a
// silent one nothing, and it is anonymous memory of the agent, charged to
// the sandbox's memory cgroup. A process therefore never blocks on a full
// pipe while no daemon is attached, and a daemon restart loses nothing
// within the cap. Offsets are absolute; [start, total) is what a buffer
// holds. ATTACH sends a stream from max(offset, start), chunk by chunk as
// the socket takes them (a slow client resumes at the oldest byte kept,
// and the offsets show the gap), live as data comes, and EXITED once the
// process was reaped and the client caught up: at reap the agent first
// drains what the pipes hold, so EXITED follows all output written before
// the exit. Any number of clients attach at once; a client attached with
// both offsets all-ones is a waiter, told only the exit. The record (pid,
// status, buffers, tag: at most 3 KiB the daemon uses to rebuild its view
// after a restart) stays until the client forgets it (FORGET) or the
// sandbox goes. The daemon forgets the exited processes it no longer keeps
// (internal/daemon: MaxExitedProcesses), so a sandbox runs any number of
// processes over its life; the agent refuses a start (FAILED EAGAIN
// "limit") while it holds 2,048 records, a backstop above the daemon's
// 1,024 running plus 256 exited. FORGET closes the read ends of the
// streams, so a child that inherited them and writes on gets EPIPE.
// The agent closes a
// process's stdin end when it exits; an exited process's pid is never
// signalled again.
package agent

// EnvFD names the environment variable that turns a process into the agent;
// its value is the number of the inherited listening socket fd.
const EnvFD = "_WARREN_AGENT_FD"

// ProtocolVersion is the version the agent reports in PONG.
const ProtocolVersion = 3

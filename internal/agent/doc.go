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
// # Protocol (version 1)
//
// One connection per process. Every frame is a little-endian u32 payload
// length, a u8 type, and the payload; payloads are at most 4 MiB.
//
// Client to agent:
//
//	'E' EXEC    u32 flags (bit0 stdin, bit1 stdout, bit2 stderr attached),
//	            u32 uid, u32 gid, u32 argc, u32 envc, then NUL-terminated
//	            strings: cwd, argc argv entries, envc "K=V" entries. The fds
//	            of the set bits ride on the frame as SCM_RIGHTS, in the order
//	            stdin, stdout, stderr.
//	'S' SIGNAL  i32 signo, u8 group (1: kill(-pid), 0: kill(pid)).
//	'P' PING    empty.
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
//
// Closing the connection before EXITED kills the process group of the
// process: cancellation is close. The process runs in its own session
// (pgid == pid), with supplementary groups dropped, the requested uid, gid,
// cwd (empty means "/") and environment, the attached fds on 0, 1 and 2
// (/dev/null for the others), no other fds, default signal dispositions and
// an empty signal mask. argv[0] without a '/' is searched in the PATH of the
// request environment.
package agent

// EnvFD names the environment variable that turns a process into the agent;
// its value is the number of the inherited listening socket fd.
const EnvFD = "_WARREN_AGENT_FD"

// ProtocolVersion is the version the agent reports in PONG.
const ProtocolVersion = 2

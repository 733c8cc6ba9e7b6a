// Package guest is Warren's agent inside a microVM: the VM's PID 1. It
// mounts the kernel's filesystems, loads the modules the host put in its
// initramfs, and serves the host over one virtio-serial port, on which
// yamux carries one stream per call. It is built as a small static
// binary of its own (cmd/warren-guest), without the daemon's code.
//
// The protocol on a stream: the host writes one JSON Request line, then
// both sides write frames: a kind byte, a 4-byte little-endian length,
// and that many bytes. From the guest: 's' started (a JSON Started), 'o'
// stdout, 'e' stderr, 'x' the end (a JSON Exit for a process, the answer
// for other calls; last), 'f' a failure (its message; last). From the
// host, to a started process: 'i' stdin bytes, 'c' close stdin, 'k' a
// JSON Signal. A process whose stream the host closes is killed with its
// process group.
package guest

import "github.com/warrenrl/warren/internal/sandboxfs"

// PortName is the virtio-serial port the host and the agent talk over.
const PortName = "warren"

// Request is a call from the host.
type Request struct {
	Op   string   `json:"op"` // "ping", "exec", "fs"
	Argv []string `json:"argv,omitempty"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	UID  uint32   `json:"uid,omitempty"`
	GID  uint32   `json:"gid,omitempty"`
	// Which streams the process gets (the others are /dev/null).
	Stdin  bool `json:"stdin,omitempty"`
	Stdout bool `json:"stdout,omitempty"`
	Stderr bool `json:"stderr,omitempty"`
	// FS is a file call ("fs"): a method of internal/sandboxfs's FS on
	// the sandbox's root, the same code the container backend runs on the
	// node. WriteFile and TarIn take their data in 'i' frames up to a
	// 'c'; ReadFile and TarOut send theirs in 'o' frames; the 'x' frame
	// is an FSResult.
	FS *FSCall `json:"fs,omitempty"`
}

// FSCall names a file method and its arguments.
type FSCall struct {
	Method    string `json:"method"` // WriteFile, ReadFile, List, Stat, Mkdir, Remove, TarOut, TarIn
	Path      string `json:"path"`
	Off       int64  `json:"off,omitempty"`
	Length    int64  `json:"length,omitempty"`
	Mode      uint32 `json:"mode,omitempty"` // a Go os.FileMode
	Append    bool   `json:"append,omitempty"`
	Parents   bool   `json:"parents,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	PageSize  int    `json:"page_size,omitempty"`
	Token     string `json:"token,omitempty"`
}

// FSResult is a file call's answer; Category and Error are set when it
// failed (Category an errdefs category's name).
type FSResult struct {
	Size     int64                `json:"size,omitempty"`
	EOF      bool                 `json:"eof,omitempty"`
	Info     *sandboxfs.FileInfo  `json:"info,omitempty"`
	Infos    []sandboxfs.FileInfo `json:"infos,omitempty"`
	Token    string               `json:"token,omitempty"`
	Category string               `json:"category,omitempty"`
	Error    string               `json:"error,omitempty"`
}

// Started is a process's start: its pid in the guest.
type Started struct {
	Pid int `json:"pid"`
}

// Signal asks for a signal to a started process, or its group.
type Signal struct {
	Signal int  `json:"signal"`
	Group  bool `json:"group,omitempty"`
}

// Exit is how a process ended.
type Exit struct {
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
}

// Ping is the answer to "ping", in an 'x' frame's place: what the guest
// knows of itself once it serves.
type Ping struct {
	Kernel   string  `json:"kernel"`
	UptimeMs float64 `json:"uptime_ms"` // the guest kernel's uptime when it answered
}

// Frame kinds.
const (
	KindStarted = 's'
	KindStdout  = 'o'
	KindStderr  = 'e'
	KindExit    = 'x'
	KindFail    = 'f'
	KindStdin   = 'i'
	KindCloseIn = 'c'
	KindSignal  = 'k'
)

// Failure is an 'f' frame: why a call failed, with the errdefs category's
// name the host gives its error.
type Failure struct {
	Category string `json:"category"`
	Error    string `json:"error"`
}

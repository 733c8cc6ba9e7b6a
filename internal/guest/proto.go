// Package guest is Warren's agent inside a microVM: the VM's PID 1. It
// mounts the kernel's filesystems, loads the modules the host put in its
// initramfs, and serves the host over one virtio-serial port, on which
// yamux carries one stream per call. It is built as a small static
// binary of its own (cmd/warren-guest), without the daemon's code.
//
// The protocol on a stream: the host writes one JSON Request line; the
// guest answers with frames: a kind byte, a 4-byte little-endian length,
// and that many bytes. Kinds: 'o' stdout, 'e' stderr, 'x' the exit (a
// JSON Exit, last), 'f' a failure to run (its message, last).
package guest

// PortName is the virtio-serial port the host and the agent talk over.
const PortName = "warren"

// Request is a call from the host.
type Request struct {
	Op   string   `json:"op"` // "ping", "exec"
	Argv []string `json:"argv,omitempty"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
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
	KindStdout = 'o'
	KindStderr = 'e'
	KindExit   = 'x'
	KindFail   = 'f'
)

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
// JSON Signal, 'w' a JSON Winsize (a process on a pty). A process whose
// stream the host closes is killed with its process group; closing the
// stdin of a process on a pty sends the terminal's EOF character.
//
// Background processes ("bg_*" ops) are the agent's: it keeps their
// records and the latest BG.Cap bytes of each output stream, whether or
// not the host follows them, so they outlive the stream (and the daemon)
// that started them. "bg_start" answers 's' once the process runs;
// "bg_list" an 'x' with the []BGInfo in start order; "bg_attach" sends
// 'o'/'e' frames whose data is the 8-byte little-endian offset of the
// bytes after it in their stream, from Off (-1: none of that stream), then
// the 'x' Exit once the process exited and what it wrote before was sent;
// "bg_stdin" answers 's', then writes the host's 'i' frames to the
// process's stdin (closing the stream leaves the stdin open);
// "bg_closein", "bg_signal", "bg_resize" and "bg_forget" answer an empty
// 'x'. A process is named by its pid in the sandbox; a pid that was
// reused names its latest record.
package guest

import "github.com/warrenrl/warren/internal/sandboxfs"

// PortName is the virtio-serial port the host and the agent talk over.
const PortName = "warren"

// ModuleOrder is the initramfs's list of the kernel modules the init
// loads, one path per line, dependencies first (LoadModules).
const ModuleOrder = "/lib/modules/order"

// TransportVsock on the kernel command line (warren.transport=vsock) has
// the agent serve AF_VSOCK port VsockPort instead of the virtio-serial
// port PortName.
const (
	TransportVsock = "vsock"
	VsockPort      = 0x5741 // "WA"
	// VsockReady is what the agent writes to the console once it listens.
	VsockReady = "vsock: listening"
)

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
	// PTY runs the process on a new terminal of Rows x Cols: its output
	// comes in 'o' frames, its input goes in 'i' frames.
	PTY  bool   `json:"pty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Rlimits are the process's resource limits ("exec", "bg_start");
	// the others are the agent's (raised to the most at boot).
	Rlimits []Rlimit `json:"rlimits,omitempty"`
	// BG are a background process's settings ("bg_start").
	BG *BGOpts `json:"bg,omitempty"`
	// Pid names a background process (the other "bg_*" ops).
	Pid int `json:"pid,omitempty"`
	// Off are the offsets "bg_attach" follows stdout and stderr from.
	Off [2]int64 `json:"off,omitempty"`
	// Port is a TCP port in the sandbox to connect to ("dial"): the
	// answer is 's', and the stream then carries the connection's bytes
	// both ways, unframed.
	Port int `json:"port,omitempty"`
	// Signal is "bg_signal"'s, Size "bg_resize"'s.
	Signal *Signal  `json:"signal,omitempty"`
	Size   *Winsize `json:"size,omitempty"`
	// Restored is "restored"'s: the host restored the VM from a
	// checkpoint (restore_linux.go).
	Restored *Restored `json:"restored,omitempty"`
	// Limits are "limits"'s: new limits of the sandbox's cgroup in the
	// guest (limits_linux.go).
	Limits *Limits `json:"limits,omitempty"`
	// Network is "network"'s: eth0's address and gateway for a VM
	// restored on another tap, or a full OS's network after its boot
	// (restore_linux.go).
	Network *Network `json:"network,omitempty"`
}

// Network is a VM's place on the node's sandbox subnet: the /31's odd
// address and its gateway (IPv4).
type Network struct {
	Addr    string `json:"addr"`
	Gateway string `json:"gateway"`
	// MAC names the interface by its hardware address where the guest
	// OS names it (a full OS's udev: enp0s2, not eth0); "" is eth0.
	MAC string `json:"mac,omitempty"`
	// Nameserver, if set, is written into the sandbox's
	// /etc/resolv.conf: the resolver at the gateway.
	Nameserver string `json:"nameserver,omitempty"`
}

// Restored tells the agent of a VM restored from a checkpoint what it
// cannot know: fresh randomness for the guest's generator, and the time.
type Restored struct {
	Seed     []byte `json:"seed"`
	UnixNano int64  `json:"unix_nano"`
}

// Rlimit is one resource limit (Resource: RLIMIT_*).
type Rlimit struct {
	Resource int    `json:"r"`
	Soft     uint64 `json:"s"`
	Hard     uint64 `json:"h"`
}

// BGOpts are a background process's settings.
type BGOpts struct {
	Cap int64  `json:"cap"` // bytes kept of each stream
	Tag []byte `json:"tag,omitempty"`
}

// MaxOutputCap bounds BGOpts.Cap, and MaxRecords the background process
// records the agent keeps at once (as the container agent's do): the
// buffers are guest memory.
const (
	MaxOutputCap = 64 << 20
	MaxRecords   = 2048
)

// BGInfo is a background process's record ("bg_list").
type BGInfo struct {
	Pid       int      `json:"pid"`
	Exited    bool     `json:"exited,omitempty"`
	Exit      Exit     `json:"exit"`
	PTY       bool     `json:"pty,omitempty"`
	StdinOpen bool     `json:"stdin_open,omitempty"`
	Stdout    [2]int64 `json:"stdout"` // [start, total) kept
	Stderr    [2]int64 `json:"stderr"`
	Cap       int64    `json:"cap"`
	RuntimeMs int64    `json:"runtime_ms"`
	Tag       []byte   `json:"tag,omitempty"`
}

// Winsize is a terminal's size.
type Winsize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
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
	// Tar: TarOut's options (an older agent ignores them: the archive
	// is then plain, which every reader reads).
	Tar sandboxfs.TarOptions `json:"tar,omitempty"`
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
	KindResize  = 'w'
)

// Failure is an 'f' frame: why a call failed, with the errdefs category's
// name the host gives its error.
type Failure struct {
	Category string `json:"category"`
	Error    string `json:"error"`
	// Exited: the call needs a running process, and it exited.
	Exited bool `json:"exited,omitempty"`
}

// CgroupStats are the sandbox's counters from its cgroup in the guest
// ("cgroup" op, in the 'x' frame).
type CgroupStats struct {
	OOMKills    uint64 `json:"oom_kills"` // memory.events oom_kill
	Pids        uint64 `json:"pids"`      // pids.current
	MemoryBytes uint64 `json:"memory"`    // memory.current
	CPUUsec     uint64 `json:"cpu_usec"`  // cpu.stat usage_usec
	// The limits (0: none): memory.max, pids.max.
	MemoryMax uint64 `json:"memory_max,omitempty"`
	PidsMax   uint64 `json:"pids_max,omitempty"`
}

// Limits change the sandbox cgroup's limits in the guest ("limits"): a
// nil field is left as it is, 0 lifts the limit. The agent writes them
// all or none; the 'x' frame is an empty object.
type Limits struct {
	MemoryBytes *int64 `json:"memory_bytes,omitempty"`
	PidsMax     *int64 `json:"pids_max,omitempty"`
}

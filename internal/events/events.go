// Package events records the security events of a node's sandboxes:
// every action Warren contained or denied and can see (an OOM kill, a
// fork refused at the pids limit, output dropped past a cap, a full
// disk, a process killed by its timeout; later seccomp and LSM denials).
//
// A Log keeps the latest events of each sandbox in a bounded ring for the
// API, appends every event to an audit file under the state directory
// (JSON lines, size-capped with one rotated file, read back at start so
// a restarted daemon still lists them), and counts them by kind for the
// node's metrics. Producers only see Recorder, so a kernel source (the
// audit netlink group's seccomp records) can feed it like the daemon's
// own checks do.
package events

import (
	"context"
	"time"
)

// Kind names what was contained. Values are stable: they are the
// metric's label and the API's and audit file's field.
type Kind string

// The kinds Warren records.
const (
	// OOMKill: the kernel's OOM killer killed a process of the sandbox
	// at its memory limit.
	OOMKill Kind = "oom_kill"
	// PidsLimit: the kernel refused forks at the sandbox's pids limit.
	PidsLimit Kind = "pids_limit"
	// OutputCap: an exec or background process wrote more than its
	// output limit; the excess was counted and dropped.
	OutputCap Kind = "output_cap"
	// DiskFull: the sandbox's own disk ran out of blocks; InodesFull:
	// out of inodes. Writes in that sandbox fail with ENOSPC.
	DiskFull   Kind = "disk_full"
	InodesFull Kind = "inodes_full"
	// Timeout: Warren killed an exec or background process whose
	// timeout passed.
	Timeout Kind = "timeout"
	// DiskReserve: the node's disk fell below half its reserve and the
	// daemon stopped this sandbox, whose writable layer took the most.
	DiskReserve Kind = "disk_reserve"
	// Seccomp: the kernel refused a system call by the sandbox's
	// seccomp filter (fed by a kernel audit source).
	Seccomp Kind = "seccomp"
	// PolicyDrop: the sandbox's network policy refused a packet it sent
	// (a connection to a host or port outside its allowlist, to the node,
	// to another sandbox); sampled, at most 100 a second per rule on a
	// node.
	PolicyDrop Kind = "policy_drop"
	// DNSRefused: Warren's resolver refused a name the sandbox's
	// allowlist does not name (internal/resolver): queries carry no
	// data out of an allowlisted sandbox.
	DNSRefused Kind = "dns_refused"
)

// Kinds lists every kind, for metrics that start at zero.
var Kinds = []Kind{OOMKill, PidsLimit, OutputCap, DiskFull, InodesFull, Timeout, DiskReserve, Seccomp, PolicyDrop, DNSRefused}

// Event is one contained or denied action of one sandbox.
type Event struct {
	// Seq numbers a sandbox's events from 1, in the order recorded; a
	// gap before the oldest one listed is events the ring let go.
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Kind    Kind      `json:"kind"`
	// Detail says what happened in words, with the numbers (at most
	// MaxDetail bytes).
	Detail string `json:"detail"`
	// Count is how many occurrences the event stands for (a counter of
	// the kernel's that rose by that much since the last look); 1 for a
	// single action.
	Count uint64 `json:"count"`
	// Process is the exec's pid or the background process's id the
	// event concerns, when one does.
	Process string `json:"process,omitempty"`
	// Suppressed is how many events of this sandbox the rate limit left
	// out just before this one (they are still counted in the metrics).
	Suppressed uint64 `json:"suppressed,omitempty"`
}

// MaxDetail bounds Event.Detail: a detail may quote what a sandbox chose
// (a command line), and the ring and file must stay bounded.
const MaxDetail = 512

// Recorder is what event producers feed. Record fills in Seq and Time
// (when zero) and never blocks on I/O for long.
type Recorder interface {
	Record(e Event)
}

// Source is a node-wide producer that attributes its events to
// sandboxes itself (a reader of the kernel's audit records, which name a
// host pid: Attributor turns it into a sandbox). Run feeds r until ctx
// ends.
type Source interface {
	Run(ctx context.Context, r Recorder) error
}

// Attributor finds the sandbox a host process belongs to (the container
// backend reads its cgroup), for sources that see host pids, and the
// process's pid inside the sandbox (what the API shows).
type Attributor interface {
	SandboxOfPid(hostPid int) (id string, pid int, ok bool)
}

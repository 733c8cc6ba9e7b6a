// Package backend defines the interface every sandbox backend (container,
// fncall, microvm, fullvm) implements. The daemon only talks to this
// interface; the shared conformance suite in backend/conformance checks
// that a backend honours it.
package backend

import (
	"context"
	"io"
	"syscall"
	"time"
)

// Spec is everything a backend needs to create one sandbox. The daemon
// resolves images to layers and validates limits before calling Create.
type Spec struct {
	ID       string
	Hostname string
	// Layers are read-only lower layers, top-most first, as host paths to
	// directories (EROFS mounts arrive as directories too).
	Layers []string
	// Limits. Zero means "no limit" for memory and pids, and "no quota"
	// for CPU.
	CPUMillis   int64 // 1000 = one core
	MemoryBytes int64
	PidsMax     int64
	// DiskBytes caps the writable layer; 0 leaves it on the node's disk.
	DiskBytes int64
	// Defaults applied to every process started in the sandbox.
	Env     []string
	Workdir string
}

// Backend creates sandboxes and re-adopts them after a daemon restart.
type Backend interface {
	Name() string
	// Create builds and starts a sandbox. On error nothing is left behind.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Adopt reattaches to a sandbox created by an earlier daemon from the
	// state it returned. If the sandbox is proven gone, Adopt releases
	// whatever is left of it and returns an error of category NotFound.
	// Any other error means it could not tell (descriptors, memory): it
	// leaves the sandbox alone, and the daemon keeps it LOST and retries.
	Adopt(ctx context.Context, id string, state []byte) (Sandbox, error)
	// Sweep removes every resource of this backend that belongs to no id
	// in keep: orphans of a crash between create steps.
	Sweep(ctx context.Context, keep map[string]bool) error
}

// Sandbox is one live sandbox.
type Sandbox interface {
	ID() string
	// State is an opaque blob the daemon persists so that Adopt can find
	// the sandbox again after a restart.
	State() []byte
	// Root is a host path of the sandbox's root filesystem, or "" where
	// the filesystem is not reachable from the host (VM backends): file
	// operations then go through Start.
	Root() string
	// Start starts a process in the sandbox.
	Start(ctx context.Context, p ProcSpec) (Process, error)
	// Exited is canceled when the sandbox stops on its own (its init
	// died). It derives from context.Background, so context.AfterFunc on
	// it registers a callback instead of parking a goroutine: the daemon
	// watches thousands of sandboxes that way.
	Exited() context.Context
	// Stats reads resource use; counters are cumulative.
	Stats() (Stats, error)
	// Destroy stops every process and releases every resource. It is
	// idempotent and safe after the sandbox died.
	Destroy(ctx context.Context) error
}

// OOMCounter is implemented by sandboxes that can read their OOM-kill
// count alone, cheaper than Stats; the daemon reads it around every exec.
type OOMCounter interface {
	OOMKills() (uint64, error)
}

// Backlogged is implemented by backends that finish deletes in the
// background (the container backend removes writable layers after
// Destroy returns); the daemon exports the backlog as a metric.
type Backlogged interface {
	// Backlog is how many deleted sandboxes' leftovers wait for removal.
	Backlog() int
	// DeleteFailures counts leftovers the backend could not remove (and
	// left for its next start to try again).
	DeleteFailures() uint64
}

// Committer is implemented by sandboxes whose writable layer is an
// overlayfs upper directory on the host (the container backend), which
// the daemon can turn into a layer (CommitSandbox).
type Committer interface {
	// UpperDir is the host path of the sandbox's overlayfs upper
	// directory: what the sandbox created or changed, with deletions as
	// overlayfs whiteouts (0/0 character devices) and opaque directories
	// (xattr trusted.overlay.opaque=y).
	UpperDir() string
	// Freeze stops every process of the sandbox, so that the upper
	// directory holds still while it is read, until thaw is called
	// (idempotent). Calls of the daemon into the sandbox block meanwhile.
	Freeze(ctx context.Context) (thaw func() error, err error)
}

// Updater is implemented by sandboxes whose limits can change while they
// run (UpdateSandbox). Later fields (network policy, QoS) join Update;
// a backend refuses with Unsupported a field it cannot apply at all (and
// with Invalid a value out of its range) rather than ignoring it.
type Updater interface {
	// Update applies every set field of u, or none: it validates first,
	// and restores what it changed if a later step fails.
	Update(ctx context.Context, u Update) error
}

// Update is a change of a running sandbox. A nil field is left as it is;
// a set limit means what Spec's does (0: no limit).
type Update struct {
	CPUMillis   *int64
	MemoryBytes *int64
	PidsMax     *int64
}

// ProcSpec describes a process to start.
type ProcSpec struct {
	Argv []string
	Env  []string // full environment; the daemon merges the sandbox defaults
	Cwd  string
	UID  uint32
	GID  uint32
	// Which standard streams to connect. Unconnected streams are /dev/null.
	Stdin, Stdout, Stderr bool
}

// Process is a running process in a sandbox. Its streams are nil when not
// requested in the ProcSpec.
type Process interface {
	Pid() int // pid inside the sandbox
	Stdin() io.WriteCloser
	Stdout() io.ReadCloser
	Stderr() io.ReadCloser
	// Signal sends sig to the process, or to its whole process group.
	Signal(sig syscall.Signal, group bool) error
	// Wait blocks until the process exits.
	Wait() (ExitStatus, error)
	// Close releases the handle; a process still running is killed with
	// its process group.
	Close() error
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	Code   int            // exit code, or -1 when killed by a signal
	Signal syscall.Signal // the killing signal, or 0
}

// Stats are resource counters of a sandbox.
type Stats struct {
	MemoryBytes uint64 // current usage
	OOMKills    uint64 // cumulative count of OOM kills in the sandbox
	CPUUsage    time.Duration
	Pids        uint64
}

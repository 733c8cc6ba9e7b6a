// Package backend defines the interface every sandbox backend (container,
// fncall, microvm, fullvm) implements. The daemon only talks to this
// interface; the shared conformance suite in backend/conformance checks
// that a backend honours it.
package backend

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/rlimit"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

// Spec is everything a backend needs to create one sandbox. The daemon
// resolves images to layers and validates limits before calling Create.
type Spec struct {
	ID       string
	Hostname string
	// Layers are the read-only lower layers, top-most first.
	Layers []Layer
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
	// Etc are files the sandbox's /etc gets over the image's (hosts,
	// hostname, resolv.conf: internal/etcfiles), as its own files: it may
	// change them. Empty keeps the image's. A backend puts them where a
	// commit sees them as the sandbox's changes (the container backend:
	// its writable layer), and leaves the image's alone where its /etc is
	// not a directory.
	Etc []etcfiles.File
	// Rlimits are the resource limits of every process started in the
	// sandbox, validated by the daemon (internal/rlimit); resources not
	// named keep what the backend's own process has. A backend's init and
	// agent may keep higher limits of their own where the programs' would
	// starve them.
	Rlimits []rlimit.Limit
	// Network is what the sandbox may reach (the zero value: loopback
	// only), validated by the daemon.
	Network netpolicy.Policy
	// AllowSetuid runs the sandbox's processes without no_new_privs, so
	// that setuid binaries and file capabilities work in it.
	AllowSetuid bool
	// UserNS runs the sandbox in a user namespace of its own: root inside
	// is an unprivileged host id (IDMapped reports which).
	UserNS bool
	// Devices are character device nodes the sandbox's /dev gets beyond
	// the standard ones (a GPU environment's control nodes: fncall). The
	// node's device filter must allow them (container: Options.Devices).
	Devices []Device
	// Mounts are host files bound read-only into the sandbox, executable
	// (driver libraries and tools: fncall's GPU environments), their
	// targets made where the image lacks them.
	Mounts []Mount
	// Restore, if set, is a checkpoint directory (Checkpointer) to
	// restore the sandbox's processes and writable layer from instead of
	// starting a new init: Layers and the other fields must be those of
	// the checkpointed sandbox. A backend without checkpoints refuses it
	// (Unsupported). A restore that fails leaves the directory as it was.
	Restore string
	// LazyPages restores the memory of Restore's processes lazily, as
	// they touch it, and the rest in the background, instead of before
	// the restore returns. A backend or node without it restores
	// eagerly.
	LazyPages bool
	// QoS is the sandbox's CPU class (the zero value: best-effort). A
	// backend that cannot honour a class refuses the create with
	// Unsupported rather than ignoring it.
	QoS QoS
}

// QoS classes (docs/ARCHITECTURE.md, "CPU QoS").
const (
	// QoSBestEffort runs the sandbox under SCHED_IDLE as a whole: it
	// gets the CPU the others leave. The default.
	QoSBestEffort = "be"
	// QoSLatency gives the sandbox a higher CPU weight and, where the
	// kernel has core scheduling, a physical core of its own while it
	// runs.
	QoSLatency = "ls"
)

// QoS is a sandbox's CPU class.
type QoS struct {
	Class string // QoSBestEffort ("" too) or QoSLatency
	// CPUs pins a QoSLatency sandbox to these CPUs; nil: not pinned.
	CPUs []int
}

// Latency reports whether q is the latency-sensitive class.
func (q QoS) Latency() bool { return q.Class == QoSLatency }

// Device is a character device node of a sandbox's /dev.
type Device struct {
	Name         string // in /dev: "nvidia0"
	Major, Minor uint32
}

// Mount is a read-only bind of a host file or directory into a sandbox.
type Mount struct {
	Source string // host path
	Target string // absolute path inside
}

// DeviceSetter is implemented by sandboxes whose /dev can gain and lose
// device nodes while they run: fncall gives a job the nodes of the GPUs
// it holds, and takes them back before the environment's next job.
type DeviceSetter interface {
	// SetDevices makes devs the sandbox's extra device nodes (beyond
	// Spec.Devices and the standard ones), removing those of the last
	// call. Processes that opened a removed node keep their descriptor:
	// the caller kills them first (fncall's reset does).
	SetDevices(devs []Device) error
}

// HostnameSetter is implemented by sandboxes whose hostname can change
// while they run (fncall names a pooled environment after the sandbox
// it becomes).
type HostnameSetter interface {
	SetHostname(name string) error
}

// Nested is implemented by backends whose sandboxes are sandboxes of
// another backend (fncall's are pooled container sandboxes). When the
// daemon sweeps that backend after adopting, it keeps the inner sandboxes
// of the nested ones it adopted.
type Nested interface {
	// Inner names the backend and id of the sandbox whose State is state.
	Inner(state []byte) (backendName, id string, ok bool)
}

// Checkpointer is implemented by sandboxes whose whole process tree can
// be saved to disk and restored later (Spec.Restore), on this node or on
// another that has the same layers.
type Checkpointer interface {
	// Checkpoint saves the processes and writable layer into dir (new or
	// empty, on the state directory's filesystem) and stops the sandbox:
	// its processes are gone and Exited is done, and the caller Destroys
	// it to release the rest. A sandbox that cannot be checkpointed
	// (Unsupported, or the failure's category) keeps running.
	Checkpoint(ctx context.Context, dir string) error
}

// CheckpointHolder is a Backend whose checkpoints hold node resources
// while they exist (the container backend: the user-namespace id range a
// restored sandbox comes back with). The daemon releases a checkpoint
// when it discards it or another node takes it, and holds the ones it
// finds at start again.
type CheckpointHolder interface {
	HoldCheckpoint(dir string) error
	// AdmitCheckpoint is HoldCheckpoint for a checkpoint made on another
	// node: Conflict when what it needs is another sandbox's here.
	AdmitCheckpoint(dir string) error
	ReleaseCheckpoint(dir string)
}

// NodeMemory is a Backend that reads the memory of all its sandboxes at
// once (the container backend: its cgroup parent's hierarchical
// counters), where summing each sandbox's Stats would read one set of
// files per sandbox at every metrics scrape.
type NodeMemory interface {
	SandboxesMemory() (Stats, error)
}

// CPUReader is a sandbox whose CPU time so far is one cheap read, which
// the daemon's periodic looks take first: a sandbox whose CPU time did
// not move since the last look cannot have changed its other counters.
type CPUReader interface {
	CPUUsage() (time.Duration, error)
}

// MemoryReporter is implemented by sandboxes that can say how much
// memory they are charged now (what a hibernation gives back).
type MemoryReporter interface {
	MemoryUse() (MemoryUse, error)
}

// IDMapped is implemented by sandboxes whose ids inside are not the
// host's: a user namespace maps ids 0..Size-1 inside to Base.. on the
// host. Its writable layer stores host ids, which file calls and commit
// shift. ok is false for a sandbox without one.
type IDMapped interface {
	IDMap() (base, size uint32, ok bool)
}

// SocketDirs is implemented by backends whose sandboxes each have a host
// directory that their processes see, where the daemon can bind a unix
// socket for them: the route of a harness sandbox to the API. A
// path-based unix socket works across mount, network and user
// namespaces, so the route opens nothing else of the node. The directory
// must be the sandbox's alone, and exist while the sandbox runs.
type SocketDirs interface {
	// SocketDir is sandbox id's directory on the host and its path
	// inside, known before the sandbox is created (its env names it).
	SocketDir(id string) (host, inside string)
}

// Layer is one read-only layer of a sandbox's root, as references a
// backend picks from: a container backend stacks the mounted directories
// in an overlay; a VM backend can attach the blobs as read-only disks.
type Layer struct {
	// Digest names the layer's content ("sha256:<hex>"); "" for layers
	// that are plain directories without one (tests).
	Digest string
	// Blob is the host path of the layer's EROFS image, or "" for a
	// directory layer (a legacy image store keeps trees, not blobs).
	Blob string
	// Dir is a host directory holding the layer's tree: the blob as the
	// node mounted it (shared, refcounted, pinned for the sandbox's life),
	// or the directory layer itself. "" for an EROFS layer when the
	// backend does not want mounts (LayerMounts).
	Dir string
	// HostIDs: the layer's files carry host ids already (a sandbox's
	// writable layer turned into a fork's base): a sandbox in a user
	// namespace stacks it as it is instead of idmapped through its
	// namespace, as it does the image's layers.
	HostIDs bool
}

// LayerMounts is implemented by backends that say whether they want
// their layers mounted on the host. Without it they are (the container
// backend stacks the mounted directories); a VM backend that attaches
// Layer.Blob as a disk returns false, and the daemon then only holds the
// blobs (against garbage collection) for the sandbox's life.
type LayerMounts interface {
	MountLayers() bool
}

// DirLayers are layers that are host directories only, top-most first.
func DirLayers(dirs ...string) []Layer {
	out := make([]Layer, len(dirs))
	for i, d := range dirs {
		out[i] = Layer{Dir: d}
	}
	return out
}

// FileSystem is the file calls of one sandbox as the daemon serves them
// (paths are absolute inside the sandbox; errors carry errdefs
// categories). sandboxfs.FS implements it over a host-visible root.
type FileSystem interface {
	WriteFile(ctx context.Context, p string, r io.Reader, mode os.FileMode, append, mkParents bool) error
	ReadFile(ctx context.Context, p string, off, length int64) (data []byte, size int64, eof bool, err error)
	List(ctx context.Context, p string, pageSize int, token string) ([]sandboxfs.FileInfo, string, error)
	Stat(ctx context.Context, p string) (sandboxfs.FileInfo, error)
	Mkdir(ctx context.Context, p string, mode os.FileMode, parents bool) error
	Remove(ctx context.Context, p string, recursive bool) error
	TarOut(ctx context.Context, p string, w io.Writer, o sandboxfs.TarOptions) error
	TarIn(ctx context.Context, p string, r io.Reader) error
}

// FileReplacer is implemented by a FileSystem that can replace a file
// atomically while it holds given content (sandboxfs.FS.ReplaceIf): the
// daemon rewrites the /etc files it wrote this way when they go stale
// (resolv.conf after a network change). Without it they are left as
// written at create.
type FileReplacer interface {
	ReplaceIf(ctx context.Context, p string, old, data []byte) (replaced bool, err error)
}

// DirWatcher is implemented by a FileSystem that can follow the changes
// of a directory (sandboxfs.FS: inotify on the host-visible root). Without
// it WatchDir is Unsupported.
type DirWatcher interface {
	// WatchDir watches directory p (and those below it with recursive,
	// at most maxDirs in all) until the watch is closed.
	WatchDir(ctx context.Context, p string, recursive bool, maxDirs int) (sandboxfs.DirWatch, error)
}

var _ DirWatcher = (*sandboxfs.FS)(nil)

// Files is implemented by sandboxes that serve file calls themselves,
// typically because their root is not reachable from the host (Root
// returns ""; VM backends, through their agent). The daemon reads user
// and group names (/etc/passwd, /etc/group) through it too. Without
// Files the daemon uses sandboxfs over Root (the container backend), and
// where Root is "" as well, file calls and user names are Unsupported.
type Files interface {
	Files() FileSystem
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

// OOMTracker is implemented by sandboxes that can tell whether the
// kernel's OOM killer chose one particular process (OOMCounter counts the
// whole sandbox: a rise during an exec may be another process's kill).
type OOMTracker interface {
	// TrackOOM is called right after Start, while p runs. The func it
	// returns, called once p has exited, reports whether p itself was
	// OOM-killed. A nil func means the sandbox cannot tell for p.
	TrackOOM(p Process) func() bool
}

// Containment is implemented by sandboxes that can tell how often the
// kernel contained them, cheaply enough to be polled on every sandbox of
// a node (a few small reads): the daemon turns each rise into a security
// event (internal/events).
type Containment interface {
	Contained() (Contained, error)
}

// Contained are a sandbox's containment counters and states.
type Contained struct {
	OOMKills    uint64 // cumulative OOM kills in the sandbox
	PidsRefused uint64 // cumulative forks refused at its pids limit
	// CPUUsage is its processes' CPU time so far (0: unknown), for the
	// node's utilisation statistics.
	CPUUsage time.Duration
	// Disk is set for a sandbox with a disk of its own (a disk limit):
	// its size and what is left of it.
	Disk *DiskUse
}

// DiskUse is the state of a sandbox's own disk.
type DiskUse struct {
	Bytes, FreeBytes   uint64
	Inodes, FreeInodes uint64
}

// DiskUser is implemented by sandboxes whose writable layer takes space
// on the node's disk (the container backend: the state directory's
// filesystem). The daemon asks only when that disk runs low, to find the
// sandbox to stop: DiskUsage may walk the sandbox's whole writable layer.
type DiskUser interface {
	// DiskUsage is how much of the node's disk the sandbox's writable
	// layer takes, as far as it could tell by ctx's end.
	DiskUsage(ctx context.Context) (LayerUsage, error)
}

// MemoryRestorer is a sandbox made by a Restore that says how its
// memory came back.
type MemoryRestorer interface {
	// MemoryRestore: lazy is whether the memory comes back lazily;
	// eagerWhy, when Spec.LazyPages asked for that and it does not, why
	// (a node without userfaultfd, a setting, the backend).
	MemoryRestore() (lazy bool, eagerWhy string)
}

// LayerUsage is what a writable layer takes of the node's disk.
type LayerUsage struct {
	Bytes  uint64 // allocated blocks
	Inodes uint64 // files, directories, links
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

// Pauser is implemented by sandboxes that can be paused in place: every
// process frozen where it is (no signal, nothing it can notice but the
// clock), and the memory they hold given back as far as the node allows,
// until Resume. A paused sandbox keeps its processes, files and network
// identity; calls into it (its agent is frozen too) block until it is
// resumed, so the daemon makes none.
type Pauser interface {
	// Pause freezes the sandbox's whole process tree, waiting (bounded)
	// until every task is frozen; with reclaim it then gives back the
	// page cache and, where the node has swap or zswap, pushes anonymous
	// memory out. All or nothing: on error the sandbox runs on.
	Pause(ctx context.Context, reclaim bool) (PauseStats, error)
	// Resume thaws the sandbox; o restores what Pause may have left
	// changed (a daemon may have crashed in the middle of a reclaim).
	// Idempotent: resuming a sandbox that runs does nothing.
	Resume(ctx context.Context, o ResumeOptions) error
}

// IdleReclaimer is implemented by sandboxes whose memory the node can
// take back while they run idle (the daemon's idle reclaim, Config.
// IdleReclaimAfter): page cache, and anonymous memory where the node has
// swap, without stopping them or risking an OOM kill.
type IdleReclaimer interface {
	ReclaimIdle(ctx context.Context) (before, after MemoryUse, err error)
	// MemoryPressure is the share of the last 10 s its tasks stalled on
	// memory (PSI "some avg10", 0-100); -1 where unknown.
	MemoryPressure() float64
}

// PauseStats are what a Pause did.
type PauseStats struct {
	// Before is the sandbox's memory once frozen, After once reclaimed
	// (equal to Before without reclaim).
	Before, After MemoryUse
	// Freeze is how long the freeze took, Reclaim the reclaim.
	Freeze, Reclaim time.Duration
}

// MemoryUse is a sandbox's memory in bytes: the whole charge, the page
// cache and the anonymous part of it, and what is out on swap.
type MemoryUse struct {
	Bytes, File, Anon, Swap uint64
}

// ResumeOptions are what Resume puts back.
type ResumeOptions struct {
	// MemoryBytes is the sandbox's memory limit (Spec's meaning), set
	// again in case a reclaim that lowered it was cut short; nil leaves
	// the limit as it is.
	MemoryBytes *int64
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
	// Network replaces the sandbox's network policy: new connections
	// follow it at once, and established ones it forbids are cut.
	Network *netpolicy.Policy
	// QoS replaces the sandbox's CPU class (and pinning), for its
	// running processes and those they start.
	QoS *QoS
}

// Networked is implemented by sandboxes that can say their network
// address ("" without one).
type Networked interface {
	NetworkAddress() string
}

// Resolved is implemented by sandboxes whose network has a resolver of
// Warren's: Nameserver is the address its resolv.conf names (the
// container backend: its gateway), invalid without a network. It
// changes when an update gives the sandbox a network or takes it away.
type Resolved interface {
	Nameserver() netip.Addr
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
	// PTY runs the process on a new terminal of Rows x Cols instead:
	// Stdout reads it (raw terminal bytes, both streams), Stdin writes to
	// it (closing Stdin sends the terminal's EOF character), Stderr is nil.
	PTY        bool
	Rows, Cols uint16
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

// Resizer is implemented by a Process started with PTY whose terminal
// can be resized while it runs (the daemon holds its master).
type Resizer interface {
	Resize(rows, cols uint16) error
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	Code   int            // exit code, or -1 when killed by a signal
	Signal syscall.Signal // the killing signal, or 0
}

// Stats are resource counters of a sandbox.
type Stats struct {
	MemoryBytes uint64 // current usage
	MemoryCache uint64 // of MemoryBytes, page cache
	// Of MemoryBytes, anonymous and kernel memory; MemorySwap is out on
	// swap, beside it (0 where the backend cannot tell).
	MemoryAnon, MemoryKernel, MemorySwap uint64
	OOMKills                             uint64 // cumulative count of OOM kills in the sandbox
	CPUUsage                             time.Duration
	Pids                                 uint64
}

// Background is implemented by sandboxes whose agent owns background
// processes: it makes their stdio, drains their output into bounded
// buffers whether or not the daemon is attached, and keeps their records,
// so that they outlive the daemon that started them and any number of
// clients can follow them by pid.
type Background interface {
	// StartBackground starts a process owned by the sandbox and returns
	// its pid once it runs. The streams in p are ignored: the sandbox
	// makes stdin, stdout and stderr (or one pty) itself.
	StartBackground(ctx context.Context, p ProcSpec, o BackgroundOpts) (pid int, err error)
	// ListBackground lists every background process the sandbox knows,
	// running or exited, in start order.
	ListBackground(ctx context.Context) ([]BackgroundInfo, error)
	// AttachBackground follows a process's output from the given offsets
	// (FromEnd: none of that stream, only the exit).
	AttachBackground(ctx context.Context, pid int, stdoutOff, stderrOff int64) (Attachment, error)
	// OpenStdin returns a handle on the process's stdin (the pty with
	// PTY); several may be open at once. Closing it closes only the
	// handle: CloseStdin ends the process's input.
	OpenStdin(ctx context.Context, pid int) (StdinWriter, error)
	CloseStdin(ctx context.Context, pid int) error
	// SignalBackground signals a running process or its group; an exited
	// one fails with an error matching os.ErrProcessDone.
	SignalBackground(ctx context.Context, pid int, sig syscall.Signal, group bool) error
	// ResizeBackground sets the window size of a PTY process's terminal.
	ResizeBackground(ctx context.Context, pid int, rows, cols uint16) error
}

// Forgetter is a Background that drops an exited process's record and kept
// output when asked; one without it keeps them until the sandbox goes.
// ForgetBackground fails with Unsupported where the sandbox's agent is too
// old to forget (a sandbox created before an upgrade), NotFound for no
// exited process of that pid, Conflict for one still running.
type Forgetter interface {
	ForgetBackground(ctx context.Context, pid int) error
}

// FromEnd as an attach offset skips that stream.
const FromEnd int64 = -1

// BackgroundOpts are a background process's settings.
type BackgroundOpts struct {
	// OutputCap is how many bytes of each stream are kept: the latest
	// ones, once a stream outgrows it.
	OutputCap int64
	// PTY runs the process on a new terminal of Rows x Cols, whose
	// output is Stdout (Stderr stays empty).
	PTY        bool
	Rows, Cols uint16
	// Tag is kept with the record and listed back, opaque (the daemon
	// keeps its own metadata there); at most MaxTag bytes.
	Tag []byte
}

// MaxTag bounds BackgroundOpts.Tag.
const MaxTag = 3072

// BackgroundInfo is a background process's record.
type BackgroundInfo struct {
	Pid       int
	Exited    bool
	Status    ExitStatus // once Exited
	PTY       bool
	StdinOpen bool
	// Stdout and Stderr are the offsets kept: [Start, Total).
	Stdout, Stderr StreamRange
	OutputCap      int64
	Runtime        time.Duration // until now, or until it exited
	Tag            []byte
}

// StreamRange is the part of a stream a buffer holds, by absolute offset.
type StreamRange struct{ Start, Total int64 }

// Attachment follows one background process.
type Attachment interface {
	// Next returns the next piece of output, or the exit status (Exit
	// set) once the process exited and its output so far was sent; after
	// that, io.EOF.
	Next() (Output, error)
	Close() error
}

// Output is a piece of a background process's output, or its end.
type Output struct {
	Stderr bool
	Offset int64 // of Data[0] in its stream; past an earlier end, bytes were dropped
	Data   []byte
	Exit   *ExitStatus
}

// StdinWriter writes to a background process's stdin; a deadline stops
// a write the process does not read.
type StdinWriter interface {
	io.WriteCloser
	SetWriteDeadline(time.Time) error
}

// PortDialer is implemented by sandboxes whose TCP ports the node can
// connect to (the E2B door's proxy to a server in the sandbox). The
// connection is made inside the sandbox's own network, to its loopback,
// so it reaches servers whether or not the sandbox has a network and
// whatever its egress policy: it is ingress only, and the sandbox gets
// no path out of it.
type PortDialer interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// idRE is what a sandbox id may be: it names directories, cgroups and
// network devices' peers on the node.
var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ValidID reports whether id may name a sandbox.
func ValidID(id string) bool { return idRE.MatchString(id) }

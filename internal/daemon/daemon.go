// Package daemon is the heart of `warren serve`: the Manager keeps the
// sandboxes of one node, persists them in the store, runs commands and
// background processes in them, moves files in and out, and deletes them
// when their lifetime passes.
//
// Sandboxes outlive the daemon: Close stops timers and watchers but leaves
// every sandbox running, and New re-adopts them from the store. Background
// processes do not survive a daemon restart: the agent kills a process
// whose connection drops, and Close closes those connections.
//
// Every error the Manager returns carries an errdefs category.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/connset"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/events"
	"github.com/warrenrl/warren/internal/fncall"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/metrics"
	"github.com/warrenrl/warren/internal/store"
)

// Defaults of Config.
const (
	DefaultStateDir    = "/var/lib/warren"
	DefaultBackend     = "container"
	DefaultTimeout     = time.Hour
	MaxTimeout         = 24 * time.Hour
	DefaultMemoryBytes = 512 << 20
	DefaultPids        = 1024
	DefaultExecTimeout = 10 * time.Minute
	// MaxProcessesPerSandbox bounds the background processes running in
	// a sandbox at once (a fork bomb through the API meets it); over its
	// life a sandbox runs any number.
	MaxProcessesPerSandbox = 1024
	// MaxExitedProcesses is how many exited background processes a
	// sandbox keeps (records in the daemon, records and output in the
	// agent) for WaitProcess, AttachProcess and ListProcesses after
	// their exit; older ones are forgotten. 256 lets a client start a
	// few hundred commands before it collects the first one's result,
	// and bounds what exited processes hold in the agent to 256 output
	// buffers (256 MiB at the default output limit, charged to the
	// sandbox) and about 1 MiB of records.
	MaxExitedProcesses = 256
)

// Config configures a Manager.
type Config struct {
	StateDir string // default /var/lib/warren
	// NodeTag starts the ids the node generates, so that a gateway
	// routes a call by its id alone (docs/ARCHITECTURE.md, "The
	// cluster"); empty outside a cluster.
	NodeTag string
	// MaxSandboxes is the most resident sandboxes (not stopped or
	// hibernated) the node admits, and reports (NodeStatus); 0: no cap.
	MaxSandboxes int
	// CPUOvercommit and MemoryOvercommit are the node's admission ratios
	// (Admission, qos.go); 0: no limit.
	CPUOvercommit, MemoryOvercommit float64
	Backends                        map[string]backend.Backend // by name; "container" is the default backend
	Images                          *image.Store
	Metrics                         *metrics.Metrics // nil: no metrics
	// DefaultTimeout is the sandbox lifetime when a request asks for none
	// (default 1h); MaxTimeout caps requested lifetimes (default 24h).
	DefaultTimeout     time.Duration
	MaxTimeout         time.Duration
	DefaultMemoryBytes int64         // default 512 MiB
	DefaultPids        int64         // default 1024
	DefaultDiskBytes   int64         // default 0: writable layers on the node's disk, unlimited
	DefaultExecTimeout time.Duration // default 10 min
	// GuardInterval is how often every running sandbox's containment
	// counters are read for security events (default 2 s).
	GuardInterval time.Duration
	// IdleReclaimAfter: a running sandbox idle this long (under 1 % of a
	// CPU at every guard look, and not stalled on memory) has its memory
	// reclaimed, once per idle spell (workload.go); 0: never.
	IdleReclaimAfter time.Duration
	// EventFileBytes caps the security event audit file (<state>/events;
	// default 16 MiB, and one rotated file as large).
	EventFileBytes int64
	// DiskReserveBytes is the free space the disk guard keeps on the
	// state directory's filesystem (diskguard.go); 0 turns it off.
	DiskReserveBytes int64
	// EventSources are node-wide producers of security events (the
	// kernel's seccomp audit records: internal/kaudit), run while the
	// Manager is open. Their events of sandboxes this daemon does not
	// know are dropped.
	EventSources []events.Source
	// TrajectoryMaxBytes caps each sandbox's trajectory log
	// (<state>/trajectory/<id>.log; default DefaultTrajectoryMaxBytes).
	// A full log refuses calls that carry a seq and runs the others
	// unrecorded.
	TrajectoryMaxBytes int64
	// TrajectoryNoSync writes outcomes to the log without fdatasync
	// before they are returned: they survive a daemon crash or restart
	// (the page cache), not a machine crash, which the running sandbox
	// and its unsynced writable layer do not survive either. Saves the
	// fdatasync per exec and file write (docs/BENCHMARKS.md).
	TrajectoryNoSync bool
	// NoTrajectory records no trajectory log (calls with a seq or a
	// session are then Unsupported).
	NoTrajectory bool
	// UserNSDefault creates sandboxes in a user namespace unless the
	// request says otherwise (CreateRequest.user_namespace).
	UserNSDefault bool
	// LazyPages restores the memory of resumed and forked sandboxes
	// lazily unless the request says otherwise (ResumeRequest.lazy_pages;
	// `warren serve --lazy-pages`, on by default).
	LazyPages bool
	// Router opens the API routes of harness sandboxes (harness.go); nil:
	// creating a harness is Unsupported.
	Router Router
	// FnCall runs the jobs of Run (nil: Run is Unsupported). The Manager
	// closes it.
	FnCall *fncall.Service
	// CheckpointDir holds the checkpoints of hibernated sandboxes; ""
	// means <state>/checkpoints, this node's own. Set, it may be on a
	// filesystem several nodes share: a sandbox hibernated on one is
	// restored on another (Restore; restore.go), and every node leaves
	// the checkpoints of the others alone.
	CheckpointDir string
	// NodeName names this node in a shared checkpoint directory (and in
	// the image store's leases); default the hostname.
	NodeName string
	Logger   *slog.Logger
}

func (c *Config) setDefaults() {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = DefaultTimeout
	}
	if c.MaxTimeout <= 0 {
		c.MaxTimeout = MaxTimeout
	}
	if c.DefaultTimeout > c.MaxTimeout {
		c.DefaultTimeout = c.MaxTimeout
	}
	if c.DefaultMemoryBytes <= 0 {
		c.DefaultMemoryBytes = DefaultMemoryBytes
	}
	if c.DefaultPids <= 0 {
		c.DefaultPids = DefaultPids
	}
	if c.DefaultExecTimeout <= 0 {
		c.DefaultExecTimeout = DefaultExecTimeout
	}
	if c.GuardInterval <= 0 {
		c.GuardInterval = DefaultGuardInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.NodeName == "" {
		c.NodeName, _ = os.Hostname()
	}
}

// ops are the operation names of warren_errors_total.
var ops = []string{
	"Create", "Get", "List", "Delete", "ExtendTimeout", "UpdateSandbox",
	"Exec", "ExecStream", "StartProcess", "ListProcesses", "WaitProcess", "SignalProcess", "WriteStdin", "AttachProcess", "ResizeProcess",
	"WriteFile", "ReadFile", "ListFiles", "StatFile", "MakeDir", "RemoveFile", "TarOut", "TarIn", "WatchDir", "SandboxStats",
	"ListImages", "GetImage", "ImportImage", "ImportImageTar", "RemoveImage", "Version",
	"ImportOCI", "PullImage", "BuildLayer", "BuildLayerTar", "ListLayers", "RemoveLayer", "ImageStats", "VerifyImage",
	"CommitSandbox", "ListSandboxEvents", "Pause", "Resume", "PauseByLabel", "ResumeByLabel", "ReadTrajectory", "Run", "RunBatch",
	"Hibernate", "HibernateByLabel", "Fork", "Restore", "Screenshot", "SendInput",
}

// Manager owns the sandboxes of this node. It is safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger
	// idleReclaiming holds a token while an idle sandbox's memory is
	// reclaimed: one at a time on the node (workload.go).
	idleReclaiming chan struct{}
	// ports are the connections DialPort made into sandboxes, by
	// sandbox: hibernation and delete close them (port.go).
	ports   connset.Set
	store   *store.Store
	metrics *metrics.Metrics
	images  *image.Store
	idem    *idemCache
	traj    *trajLogs
	events  *events.Log
	disk    diskGuard    // the guard goroutine's
	diskLow atomic.Bool  // the node's disk is below its reserve
	watchN  atomic.Int64 // open WatchDir calls of the node (watch.go)

	// imgMu orders image resolution in Create (read) against RemoveImage
	// and RemoveLayer (write), so an image or layer cannot vanish between
	// the in-use check and a create that is resolving it.
	imgMu sync.RWMutex

	// fnImages caches Run's image resolutions by name (run.go); fnGen
	// counts fnForget calls, so that a resolution that raced one is not
	// kept.
	fnMu     sync.Mutex
	fnImages map[string]fncall.Image
	fnPools  map[string]string // image name -> the key of its pool
	fnGen    atomic.Uint64

	mu        sync.RWMutex
	sandboxes map[string]*sandbox
	holds     map[string]claimHold // claim.go
	closed    bool

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup // watchers, housekeeping, process collectors
}

// sandbox is the daemon's view of one sandbox. Fields below mu are guarded
// by it; nothing holds mu across a backend call except the short store
// writes that keep the record in step with the state.
type sandbox struct {
	id          string
	backendName string
	b           backend.Backend

	ready chan struct{} // closed when Create finished, either way

	// Fixed at create (harness.go): the harness that created it, and
	// whether it is a harness itself.
	parent  string
	harness bool

	mu           sync.Mutex
	st           state             // the lifecycle state (lifecycle.go); info.State mirrors it
	info         *warrenv1.Sandbox // State mirrors st
	sb           backend.Sandbox   // nil while creating, or when never adopted
	backendState []byte
	imageLayers  []string           // digests, bottom first
	bases        []string           // forked checkpoints' layers above them, top first (fork.go)
	etcNS        netip.Addr         // the nameserver of the resolv.conf Warren last wrote (etc.go)
	fs           backend.FileSystem // nil: the backend serves no file calls (fsFor)
	timer        *time.Timer
	unwatch      func() bool   // unregisters watch's callback
	release      func()        // releases the image layers; nil once released
	deleting     chan struct{} // while DELETING: closed when the deletion ended
	deleteErr    error
	updating     bool // an UpdateSandbox is in progress
	// admitted: a HIBERNATED sandbox being restored, counted as
	// resident by admission from its admission on (qos.go).
	admitted bool
	// reach serializes the Adopt calls that reach a sandbox without a
	// handle (readopt of a LOST one, and its deletion), so that one
	// handle, not two, comes back.
	reach   sync.Mutex
	procs   map[string]*process
	procSeq int
	// exited are the exited processes of procs in the order their exits
	// were seen, at most MaxExitedProcesses (retire).
	exited []*process
	// keepExited: the agent cannot forget (it predates protocol version
	// 3), so the daemon keeps every record, as the agent does.
	keepExited bool
	// ptyExecs are the running ExecStreams on a pty, by id (ptyexec.go).
	ptyExecs map[string]backend.Resizer
	ptySeq   int
	// procsAdopted, when not nil, is closed once the processes of this
	// adopted sandbox are rebuilt; process calls wait for it. Set before
	// the sandbox is published, never changed.
	procsAdopted chan struct{}
	procsClaimed atomic.Bool // whoever sets it adopts the processes
	procPending  int
	commit       *commitOp // the commit in progress, if any
	// pausing is closed when the Pause or Resume in progress ends; nil
	// when none runs (pause.go). A delete waits for it: a freeze still
	// being requested would hold the init's SIGKILL on v1.
	pausing chan struct{}
	// procsOnResume: adopted while PAUSED, its background processes are
	// adopted when it is resumed (its agent is frozen until then).
	procsOnResume bool
	seen          containSeen // the containment counters last read (events.go)
	// touched: a call reached the sandbox since the guard last looked
	// (live), so its next look is a full one whatever its backoff.
	touched atomic.Bool
	// exitsUnchecked: a background process exited since the guard last
	// looked at the processes' output (events.go).
	exitsUnchecked atomic.Bool
	// watches are the open WatchDir calls, ended when the sandbox leaves
	// RUNNING (watch.go).
	watches map[*dirWatch]struct{}
}

// New opens the store under cfg.StateDir and re-adopts the sandboxes an
// earlier daemon left: live ones run on, those that died meanwhile are
// kept as STOPPED, half-created and half-deleted ones are removed, and each
// backend then sweeps resources that belong to no known sandbox.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	cfg.setDefaults()
	if len(cfg.Backends) == 0 {
		return nil, errdefs.Invalidf("daemon: no backend configured")
	}
	for name, b := range cfg.Backends {
		if b == nil || b.Name() != name {
			return nil, errdefs.Invalidf("daemon: backend %q is misconfigured", name)
		}
	}
	if cfg.Images == nil {
		return nil, errdefs.Invalidf("daemon: no image store configured")
	}
	st, err := store.Open(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	if sv := st.Salvaged; sv != nil {
		// The node rebooted: the records' sandboxes are gone, and adoption
		// marks them dead. An unreadable rest is logged, not fatal.
		cfg.Logger.Warn("sandbox records from an earlier boot", "copied", sv.Records, "old_file", sv.Kept, "unreadable", sv.Err)
	}
	cfg.Metrics.InitOps(ops...)
	cfg.Metrics.NodeMemoryCgroupsFunc(cgroups.MemoryCgroups)
	for name, b := range cfg.Backends {
		if bl, ok := b.(backend.Backlogged); ok {
			cfg.Metrics.BacklogFunc(name, bl.Backlog)
			cfg.Metrics.DeleteFailuresFunc(name, bl.DeleteFailures)
		}
	}
	evs, err := openEvents(cfg)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	traj, err := newTrajLogs(cfg)
	if err != nil {
		_ = st.Close()
		_ = evs.Close()
		return nil, err
	}
	cfg.Metrics.TrajectoryBytesFunc(traj.bytes)
	if fn := cfg.FnCall; fn != nil {
		cfg.Metrics.RegisterFnCall(func() []metrics.FnPool {
			ps := fn.Pools()
			out := make([]metrics.FnPool, len(ps))
			for i, p := range ps {
				out[i] = metrics.FnPool{Image: p.Image, Idle: p.Idle, InUse: p.InUse, Making: p.Making}
			}
			return out
		}, func() metrics.FnCounts {
			st := fn.Stats()
			return metrics.FnCounts{Created: st.Created, Destroyed: st.Destroyed, Failed: st.Failed}
		})
	}
	m := &Manager{
		events:    evs,
		cfg:       cfg,
		log:       cfg.Logger,
		store:     st,
		metrics:   cfg.Metrics,
		images:    cfg.Images,
		idem:      newIdemCache(idemTTL, idemMaxBytes),
		traj:      traj,
		sandboxes: map[string]*sandbox{},
		holds:     map[string]claimHold{},
		closing:   make(chan struct{}),

		idleReclaiming: make(chan struct{}, 1),
	}
	if err := m.adoptAll(ctx); err != nil {
		_ = st.Close()
		_ = evs.Close()
		return nil, err
	}
	cfg.Metrics.MemoryFunc(m.memoryUse)
	m.spawn(m.housekeeping)
	m.spawn(m.guard)
	for _, src := range cfg.EventSources {
		m.spawn(func() { m.runSource(src) })
	}
	return m, nil
}

// Close stops timers, watchers and background processes, and closes the
// store. Sandboxes keep running: a new Manager adopts them.
func (m *Manager) Close() error {
	var err error
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		all := slices.Collect(maps.Values(m.sandboxes))
		m.mu.Unlock()
		close(m.closing)
		for _, s := range all {
			s.mu.Lock()
			if s.timer != nil {
				s.timer.Stop()
			}
			procs := slices.Collect(maps.Values(s.procs))
			s.mu.Unlock()
			// Background processes run on in the agents; the next
			// daemon adopts them.
			for _, p := range procs {
				p.detach()
			}
		}
		m.wg.Wait()
		if m.cfg.FnCall != nil {
			// Its environments are the daemon's alone: none outlives it.
			err = m.cfg.FnCall.Close()
		}
		err = errors.Join(err, m.store.Close(), m.events.Close(), m.traj.closeAll())
		// Backends release node-wide resources of their own (sandboxes
		// run on without them).
		for name, b := range m.cfg.Backends {
			if c, ok := b.(io.Closer); ok {
				if cerr := c.Close(); cerr != nil {
					err = errors.Join(err, fmt.Errorf("backend %s: %w", name, cerr))
				}
			}
		}
	})
	return err
}

// spawn runs f in a goroutine that Close waits for; after Close it does
// not run f.
func (m *Manager) spawn(f func()) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

func (m *Manager) housekeeping() {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
			m.idem.prune()
			// Forget the layers of sandboxes gone since adoption, so that
			// the store can collect them (and other nodes sharing it).
			m.images.SetKeep(m.inUseDigests()...)
			// Children whose harness's deletion failed to delete them.
			m.removeOrphans()
		}
	}
}

// observe counts a failed op in the metrics and makes sure the error has
// a category: errors without one become Internal, except context errors,
// which keep their meaning for the API layer.
func (m *Manager) observe(op string, errp *error) {
	err := *errp
	if err == nil {
		return
	}
	if errdefs.CategoryOf(err) == errdefs.Unknown &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		err = errdefs.Wrap(errdefs.Internal, err, op)
		*errp = err
	}
	m.metrics.Error(op, err)
}

// withCategory gives err category c when it has none.
func withCategory(err error, c errdefs.Category, msg string) error {
	if err == nil {
		return nil
	}
	if errdefs.CategoryOf(err) != errdefs.Unknown {
		return err
	}
	return errdefs.Wrap(c, err, msg)
}

// ctxError turns a context's end into an error: DeadlineExceeded keeps its
// category; cancellation stays recognisable with errors.Is.
func ctxError(ctx context.Context, what string) error {
	err := context.Cause(ctx)
	if err == nil {
		err = ctx.Err()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errdefs.New(errdefs.DeadlineExceeded, "%s: %w", what, err)
	}
	return errdefs.New(errdefs.Unknown, "%s: %w", what, err)
}

// persist writes the sandbox's record; s.mu held.
func (m *Manager) persist(s *sandbox) error { return m.store.Put(m.recordOf(s)) }

// recordOf is s's record as the store keeps it; s.mu held.
func (m *Manager) recordOf(s *sandbox) store.Record {
	info := s.info
	if s.st == stateLost {
		// LOST is what this daemon sees, not what the sandbox is: the
		// next daemon tries to adopt it again (paused, if it was).
		info = cloneSandbox(info)
		info.State = stateRunning
		if info.GetPausedAtUnixMs() != 0 {
			info.State = statePaused
		}
	}
	return store.Record{
		ID:            s.id,
		Backend:       s.backendName,
		BackendState:  s.backendState,
		ImageLayers:   s.imageLayers,
		Sandbox:       info,
		EtcNameserver: formatNameserver(s.etcNS),
		Bases:         s.bases,
	}
}

// releaseLayers drops the sandbox's hold on its image layers, once.
func (s *sandbox) releaseLayers() {
	s.mu.Lock()
	rel := s.release
	s.release = nil
	s.mu.Unlock()
	if rel != nil {
		rel()
	}
}

// lookup finds a sandbox in any state.
func (m *Manager) lookup(id string) (*sandbox, error) {
	m.mu.RLock()
	s := m.sandboxes[id]
	m.mu.RUnlock()
	if s == nil {
		return nil, errdefs.NotFoundf("sandbox %s not found", id)
	}
	return s, nil
}

// view is what operations on a running sandbox need of it, read under its
// lock.
type view struct {
	sb      backend.Sandbox
	fs      backend.FileSystem // nil: no file calls (fsFor)
	env     map[string]string
	workdir string
	user    string // default user of execs
	backend string
}

// live finds a sandbox whose state permits o (a RUNNING one, for every
// op that uses live) and returns it with a view of it.
func (m *Manager) live(ctx context.Context, o op, id string) (*sandbox, view, error) {
	if id == "" {
		return nil, view{}, errdefs.Invalidf("sandbox id is required")
	}
	s, err := m.find(ctx, id)
	if err != nil {
		return nil, view{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allowLocked(o); err != nil {
		return nil, view{}, err
	}
	s.touched.Store(true)
	return s, view{sb: s.sb, fs: s.fs, env: s.info.GetEnv(), workdir: s.info.GetWorkdir(), user: s.info.GetUser(), backend: s.backendName}, nil
}

// explain turns a backend failure during an operation o into a Conflict
// when the sandbox left the state o needs meanwhile (died, deleted), which
// is the likely cause.
func (m *Manager) explain(o op, s *sandbox, err error, what string) error {
	s.mu.Lock()
	why := s.allowLocked(o)
	s.mu.Unlock()
	if why != nil {
		return why
	}
	return withCategory(err, errdefs.Internal, what)
}

func (m *Manager) isClosed() bool {
	select {
	case <-m.closing:
		return true
	default:
		return false
	}
}

func cloneSandbox(s *warrenv1.Sandbox) *warrenv1.Sandbox {
	return proto.Clone(s).(*warrenv1.Sandbox)
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

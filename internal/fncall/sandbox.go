package fncall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// Backend is fncall as a sandbox backend (CreateRequest.backend
// "fncall"): Create takes a ready environment from a pool of the spec's
// shape (its layers, user namespace, rlimits, setuid and disk quota),
// gives it the spec's limits, network, hostname and /etc files, and hands
// it over as the sandbox; the pool makes another in the background. A
// sandbox is then a container sandbox in all but its making: the same
// exec, files, background processes, pause, update and hardening. Its
// environment never goes back to a pool (root inside may have changed
// anything a job's reset does not know of): Destroy destroys it.
//
// What it cannot do is Unsupported: checkpoints (hibernate, fork) and
// restores, extra devices or mounts, a harness's socket.
//
// Each sandbox has a record, <dir>/<id> (on the run directory's tmpfs:
// a sandbox does not outlive the boot): its environment's id and state,
// so that Sweep finds the environments of sandboxes no daemon knows
// (container sandboxes named fn-*, which the container backend's own
// sweep keeps while the daemon adopted them: backend.Nested).
type Backend struct {
	s     *Service
	dir   string
	inner backend.Backend
	hold  HoldLayers
}

// HoldLayers keeps a spec's layers (their mounts, their blobs) until
// release: a pool's environments outlive the sandbox whose create made
// the pool, and refills after it was deleted need the layers still.
type HoldLayers func(ctx context.Context, layers []backend.Layer) (release func(), err error)

// sandboxKeyPrefix starts the pool keys of the sandbox backend's pools.
const sandboxKeyPrefix = "sandbox:"

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Nested  = (*Backend)(nil)
)

// NewBackend returns the service's environments as a sandbox backend,
// keeping its records in dir; hold (nil: none, for layers that are plain
// directories) keeps each pool's layers for its life.
func (s *Service) NewBackend(dir string, hold HoldLayers) (*Backend, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "fncall records")
	}
	return &Backend{s: s, dir: dir, inner: s.opts.Backend, hold: hold}, nil
}

// Name is "fncall".
func (b *Backend) Name() string { return Name }

// record is what State returns and the record file holds.
type record struct {
	Env   string          `json:"env"`   // the environment's id in the inner backend
	State json.RawMessage `json:"state"` // its State
}

// Inner names a sandbox's environment (backend.Nested).
func (b *Backend) Inner(state []byte) (string, string, bool) {
	var r record
	if json.Unmarshal(state, &r) != nil || r.Env == "" {
		return "", "", false
	}
	return b.inner.Name(), r.Env, true
}

// shape is the pool key of a spec: what an environment is made with.
func shape(spec backend.Spec) string {
	h := sha256.New()
	for _, l := range spec.Layers {
		fmt.Fprintf(h, "layer %s %s %s\n", l.Digest, l.Blob, l.Dir)
	}
	fmt.Fprintf(h, "userns %v setuid %v\n", spec.UserNS, spec.AllowSetuid)
	for _, f := range spec.Etc {
		fmt.Fprintf(h, "etc %s\n", f.Name)
	}
	for _, l := range spec.Rlimits {
		fmt.Fprintf(h, "rlimit %s %d %d\n", l.Name, l.Soft, l.Hard)
	}
	return sandboxKeyPrefix + hex.EncodeToString(h.Sum(nil)[:16])
}

// Create takes an environment of spec's shape and makes it the sandbox.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (_ backend.Sandbox, retErr error) {
	if !backend.ValidID(spec.ID) {
		return nil, errdefs.Invalidf("bad sandbox id %q", spec.ID)
	}
	if len(spec.Layers) == 0 {
		return nil, errdefs.Invalidf("sandbox %s: no image layers", spec.ID)
	}
	switch {
	case spec.Restore != "":
		return nil, errdefs.Unsupportedf("the %s backend cannot restore a checkpoint", Name)
	case len(spec.Devices)+len(spec.Mounts) > 0:
		return nil, errdefs.Unsupportedf("the %s backend gives sandboxes no extra devices or mounts", Name)
	}
	var disk int64
	if spec.DiskBytes > 0 {
		var err error
		if disk, err = diskQuota(spec.DiskBytes); err != nil {
			return nil, err
		}
	}
	rec := filepath.Join(b.dir, spec.ID)
	f, err := os.OpenFile(rec, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, errdefs.AlreadyExistsf("sandbox %s already exists on this node", spec.ID)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "fncall record")
	}
	f.Close()
	var cu cleanup.Cleanup
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, cu.Clean())
		}
	}()
	cu.Add(func() error { return os.Remove(rec) })
	img := Image{Key: shape(spec), Layers: spec.Layers, UserNS: spec.UserNS, Rlimits: spec.Rlimits, AllowSetuid: spec.AllowSetuid, Etc: placeholders(spec.Etc)}
	if b.hold != nil && !b.s.Pooled(img.Key) {
		if img.Release, err = b.hold(ctx, spec.Layers); err != nil {
			return nil, err
		}
	}
	p, err := b.s.pool(img, disk, false)
	if err != nil {
		return nil, err
	}
	e, err := p.take(ctx)
	if err != nil {
		return nil, err
	}
	cu.Add(func() error { return e.sb.Destroy(context.Background()) })
	sb := &sandbox{b: b, id: spec.ID, inner: e.sb}
	if err := sb.become(ctx, spec); err != nil {
		return nil, err
	}
	if err := sb.save(); err != nil {
		return nil, err
	}
	cu.Release()
	return sb, nil
}

// placeholders are /etc files of the names of etc, empty: an environment
// has them from its making (an image without /etc, or with one that is
// not a directory, keeps its own, as the container backend does).
func placeholders(etc []etcfiles.File) []etcfiles.File {
	out := make([]etcfiles.File, len(etc))
	for i, f := range etc {
		out[i] = etcfiles.File{Name: f.Name}
	}
	return out
}

// become gives an environment the spec's limits, network, hostname and
// /etc files.
func (s *sandbox) become(ctx context.Context, spec backend.Spec) error {
	up, ok := s.inner.(backend.Updater)
	if !ok {
		return errdefs.Unsupportedf("fncall: the environments' backend cannot change limits")
	}
	// Only what differs from how the pool made it (pool.make): each
	// field costs cgroup writes, and a CPU quota a change of views.
	var u backend.Update
	if spec.CPUMillis != 0 {
		u.CPUMillis = &spec.CPUMillis
	}
	if o := s.b.s.opts; spec.MemoryBytes != o.MemoryBytes {
		u.MemoryBytes = &spec.MemoryBytes
	}
	if o := s.b.s.opts; spec.PidsMax != o.PidsMax {
		u.PidsMax = &spec.PidsMax
	}
	if !spec.Network.IsNone() {
		u.Network = &spec.Network
	}
	if spec.QoS.Latency() {
		// The pool makes best-effort environments (the default class).
		u.QoS = &spec.QoS
	}
	if u != (backend.Update{}) {
		if err := up.Update(ctx, u); err != nil {
			return err
		}
	}
	host := spec.Hostname
	if host == "" {
		host = spec.ID
	}
	hs, ok := s.inner.(backend.HostnameSetter)
	if !ok {
		return errdefs.Unsupportedf("fncall: the environments' backend cannot set a hostname")
	}
	if err := hs.SetHostname(host); err != nil {
		return err
	}
	etc := spec.Etc
	if len(etc) == 0 {
		return nil
	}
	if r, ok := s.inner.(backend.Resolved); ok && r.Nameserver().IsValid() {
		etc = etcfiles.WithNameserver(etc, r.Nameserver())
	}
	return writeEtc(s.inner.Root(), etc)
}

// writeEtc overwrites the environment's /etc files, which it was made
// with (placeholders): each opened inside its root (symlinks resolved
// there), without following a final symlink, so only the files the
// container backend made are written, with their owner. Where the image's
// /etc is not a directory there are none, and it keeps its own.
func writeEtc(root string, etc []etcfiles.File) error {
	rootfd, err := inroot.OpenRoot(root)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "sandbox root")
	}
	defer unix.Close(rootfd)
	for _, f := range etc {
		fd, err := inroot.Open(rootfd, "/etc/"+f.Name, unix.O_WRONLY|unix.O_TRUNC|unix.O_NOFOLLOW, 0)
		if inroot.Errno(err) == unix.ENOENT || inroot.Errno(err) == unix.ENOTDIR {
			continue
		}
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "sandbox /etc")
		}
		_, err = unix.Write(fd, f.Data)
		unix.Close(fd)
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "write sandbox /etc/"+f.Name)
		}
	}
	return nil
}

// save writes the sandbox's record (its environment's state changes with
// its network): a temp file renamed over it, not synced, since a machine
// crash takes the environment with it.
func (s *sandbox) save() error {
	p := filepath.Join(s.b.dir, s.id)
	tmp := filepath.Join(s.b.dir, ".tmp-"+s.id)
	if err := os.WriteFile(tmp, s.State(), 0o600); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "fncall record")
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return errdefs.Wrap(errdefs.Internal, err, "fncall record")
	}
	return nil
}

// Adopt takes back a sandbox of an earlier daemon: its environment, from
// the inner backend.
func (b *Backend) Adopt(ctx context.Context, id string, state []byte) (backend.Sandbox, error) {
	var r record
	if err := json.Unmarshal(state, &r); err != nil || r.Env == "" {
		return nil, errdefs.Invalidf("fncall sandbox %s: bad state", id)
	}
	inner, err := b.inner.Adopt(ctx, r.Env, r.State)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			_ = os.Remove(filepath.Join(b.dir, id))
		}
		return nil, err
	}
	sb := &sandbox{b: b, id: id, inner: inner}
	if err := sb.save(); err != nil {
		return nil, err
	}
	return sb, nil
}

// Sweep destroys the environments of recorded sandboxes not in keep.
func (b *Backend) Sweep(ctx context.Context, keep map[string]bool) error {
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "fncall records")
	}
	var errs []error
	for _, e := range ents {
		if keep[e.Name()] || !backend.ValidID(e.Name()) {
			continue
		}
		p := filepath.Join(b.dir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r record
		if json.Unmarshal(data, &r) == nil && r.Env != "" {
			sb, err := b.inner.Adopt(ctx, r.Env, r.State)
			switch {
			case err == nil:
				if err := sb.Destroy(ctx); err != nil {
					errs = append(errs, err)
					continue
				}
			case !errors.Is(err, errdefs.ErrNotFound):
				errs = append(errs, err)
				continue
			}
		}
		// An empty record: a create that crashed before it had an
		// environment (the inner backend's sweep removes one it took).
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sandbox is an environment that became a sandbox.
type sandbox struct {
	b     *Backend
	id    string
	inner backend.Sandbox
}

func (s *sandbox) ID() string { return s.id }

func (s *sandbox) State() []byte {
	b, _ := json.Marshal(record{Env: s.inner.ID(), State: s.inner.State()})
	return b
}

func (s *sandbox) Root() string                  { return s.inner.Root() }
func (s *sandbox) Exited() context.Context       { return s.inner.Exited() }
func (s *sandbox) Stats() (backend.Stats, error) { return s.inner.Stats() }
func (s *sandbox) Start(ctx context.Context, p backend.ProcSpec) (backend.Process, error) {
	return s.inner.Start(ctx, p)
}

// Destroy destroys the environment (it never returns to a pool) and the
// record.
func (s *sandbox) Destroy(ctx context.Context) error {
	if err := s.inner.Destroy(ctx); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.b.dir, s.id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errdefs.Wrap(errdefs.Internal, err, "fncall record")
	}
	return nil
}

// The inner sandbox's capabilities, passed on. The environments are
// container sandboxes, which have them all; another backend's lack of
// one is Unsupported.
var (
	_ backend.OOMCounter     = (*sandbox)(nil)
	_ backend.OOMTracker     = (*sandbox)(nil)
	_ backend.Containment    = (*sandbox)(nil)
	_ backend.MemoryReporter = (*sandbox)(nil)
	_ backend.IDMapped       = (*sandbox)(nil)
	_ backend.Background     = (*sandbox)(nil)
	_ backend.Updater        = (*sandbox)(nil)
	_ backend.Pauser         = (*sandbox)(nil)
	_ backend.Networked      = (*sandbox)(nil)
	_ backend.Resolved       = (*sandbox)(nil)
	_ backend.DiskUser       = (*sandbox)(nil)
	_ backend.Committer      = (*sandbox)(nil)
	_ backend.PortDialer     = (*sandbox)(nil)
)

func lacks(what string) error {
	return errdefs.Unsupportedf("the %s backend's environments have no %s", Name, what)
}

func (s *sandbox) OOMKills() (uint64, error) {
	if c, ok := s.inner.(backend.OOMCounter); ok {
		return c.OOMKills()
	}
	st, err := s.inner.Stats()
	return st.OOMKills, err
}

func (s *sandbox) TrackOOM(p backend.Process) func() bool {
	if t, ok := s.inner.(backend.OOMTracker); ok {
		return t.TrackOOM(p)
	}
	return nil
}

func (s *sandbox) Contained() (backend.Contained, error) {
	if c, ok := s.inner.(backend.Containment); ok {
		return c.Contained()
	}
	return backend.Contained{}, lacks("containment counters")
}

func (s *sandbox) MemoryUse() (backend.MemoryUse, error) {
	if m, ok := s.inner.(backend.MemoryReporter); ok {
		return m.MemoryUse()
	}
	return backend.MemoryUse{}, lacks("memory report")
}

func (s *sandbox) IDMap() (uint32, uint32, bool) {
	if m, ok := s.inner.(backend.IDMapped); ok {
		return m.IDMap()
	}
	return 0, 0, false
}

func (s *sandbox) background() (backend.Background, error) {
	if bg, ok := s.inner.(backend.Background); ok {
		return bg, nil
	}
	return nil, lacks("background processes")
}

func (s *sandbox) StartBackground(ctx context.Context, p backend.ProcSpec, o backend.BackgroundOpts) (int, error) {
	bg, err := s.background()
	if err != nil {
		return 0, err
	}
	return bg.StartBackground(ctx, p, o)
}

func (s *sandbox) ListBackground(ctx context.Context) ([]backend.BackgroundInfo, error) {
	bg, err := s.background()
	if err != nil {
		return nil, err
	}
	return bg.ListBackground(ctx)
}

func (s *sandbox) AttachBackground(ctx context.Context, pid int, stdoutOff, stderrOff int64) (backend.Attachment, error) {
	bg, err := s.background()
	if err != nil {
		return nil, err
	}
	return bg.AttachBackground(ctx, pid, stdoutOff, stderrOff)
}

func (s *sandbox) OpenStdin(ctx context.Context, pid int) (backend.StdinWriter, error) {
	bg, err := s.background()
	if err != nil {
		return nil, err
	}
	return bg.OpenStdin(ctx, pid)
}

func (s *sandbox) CloseStdin(ctx context.Context, pid int) error {
	bg, err := s.background()
	if err != nil {
		return err
	}
	return bg.CloseStdin(ctx, pid)
}

func (s *sandbox) SignalBackground(ctx context.Context, pid int, sig syscall.Signal, group bool) error {
	bg, err := s.background()
	if err != nil {
		return err
	}
	return bg.SignalBackground(ctx, pid, sig, group)
}

func (s *sandbox) ResizeBackground(ctx context.Context, pid int, rows, cols uint16) error {
	bg, err := s.background()
	if err != nil {
		return err
	}
	return bg.ResizeBackground(ctx, pid, rows, cols)
}

// Update changes the environment's limits or network, and the record
// with its state.
func (s *sandbox) Update(ctx context.Context, u backend.Update) error {
	up, ok := s.inner.(backend.Updater)
	if !ok {
		return lacks("updates")
	}
	if err := up.Update(ctx, u); err != nil {
		return err
	}
	if u.Network != nil {
		return s.save()
	}
	return nil
}

func (s *sandbox) Pause(ctx context.Context, reclaim bool) (backend.PauseStats, error) {
	if p, ok := s.inner.(backend.Pauser); ok {
		return p.Pause(ctx, reclaim)
	}
	return backend.PauseStats{}, lacks("pause")
}

func (s *sandbox) Resume(ctx context.Context, o backend.ResumeOptions) error {
	if p, ok := s.inner.(backend.Pauser); ok {
		return p.Resume(ctx, o)
	}
	return lacks("pause")
}

func (s *sandbox) NetworkAddress() string {
	if n, ok := s.inner.(backend.Networked); ok {
		return n.NetworkAddress()
	}
	return ""
}

func (s *sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if d, ok := s.inner.(backend.PortDialer); ok {
		return d.DialPort(ctx, port)
	}
	return nil, lacks("port connections")
}

func (s *sandbox) Nameserver() netip.Addr {
	if r, ok := s.inner.(backend.Resolved); ok {
		return r.Nameserver()
	}
	return netip.Addr{}
}

func (s *sandbox) DiskUsage(ctx context.Context) (backend.LayerUsage, error) {
	if d, ok := s.inner.(backend.DiskUser); ok {
		return d.DiskUsage(ctx)
	}
	return backend.LayerUsage{}, lacks("disk usage")
}

func (s *sandbox) UpperDir() string {
	if c, ok := s.inner.(backend.Committer); ok {
		return c.UpperDir()
	}
	return ""
}

func (s *sandbox) Freeze(ctx context.Context) (func() error, error) {
	if c, ok := s.inner.(backend.Committer); ok {
		return c.Freeze(ctx)
	}
	return nil, lacks("commit")
}

func (s *sandbox) ForgetBackground(ctx context.Context, pid int) error {
	if f, ok := s.inner.(backend.Forgetter); ok {
		return f.ForgetBackground(ctx, pid)
	}
	return lacks("forgetting background processes")
}

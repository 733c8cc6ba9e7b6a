package daemon

import (
	"context"
	"errors"
	"io"
	"os"
	"path"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

// Bounds of WatchDir. Each call holds one inotify instance of the
// daemon's uid, whose instances the kernel caps per user for the whole
// node (fs.inotify.max_user_instances, 128 by default, shared with every
// other root process of the node), and each watched directory one inotify
// watch (about 1 KiB of unswappable kernel memory, charged to the
// daemon).
const (
	MaxWatchesPerSandbox = 16
	MaxWatchesPerNode    = 64
	MaxWatchDirs         = 8192 // directories one recursive watch follows
)

// dirWatch is one open WatchDir call.
type dirWatch struct{ end context.CancelCauseFunc }

// endWatchesLocked ends the sandbox's watches as it leaves RUNNING for
// st: the files of a paused, hibernated, stopped or deleted sandbox are
// not watched (a hibernation or a delete takes its mounts away); s.mu
// held.
func (s *sandbox) endWatchesLocked(st state) {
	for w := range s.watches {
		w.end(errdefs.Unavailablef("sandbox %s is %s: its directory watches ended (watch again once it runs)", s.id, stateName(st)))
	}
	clear(s.watches)
}

// startWatch registers a watch of a running sandbox within the bounds;
// the context it returns ends when the sandbox leaves RUNNING, and the
// func unregisters the watch.
func (m *Manager) startWatch(ctx context.Context, s *sandbox) (context.Context, func(), error) {
	if n := m.watchN.Add(1); n > MaxWatchesPerNode {
		m.watchN.Add(-1)
		return nil, nil, errdefs.Exhaustedf("the node has %d directory watches open, the most it serves: close one first", MaxWatchesPerNode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allowLocked(opFiles); err != nil {
		m.watchN.Add(-1)
		return nil, nil, err
	}
	if len(s.watches) >= MaxWatchesPerSandbox {
		m.watchN.Add(-1)
		return nil, nil, errdefs.Exhaustedf("sandbox %s has %d directory watches open, the most one sandbox may: close one first", s.id, MaxWatchesPerSandbox)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	w := &dirWatch{end: cancel}
	if s.watches == nil {
		s.watches = map[*dirWatch]struct{}{}
	}
	s.watches[w] = struct{}{}
	return ctx, func() {
		s.mu.Lock()
		delete(s.watches, w)
		s.mu.Unlock()
		cancel(nil)
		m.watchN.Add(-1)
	}, nil
}

var fileEventTypes = map[sandboxfs.EventOp]warrenv1.FileEventType{
	sandboxfs.EventCreate: warrenv1.FileEventType_FILE_EVENT_TYPE_CREATE,
	sandboxfs.EventWrite:  warrenv1.FileEventType_FILE_EVENT_TYPE_WRITE,
	sandboxfs.EventRemove: warrenv1.FileEventType_FILE_EVENT_TYPE_REMOVE,
	sandboxfs.EventRename: warrenv1.FileEventType_FILE_EVENT_TYPE_RENAME,
	sandboxfs.EventChmod:  warrenv1.FileEventType_FILE_EVENT_TYPE_CHMOD,
}

// WatchDir streams the changes of a directory of a running sandbox: a
// started event once the watch is set, then the events as the kernel
// reports them. It ends without error when the directory is removed, and
// with Unavailable when the sandbox leaves RUNNING.
func (m *Manager) WatchDir(ctx context.Context, req *warrenv1.WatchDirRequest, send func(*warrenv1.WatchDirEvent) error) (err error) {
	defer m.observe("WatchDir", &err)
	s, v, err := m.live(ctx, opFiles, req.GetSandboxId())
	if err != nil {
		return err
	}
	if v.fs == nil {
		return errdefs.Unsupportedf("file operations not supported by backend %s", v.backend)
	}
	dw, ok := v.fs.(backend.DirWatcher)
	if !ok {
		return errdefs.Unsupportedf("watching directories is not supported by backend %s", v.backend)
	}
	ctx, stop, err := m.startWatch(ctx, s)
	if err != nil {
		return err
	}
	defer stop()
	p := path.Clean("/" + req.GetPath())
	w, err := dw.WatchDir(ctx, p, req.GetRecursive(), MaxWatchDirs)
	if err != nil {
		return withCategory(err, errdefs.Internal, "watch "+p)
	}
	defer w.Close()
	// Close wakes Next when the call or the sandbox's run ends.
	unhook := context.AfterFunc(ctx, func() { w.Close() })
	defer unhook()
	if err := send(&warrenv1.WatchDirEvent{Event: &warrenv1.WatchDirEvent_Started{Started: &warrenv1.WatchDirStarted{Path: p}}}); err != nil {
		return withCategory(err, errdefs.Unavailable, "send watch event")
	}
	for {
		evs, err := w.Next()
		for _, e := range evs {
			fe := &warrenv1.FileEvent{Path: e.Path, Type: fileEventTypes[e.Op], IsDir: e.IsDir}
			if serr := send(&warrenv1.WatchDirEvent{Event: &warrenv1.WatchDirEvent_File{File: fe}}); serr != nil {
				return withCategory(serr, errdefs.Unavailable, "send watch event")
			}
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			if cause := context.Cause(ctx); errdefs.CategoryOf(cause) == errdefs.Unavailable {
				return cause
			}
			return ctxError(ctx, "watch "+p)
		case errors.Is(err, io.EOF):
			// The directory is gone: removed (the watch's normal end), or
			// the sandbox's filesystem is being taken down, which may be
			// seen before the sandbox leaves RUNNING.
			if _, serr := v.fs.Stat(context.WithoutCancel(ctx), "/"); serr != nil {
				return errdefs.Unavailablef("sandbox %s stopped running: its directory watches ended", req.GetSandboxId())
			}
			return nil
		case errors.Is(err, os.ErrClosed):
			return errdefs.Unavailablef("watch %s closed", p)
		default:
			return withCategory(err, errdefs.Internal, "watch "+p)
		}
	}
}

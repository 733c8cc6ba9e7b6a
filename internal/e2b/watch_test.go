package e2b

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	filesystempb "github.com/warrenrl/warren/gen/e2b/filesystem"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// watchManager's WatchDir starts, sends what is put on events, and runs
// until cancelled (the daemon's real watches run in test/e2e, through the
// SDKs); ended counts the watches that ended.
type watchManager struct {
	Manager
	events chan *warrenv1.FileEvent
	ended  chan struct{}
}

func (m *watchManager) WatchDir(ctx context.Context, _ *warrenv1.WatchDirRequest, send func(*warrenv1.WatchDirEvent) error) error {
	defer func() { m.ended <- struct{}{} }()
	if err := send(&warrenv1.WatchDirEvent{Event: &warrenv1.WatchDirEvent_Started{Started: &warrenv1.WatchDirStarted{}}}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-m.events:
			if err := send(&warrenv1.WatchDirEvent{Event: &warrenv1.WatchDirEvent_File{File: e}}); err != nil {
				return err
			}
		}
	}
}

// TestWatchersBounded: a watcher is its sandbox's only (another's id is
// not found); its unfetched events are bounded (more ends it, and the
// fetch after the buffered ones says so, then it is gone); one left
// unfetched past watcherIdle is dropped, its watch ended, when the next is
// created; RemoveWatcher ends the watch before it answers.
func TestWatchersBounded(t *testing.T) {
	m := &watchManager{events: make(chan *warrenv1.FileEvent), ended: make(chan struct{}, 8)}
	s, err := New(Config{Keys: []string{"e2b_0123456789abcdef"}, Manager: m})
	if err != nil {
		t.Fatal(err)
	}
	f := filesystemService{s}
	ctx := context.WithValue(context.Background(), ctxKey{}, "sb1")
	other := context.WithValue(context.Background(), ctxKey{}, "sb2")
	create := func() string {
		t.Helper()
		res, err := f.CreateWatcher(ctx, connect.NewRequest(&filesystempb.CreateWatcherRequest{Path: "/tmp"}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetWatcherId()
	}
	fetch := func(c context.Context, id string) (int, connect.Code) {
		res, err := f.GetWatcherEvents(c, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			return 0, connect.CodeOf(err)
		}
		return len(res.Msg.GetEvents()), 0
	}

	a := create()
	if _, code := fetch(other, a); code != connect.CodeNotFound {
		t.Fatalf("another sandbox's fetch: %v, want not_found", code)
	}
	for range maxWatcherEvents + 1 {
		m.events <- &warrenv1.FileEvent{Path: "f", Type: warrenv1.FileEventType_FILE_EVENT_TYPE_WRITE}
	}
	<-m.ended
	if n, code := fetch(ctx, a); code != 0 || n != maxWatcherEvents {
		t.Fatalf("first fetch after too many events: %d events, %v", n, code)
	}
	if _, code := fetch(ctx, a); code != connect.CodeResourceExhausted {
		t.Fatalf("fetch of a watcher that overflowed: %v, want resource_exhausted", code)
	}
	if _, code := fetch(ctx, a); code != connect.CodeNotFound {
		t.Fatalf("fetch of an ended watcher once told: %v, want not_found", code)
	}

	b := create()
	s.watchers.mu.Lock()
	s.watchers.by[b].touched = time.Now().Add(-2 * watcherIdle)
	s.watchers.mu.Unlock()
	c := create()
	select {
	case <-m.ended:
	case <-time.After(time.Minute):
		t.Fatal("an idle watcher's watch did not end")
	}
	if _, code := fetch(ctx, b); code != connect.CodeNotFound {
		t.Fatalf("fetch of a dropped idle watcher: %v, want not_found", code)
	}
	if _, err := f.RemoveWatcher(ctx, connect.NewRequest(&filesystempb.RemoveWatcherRequest{WatcherId: c})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.ended:
	default:
		t.Fatal("RemoveWatcher answered before the watch ended")
	}
}

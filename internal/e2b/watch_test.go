package e2b

import (
	"context"
	"slices"
	"strconv"
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
// not found); consecutive events of one kind on one file are merged; its unfetched events are bounded (more ends it, and the
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
	// A run of one file's writes is one event.
	for range 3 {
		m.events <- &warrenv1.FileEvent{Path: "f", Type: warrenv1.FileEventType_FILE_EVENT_TYPE_WRITE}
	}
	m.events <- &warrenv1.FileEvent{Path: "g", Type: warrenv1.FileEventType_FILE_EVENT_TYPE_WRITE}
	m.events <- &warrenv1.FileEvent{Path: "end", Type: warrenv1.FileEventType_FILE_EVENT_TYPE_CREATE}
	var names []string
	for deadline := time.Now().Add(time.Minute); !slices.Contains(names, "end"); {
		if time.Now().After(deadline) {
			t.Fatalf("events %v: no end within a minute", names)
		}
		res, err := f.GetWatcherEvents(ctx, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: a}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Msg.GetEvents() {
			names = append(names, e.GetName())
		}
	}
	if !slices.Equal(names, []string{"f", "g", "end"}) {
		t.Fatalf("events %v, want [f g end]", names)
	}
	for i := range maxWatcherEvents + 1 {
		m.events <- &warrenv1.FileEvent{Path: strconv.Itoa(i), Type: warrenv1.FileEventType_FILE_EVENT_TYPE_CREATE}
	}
	<-m.ended
	total, code := 0, connect.Code(0)
	for deadline := time.Now().Add(time.Minute); code == 0 && time.Now().Before(deadline); {
		var n int
		n, code = fetch(ctx, a)
		total += n
	}
	if total != maxWatcherEvents || code != connect.CodeResourceExhausted {
		t.Fatalf("a watcher that overflowed: %d events then %v, want %d then resource_exhausted", total, code, maxWatcherEvents)
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

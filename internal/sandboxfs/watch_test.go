package sandboxfs

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/errdefs"
)

// collect reads events of w in the background until it ends.
func collect(w DirWatch) (<-chan Event, <-chan error) {
	ch, done := make(chan Event, 1024), make(chan error, 1)
	go func() {
		for {
			evs, err := w.Next()
			for _, e := range evs {
				ch <- e
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	return ch, done
}

// waitEvent waits (at most a minute: CI is loaded) for the event want.
func waitEvent(t *testing.T, ch <-chan Event, want Event) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case e := <-ch:
			if e == want {
				return
			}
		case <-deadline:
			t.Fatalf("no event %+v within a minute", want)
		}
	}
}

// TestWatchDirReportsChangesRecursively: a watch reports creates, writes,
// chmods, renames and removes by path relative to the watched directory,
// follows directories made later (the entries made inside them before the
// watch was added included), stops following one moved away, ends with
// io.EOF when the directory is removed, and closes its descriptor.
func TestWatchDirReportsChangesRecursively(t *testing.T) {
	fs, root, _ := setup(t)
	dir := filepath.Join(root, "home/user")
	fds := openFDs(t)
	w, err := fs.WatchDir(ctx, "/home/user", true, 100)
	if err != nil {
		t.Fatal(err)
	}
	ch, done := collect(w)
	write(t, filepath.Join(dir, "a.txt"), "x")
	waitEvent(t, ch, Event{Path: "a.txt", Op: EventCreate})
	waitEvent(t, ch, Event{Path: "a.txt", Op: EventWrite})
	if err := os.Chmod(filepath.Join(dir, "a.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ch, Event{Path: "a.txt", Op: EventChmod})
	if err := os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ch, Event{Path: "a.txt", Op: EventRename})
	waitEvent(t, ch, Event{Path: "b.txt", Op: EventCreate})
	// A tree made at once: its deeper entries may exist before their
	// directories are watched, and are reported all the same.
	if err := os.MkdirAll(filepath.Join(dir, "d/e/f"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "d/e/f/deep.txt"), "y")
	waitEvent(t, ch, Event{Path: "d", Op: EventCreate, IsDir: true})
	waitEvent(t, ch, Event{Path: "d/e/f/deep.txt", Op: EventCreate})
	write(t, filepath.Join(dir, "d/e/f/deep.txt"), "z")
	waitEvent(t, ch, Event{Path: "d/e/f/deep.txt", Op: EventWrite})
	if err := os.Rename(filepath.Join(dir, "d"), filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ch, Event{Path: "d", Op: EventRename, IsDir: true})
	write(t, filepath.Join(dir, "moved/e/f/later.txt"), "z")
	waitEvent(t, ch, Event{Path: "moved/e/f/later.txt", Op: EventCreate})
	if err := os.Remove(filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ch, Event{Path: "b.txt", Op: EventRemove})
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("watch ended with %v, want io.EOF", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the watch did not end when its directory was removed")
	}
	w.Close()
	if got := openFDs(t); got != fds {
		t.Errorf("open descriptors: %d before, %d after", fds, got)
	}
}

// TestWatchDirStaysInRoot: the watched path resolves inside the root (a
// symlink to a host directory means the sandbox's path of that name),
// and a watch follows no symlink into another tree.
func TestWatchDirStaysInRoot(t *testing.T) {
	fs, root, victim := setup(t)
	if _, err := fs.WatchDir(ctx, "/hostdir", false, 10); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("watch of a symlink to a host directory: %v, want NotFound", err)
	}
	if _, err := fs.WatchDir(ctx, "/home/user/up/../../../..", false, 10); err != nil {
		t.Fatalf("watch of .. past the root (the root itself): %v", err)
	}
	w, err := fs.WatchDir(ctx, "/", true, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ch, _ := collect(w)
	// Written outside the root: never seen; then a marker inside.
	write(t, victim+".2", "host")
	write(t, filepath.Join(root, "etc/marker"), "m")
	deadline := time.After(time.Minute)
	for {
		select {
		case e := <-ch:
			if e.Path == "etc/marker" {
				return
			}
			if filepath.Base(e.Path) == "victim.2" {
				t.Fatalf("event from outside the root: %+v", e)
			}
		case <-deadline:
			t.Fatal("no event for etc/marker")
		}
	}
}

// TestWatchDirBounded: a recursive watch of more directories than its
// limit is refused (Exhausted), at start and when they appear later.
func TestWatchDirBounded(t *testing.T) {
	fs, root, _ := setup(t)
	for _, d := range []string{"t/1", "t/2", "t/3"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fs.WatchDir(ctx, "/t", true, 3); errdefs.CategoryOf(err) != errdefs.Exhausted {
		t.Fatalf("watch of 4 directories with a limit of 3: %v, want Exhausted", err)
	}
	w, err := fs.WatchDir(ctx, "/t", true, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, done := collect(w)
	if err := os.Mkdir(filepath.Join(root, "t/4"), 0o755); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if errdefs.CategoryOf(err) != errdefs.Exhausted {
			t.Fatalf("a fifth directory: %v, want Exhausted", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a fifth directory did not end the watch")
	}
}

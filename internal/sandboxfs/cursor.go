package sandboxfs

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Reopening a merged overlayfs directory for each page makes the kernel
// rebuild its merged listing (every entry of every layer) each time: a
// 300,000-entry merged directory took 1.2 s a page, 6 minutes in all.
// So the daemon keeps the directory of an unfinished listing open for
// its next page, a bounded number of them for a short while; a token
// whose directory is no longer open reopens it and seeks, the same
// result only slower.
const (
	maxCursors = 32
	cursorIdle = 30 * time.Second
)

type cursor struct {
	fd    int
	timer *time.Timer
}

// cursors are the open directories of unfinished listings, by the token
// of their next page. A token names a directory by device and inode, so
// a cursor only ever serves the directory it was opened on.
var cursors = struct {
	sync.Mutex
	m     map[string]*cursor
	order []string // oldest first
}{m: map[string]*cursor{}}

// takeCursor returns the open directory positioned at token's page, if
// one is kept; the caller owns it from then on.
func takeCursor(tok string) (int, bool) {
	cursors.Lock()
	defer cursors.Unlock()
	c, ok := cursors.m[tok]
	if !ok {
		return -1, false
	}
	c.timer.Stop()
	dropCursorLocked(tok)
	return c.fd, true
}

// keepCursor keeps fd, positioned at token's page, for the next page;
// the oldest one is closed beyond maxCursors, and each is closed after
// cursorIdle unused. Closes happen outside the lock: the last close of
// a deleted sandbox's overlay syncs its upper filesystem.
func keepCursor(tok string, fd int) {
	var evicted []int
	defer func() {
		for _, fd := range evicted {
			unix.Close(fd)
		}
	}()
	cursors.Lock()
	defer cursors.Unlock()
	if old, ok := cursors.m[tok]; ok {
		// Two listings at the same place of the same directory.
		old.timer.Stop()
		evicted = append(evicted, old.fd)
		dropCursorLocked(tok)
	}
	for len(cursors.order) >= maxCursors {
		oldest := cursors.order[0]
		c := cursors.m[oldest]
		c.timer.Stop()
		evicted = append(evicted, c.fd)
		dropCursorLocked(oldest)
	}
	c := &cursor{fd: fd}
	c.timer = time.AfterFunc(cursorIdle, func() {
		cursors.Lock()
		mine := cursors.m[tok] == c
		if mine {
			dropCursorLocked(tok)
		}
		cursors.Unlock()
		if mine {
			unix.Close(c.fd)
		}
	})
	cursors.m[tok] = c
	cursors.order = append(cursors.order, tok)
}

func dropCursorLocked(tok string) {
	delete(cursors.m, tok)
	for i, t := range cursors.order {
		if t == tok {
			cursors.order = append(cursors.order[:i], cursors.order[i+1:]...)
			break
		}
	}
}

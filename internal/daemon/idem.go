package daemon

import (
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// Idempotency cache defaults.
const (
	idemTTL      = 10 * time.Minute
	idemMaxBytes = 256 << 20 // cached output across all entries
)

// idemEntry is one idempotent exec: in flight until done is closed, then
// its outcome is kept for the TTL.
type idemEntry struct {
	sandbox, key string
	done         chan struct{}
	res          *warrenv1.ExecResult // set before done is closed
	err          error
	expires      time.Time
	size         int64
}

// outcome is the cached result (a copy) or error; call it after done.
func (e *idemEntry) outcome() (*warrenv1.ExecResult, error) {
	if e.res != nil {
		return proto.Clone(e.res).(*warrenv1.ExecResult), nil
	}
	return nil, e.err
}

// idemCache remembers exec outcomes per (sandbox, idempotency key), so a
// retried request returns the first result instead of running again. A
// concurrent retry waits for the first run. Entries expire ttl after the
// run finished; when the cached output exceeds maxBytes the oldest entries
// go first.
type idemCache struct {
	ttl      time.Duration
	maxBytes int64
	now      func() time.Time

	mu    sync.Mutex
	m     map[string]map[string]*idemEntry // sandbox -> key -> entry
	order []*idemEntry                     // finished entries, oldest first
	bytes int64
}

func newIdemCache(ttl time.Duration, maxBytes int64) *idemCache {
	return &idemCache{ttl: ttl, maxBytes: maxBytes, now: time.Now, m: map[string]map[string]*idemEntry{}}
}

// begin returns the entry of (sandbox, key) and whether the caller is the
// first: the first caller must run the command and call finish or abandon;
// others wait on entry.done.
func (c *idemCache) begin(sandbox, key string) (*idemEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pruneLocked()
	keys := c.m[sandbox]
	if e, ok := keys[key]; ok {
		return e, false
	}
	if keys == nil {
		keys = map[string]*idemEntry{}
		c.m[sandbox] = keys
	}
	e := &idemEntry{sandbox: sandbox, key: key, done: make(chan struct{})}
	keys[key] = e
	return e, true
}

// known reports whether (sandbox, key) has an entry, running or finished.
func (c *idemCache) known(sandbox, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.m[sandbox][key]
	return ok
}

// finish stores the outcome of a run that happened (the command started).
func (c *idemCache) finish(e *idemEntry, res *warrenv1.ExecResult, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.res, e.err = res, err
	if res != nil {
		e.res = proto.Clone(res).(*warrenv1.ExecResult)
		e.size = int64(len(res.GetStdout()) + len(res.GetStderr()))
	}
	e.expires = c.now().Add(c.ttl)
	close(e.done)
	if c.m[e.sandbox][e.key] != e {
		return // the sandbox was dropped meanwhile
	}
	c.order = append(c.order, e)
	c.bytes += e.size
	c.pruneLocked()
}

// abandon forgets a run that never started (bad request, dead sandbox):
// waiters get err, and a later request with the key runs afresh.
func (c *idemCache) abandon(e *idemEntry, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.err = err
	close(e.done)
	if c.m[e.sandbox][e.key] == e {
		c.removeLocked(e)
	}
}

// dropSandbox forgets every entry of a deleted sandbox.
func (c *idemCache) dropSandbox(sandbox string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.m[sandbox] {
		if e.expires.IsZero() {
			continue // in flight: finish will not find it
		}
		c.bytes -= e.size
	}
	delete(c.m, sandbox)
	kept := c.order[:0]
	for _, e := range c.order {
		if e.sandbox != sandbox {
			kept = append(kept, e)
		}
	}
	clear(c.order[len(kept):])
	c.order = kept
}

// prune drops expired entries.
func (c *idemCache) prune() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pruneLocked()
}

func (c *idemCache) pruneLocked() {
	now := c.now()
	n := 0
	for n < len(c.order) {
		e := c.order[n]
		if !now.After(e.expires) && c.bytes <= c.maxBytes {
			break
		}
		c.removeLocked(e)
		c.bytes -= e.size
		n++
	}
	if n > 0 {
		clear(c.order[:n])
		c.order = c.order[n:]
	}
}

// removeLocked deletes e from the map (not from order).
func (c *idemCache) removeLocked(e *idemEntry) {
	keys := c.m[e.sandbox]
	if keys[e.key] != e {
		return
	}
	delete(keys, e.key)
	if len(keys) == 0 {
		delete(c.m, e.sandbox)
	}
}

// len is the number of entries, in flight or finished.
func (c *idemCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, keys := range c.m {
		n += len(keys)
	}
	return n
}

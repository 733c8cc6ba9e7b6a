// Package connset keeps open connections by a key (a sandbox id) so that
// they can be closed together: the connections into a sandbox that a
// checkpoint cannot take, or that its deletion or pause ends.
package connset

import (
	"net"
	"sync"
)

// Set is the open connections by key. The zero Set is ready.
type Set struct {
	mu sync.Mutex
	by map[string]map[*conn]struct{}
}

type conn struct {
	net.Conn
	s    *Set
	key  string
	once sync.Once
}

// Track returns c, registered under key until it is closed (by its user
// or by CloseAll).
func (s *Set) Track(key string, c net.Conn) net.Conn {
	tc := &conn{Conn: c, s: s, key: key}
	s.mu.Lock()
	if s.by == nil {
		s.by = map[string]map[*conn]struct{}{}
	}
	if s.by[key] == nil {
		s.by[key] = map[*conn]struct{}{}
	}
	s.by[key][tc] = struct{}{}
	s.mu.Unlock()
	return tc
}

// CloseAll closes every connection registered under key.
func (s *Set) CloseAll(key string) {
	s.mu.Lock()
	var open []*conn
	for c := range s.by[key] {
		open = append(open, c)
	}
	s.mu.Unlock()
	for _, c := range open {
		_ = c.Close()
	}
}

// Len is the number of open connections under key.
func (s *Set) Len(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.by[key])
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.by[c.key], c)
		if len(c.s.by[c.key]) == 0 {
			delete(c.s.by, c.key)
		}
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// CloseWrite half-closes the connection where it can (TCP), so that a
// proxy passes a client's end of input on; elsewhere it closes it.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

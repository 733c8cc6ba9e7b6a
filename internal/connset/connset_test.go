package connset

import (
	"net"
	"testing"
)

// TestCloseAll: CloseAll closes the key's connections and no other's;
// a connection its user closed is forgotten.
func TestCloseAll(t *testing.T) {
	var s Set
	a1, a1p := net.Pipe()
	a2, a2p := net.Pipe()
	b, bp := net.Pipe()
	defer a1p.Close()
	defer a2p.Close()
	defer bp.Close()
	ta1, ta2, tb := s.Track("a", a1), s.Track("a", a2), s.Track("b", b)
	ta2.Close()
	if s.Len("a") != 1 || s.Len("b") != 1 {
		t.Fatalf("open: a %d b %d, want 1 1", s.Len("a"), s.Len("b"))
	}
	s.CloseAll("a")
	if _, err := ta1.Write([]byte("x")); err == nil {
		t.Error("a connection of a is open after CloseAll(a)")
	}
	go func() { buf := make([]byte, 1); _, _ = bp.Read(buf) }()
	if _, err := tb.Write([]byte("x")); err != nil {
		t.Errorf("b's connection after CloseAll(a): %v", err)
	}
	if s.Len("a") != 0 {
		t.Errorf("a has %d after CloseAll", s.Len("a"))
	}
}

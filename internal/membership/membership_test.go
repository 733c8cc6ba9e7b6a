package membership

import (
	"fmt"
	"net"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// A member that joins late is found, with its metadata, by the pool it
// joins; one that leaves is gone from it.
func TestJoinSeeLeave(t *testing.T) {
	a, err := Join(Options{Name: "a", Meta: Meta{Role: RoleGateway}, Bind: freeAddr(t), Key: []byte("k1")})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Join(Options{Name: "b", Meta: Meta{Role: RoleNode, API: "http://x:1", Tag: "abcde"}, Bind: freeAddr(t), Peers: []string{a.Addr()}, Key: []byte("k1")})
	if err != nil {
		t.Fatal(err)
	}
	// One without the key is kept out.
	x, err := Join(Options{Name: "x", Meta: Meta{Role: RoleNode, API: "http://evil:1"}, Bind: freeAddr(t), Peers: []string{a.Addr()}, Key: []byte("k2")})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	waitFor(t, func() bool {
		for _, m := range a.Members() {
			if m.Name == "b" && m.Meta.Tag == "abcde" && m.Meta.API == "http://x:1" {
				return true
			}
		}
		return false
	}, "a sees b with its metadata")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(a.Members()) == 1 }, "b gone from a's members")
	for _, m := range a.Members() {
		if m.Name == "x" {
			t.Fatal("a member with another gossip key joined")
		}
	}
}

func waitFor(t *testing.T, f func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatal(fmt.Sprintf("not within 10s: %s", what))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

package container

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
)

// TestPooledNetNSIsTheSandboxsAlone: sandboxes without a network, whose
// inits join namespaces of the pool, each get a namespace of their own,
// never the host's or another sandbox's, holding only lo, up (loopback
// TCP works), for every process of theirs; and the namespace is the
// pool's (the clone made none).
func TestPooledNetNSIsTheSandboxsAlone(t *testing.T) {
	opts := testOptions(t, "netns-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{host: "the host"}
	for _, id := range []string{"nsa", "nsb", "nsc"} {
		pool := fullPool(t, b.netns)
		sb, _ := runningSandbox(t, b, id)
		ns, err := os.Readlink("/proc/" + strconv.Itoa(initPid(t, sb)) + "/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := seen[ns]; ok {
			t.Fatalf("sandbox %s is in the network namespace of %s (%s)", id, other, ns)
		}
		seen[ns] = id
		if !pool[ns] {
			t.Errorf("sandbox %s: namespace %s is not one the pool held (%v)", id, ns, pool)
		}
		r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"/bin/sh", "-c", `
readlink /proc/self/ns/net
ip -o link | cut -d: -f2
nc -l -p 7777 -e echo hi &
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  if out=$(nc 127.0.0.1 7777 </dev/null 2>/dev/null) && [ -n "$out" ]; then echo "tcp $out"; break; fi
  sleep 0.1
done
`}}, "")
		lines := strings.Fields(r.Stdout)
		if r.Status.Code != 0 || len(lines) != 4 || lines[0] != ns || lines[1] != "lo" || lines[2] != "tcp" || lines[3] != "hi" {
			t.Errorf("sandbox %s: want its namespace %s, only lo, and loopback TCP: %+v", id, ns, r)
		}
	}
}

// fullPool waits until the pool's filler has filled it and returns the
// namespaces it holds: the next take is one of them.
func fullPool(t *testing.T, p *nsPool) map[string]bool {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		p.mu.Lock()
		if len(p.ready) == p.size {
			out := map[string]bool{}
			for _, f := range p.ready {
				ns, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
				if err != nil {
					p.mu.Unlock()
					t.Fatal(err)
				}
				out[ns] = true
			}
			p.mu.Unlock()
			return out
		}
		n := len(p.ready)
		p.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d namespaces after 10 s, want %d", n, p.size)
		}
	}
}

// TestNSPool: the pool's namespaces are distinct and not the host's; a
// take after close finds none.
func TestNSPool(t *testing.T) {
	testOptions(t, "nspool-") // root
	p := newNSPool(2)
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{host: true}
	for i := 0; i < 4; i++ {
		var f *os.File
		for deadline := time.Now().Add(10 * time.Second); f == nil; time.Sleep(time.Millisecond) {
			if f = p.take(); f == nil && time.Now().After(deadline) {
				t.Fatal("the pool made no namespace in 10 s")
			}
		}
		ns, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
		if err != nil {
			t.Fatal(err)
		}
		if seen[ns] {
			t.Fatalf("namespace %s handed out twice, or the host's", ns)
		}
		seen[ns] = true
		f.Close()
	}
	p.close()
	if f := p.take(); f != nil {
		t.Fatal("take after close returned a namespace")
	}
}

package e2e

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// cutProxy stands between a client and the gateways: it sends the first
// connection to first and loses the answer of its first call (it resets
// the client's connection when the gateway starts answering, so the
// create was made and the client does not know); every later connection
// waits for gate, then goes to next().
type cutProxy struct {
	t      *testing.T
	ln     net.Listener
	first  string
	next   func() string
	gate   chan struct{}
	cut    chan struct{} // closed once the first answer was lost
	conns  atomic.Int32
	closed sync.WaitGroup
}

func newCutProxy(t *testing.T, first string, next func() string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{t: t, ln: ln, first: first, next: next, gate: make(chan struct{}), cut: make(chan struct{})}
	p.closed.Add(1)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.closed.Wait() })
	return p
}

func (p *cutProxy) addr() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) serve() {
	defer p.closed.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		i := p.conns.Add(1)
		p.closed.Add(1)
		go func() {
			defer p.closed.Done()
			defer c.Close()
			target := p.first
			if i > 1 {
				<-p.gate
				target = p.next()
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer up.Close()
			go func() {
				_, _ = io.Copy(up, c)
				// The client is done: end the other direction too.
				up.Close()
			}()
			if i > 1 {
				_, _ = io.Copy(c, up)
				return
			}
			// The first answer: read its first bytes and drop them with
			// the connection (a reset, as a gateway killed would).
			buf := make([]byte, 1)
			if _, err := up.Read(buf); err == nil {
				_ = c.(*net.TCPConn).SetLinger(0)
				close(p.cut)
			}
		}()
	}
}

// TestClusterCreateRetriedAfterLostAnswerMakesOneSandbox checks that a
// create through a gateway whose answer is lost (the connection reset
// after the sandbox was made) and that the Go client sends again makes
// one sandbox, not two, when the retry goes through the other gateway or
// through the same gateway restarted meanwhile: the client sends an
// idempotency key and marks the retry, the gateway finds the first
// attempt's node by the id the key gives there, and the node answers
// with the sandbox it made. The creates ask for anti-affinity with their
// own label, so a retry placed anew would go to another node.
func TestClusterCreateRetriedAfterLostAnswerMakesOneSandbox(t *testing.T) {
	cl := newCluster(t)
	ctx := ctxFor(t, 5*time.Minute)
	gw := cl.gws[0].c

	for _, tc := range []struct {
		name    string
		between func()  // after the first answer is lost
		next    *gwProc // where the retry goes
	}{
		{name: "other-gateway", next: cl.gws[1]},
		{name: "gateway-restarted", next: cl.gws[0], between: func() {
			cl.gws[0].stop(syscall.SIGKILL)
			cl.gws[0].start()
			cl.waitNodes(30*time.Second, "node0", "node1", "node2")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCutProxy(t, cl.gws[0].api, func() string { return tc.next.api })
			c, err := client.New(p.addr(), client.WithToken(cl.token), client.WithHTTP1())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			label := map[string]string{"job": "idem-" + tc.name}
			type result struct {
				sb  *warrenv1.Sandbox
				err error
			}
			done := make(chan result, 1)
			go func() {
				sb, err := c.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Labels: label, AntiAffinity: []string{"job"}})
				done <- result{sb, err}
			}()
			select {
			case <-p.cut:
			case r := <-done:
				t.Fatalf("create answered without the proxy losing an answer: %v %v", r.sb, r.err)
			}
			if tc.between != nil {
				tc.between()
			}
			// The retry's gateway knows where the first attempt's sandbox
			// is (its report counts the label), so a placement anew would
			// avoid that node.
			waitFor(t, 30*time.Second, "gateway "+tc.next.name+" to see the first attempt's sandbox", func() bool {
				up, err := tc.next.nodesUp(ctx)
				if err != nil {
					return false
				}
				for _, n := range up {
					if n.GetLabelCounts()["job="+label["job"]] == 1 {
						return true
					}
				}
				return false
			})
			close(p.gate)
			r := <-done
			if r.err != nil {
				t.Fatalf("create retried after its answer was lost: %v\n%s", r.err, cl.gwLogs())
			}
			if p.conns.Load() < 2 {
				t.Fatalf("the client did not retry (%d connections)", p.conns.Load())
			}
			all, err := gw.List(ctx, label)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != 1 || all[0].GetId() != r.sb.GetId() || r.sb.GetIdempotencyKey() == "" {
				var where []string
				for _, sb := range all {
					where = append(where, sb.GetId()+"@"+sb.GetNode())
				}
				t.Fatalf("one create retried made %d sandboxes %v; it answered %s@%s", len(all), where, r.sb.GetId(), r.sb.GetNode())
			}
			if err := gw.Delete(ctx, r.sb.GetId()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

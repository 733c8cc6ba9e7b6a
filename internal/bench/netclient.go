package bench

import (
	"github.com/miekg/dns"

	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// The network benchmark's client: this binary, copied into the sandbox
// (or run in the peer's namespace) as `warren bench netclient`, so that
// both sides measure with the same code and no process spawn per
// connection (busybox nc's was most of what a connect cost, and its small
// buffers capped throughput below what the path carries).

// NetClientResult is what the client prints, one JSON object.
type NetClientResult struct {
	Connect Summary `json:"connect"`
	MiBPerS float64 `json:"mib_per_s"`
	Resolve Summary `json:"resolve,omitzero"`
}

// RunNetClient connects n times to connectAddr (each connection closed at
// once; the server closes its end too) and times each dial, then sends
// mib MiB to sendAddr and times it until the server, having read it all,
// closes. It writes the result to w.
func RunNetClient(w io.Writer, connectAddr string, n int, sendAddr string, mib int) error {
	var res NetClientResult
	if connectAddr == "" {
		return json.NewEncoder(w).Encode(res)
	}
	var ds []time.Duration
	for range n {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp4", connectAddr, 5*time.Second)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		ds = append(ds, time.Since(t0))
		c.Close()
	}
	res.Connect = Summarize(ds)
	if mib > 0 {
		c, err := net.DialTimeout("tcp4", sendAddr, 5*time.Second)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		defer c.Close()
		buf := make([]byte, 1<<20)
		t0 := time.Now()
		for range mib {
			if _, err := c.Write(buf); err != nil {
				return fmt.Errorf("send: %w", err)
			}
		}
		// The server closes once it has read everything.
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := io.Copy(io.Discard, c); err != nil {
			return fmt.Errorf("wait for the server: %w", err)
		}
		res.MiBPerS = float64(mib) / time.Since(t0).Seconds()
	}
	return json.NewEncoder(w).Encode(res)
}

// RunDNSClient asks server (ip:port) for name's A records n times in a
// row over UDP and writes the latencies' summary (NetClientResult's
// Resolve) as JSON. Every answer must succeed with an address.
func RunDNSClient(w io.Writer, server, name string, n int) error {
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	var ds []time.Duration
	for range n {
		t0 := time.Now()
		r, _, err := c.Exchange(q, server)
		if err != nil {
			return fmt.Errorf("resolve %s at %s: %w", name, server, err)
		}
		ds = append(ds, time.Since(t0))
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			return fmt.Errorf("resolve %s at %s: %s, %d answers", name, server, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
	}
	return json.NewEncoder(w).Encode(NetClientResult{Resolve: Summarize(ds)})
}

// staticSelf returns this executable's path if it is statically linked
// (it then runs in a busybox sandbox), else "".
func staticSelf() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	f, err := elf.Open(exe)
	if err != nil {
		return ""
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return ""
		}
	}
	return exe
}

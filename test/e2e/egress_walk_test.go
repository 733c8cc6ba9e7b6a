package e2e

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// nestScript makes n directories one inside the other at dir (which
// must not exist) with a file f at the bottom, in the sandbox's busybox
// sh. A loop of mkdir and cd -P takes minutes once the path passes
// PATH_MAX (ash's cd looks the new directory's path up), so the tree is
// built from chains of 100 levels (short paths, one mkdir -p each), each
// renamed into the bottom of the next: 20,000 levels in about 3s.
func nestScript(dir string, n int) string {
	return fmt.Sprintf(`cd / && P=d && i=1 && while [ $i -lt 99 ]; do P=$P/d; i=$((i+1)); done
mkdir -p /nest.c/$P && echo bottom > /nest.c/$P/f || exit 1
k=1; while [ $k -lt %[2]d ]; do mkdir -p /nest.x/$P && mv /nest.c /nest.x/$P/d && mv /nest.x /nest.c || exit 1; k=$((k+1)); done
mv /nest.c %[1]s`, dir, n/100)
}

func (e *env) nest(id, dir string, n int) {
	e.t.Helper()
	start := time.Now()
	res, err := e.c.Exec(ctxFor(e.t, 5*time.Minute), &warrenv1.ExecRequest{SandboxId: id, Shell: nestScript(dir, n), TimeoutMs: 4 * 60 * 1000})
	if err != nil || res.ExitCode != 0 {
		e.t.Fatalf("nesting %d directories in %s: %v %v %q", n, id, err, res.GetExitCode(), res.GetStderr())
	}
	e.t.Logf("made %d nested directories in %s in %v", n, id, time.Since(start))
}

// stallingDownloads start archive downloads of path over HTTP/1.1 (a raw
// client) and h2c (the Go SDK's transport on unix sockets), read a little
// of each and then stop reading. The returned function reads what is left
// of each and reports how each ended.
func (e *env) stallingDownloads(id, path string) func() []error {
	e.t.Helper()
	h1 := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", e.sock)
	}}}
	ctx := ctxFor(e.t, 5*time.Minute)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://warren/v1/sandboxes/"+id+"/archive?path="+path, nil)
	res, err := h1.Do(req)
	if err != nil || res.StatusCode != 200 {
		e.t.Fatalf("HTTP/1.1 download: %v %v", err, res)
	}
	sdk, err := e.c.Download(ctx, id, path)
	if err != nil {
		e.t.Fatalf("SDK download: %v", err)
	}
	bodies := []io.ReadCloser{res.Body, sdk}
	for _, b := range bodies {
		if _, err := io.ReadFull(b, make([]byte, 64<<10)); err != nil {
			e.t.Fatalf("first bytes of the archive: %v", err)
		}
	}
	return func() []error {
		var errs []error
		for _, b := range bodies {
			_, err := io.Copy(io.Discard, b)
			b.Close()
			errs = append(errs, err)
		}
		h1.CloseIdleConnections()
		return errs
	}
}

// execLatencies runs trivial execs in id one after the other, at least
// n and until stop is closed, and returns their latencies, sorted.
func (e *env) execLatencies(id string, n int, stop <-chan struct{}) []time.Duration {
	var out []time.Duration
	for i := 0; ; i++ {
		if i >= n {
			select {
			case <-stop:
				slices.Sort(out)
				return out
			default:
			}
		}
		start := time.Now()
		res, err := e.c.Exec(ctxFor(e.t, 30*time.Second), &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			e.t.Errorf("exec in the neighbour during the stalled download: %v %v", err, res)
			slices.Sort(out)
			return out
		}
		out = append(out, time.Since(start))
	}
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[(len(d)*99+99)/100-1]
}

// TestDeepTreeStalledDownloadHoldsNoDescriptors: a sandbox nests 20,000
// directories and two clients (HTTP/1.1 and the SDK's h2c) start
// downloading it and stop reading. The daemon's descriptors stay near
// their baseline (the recursive walk held one per level: 19,998 of 20,000,
// and exec and create everywhere failed), a neighbour's execs stay fast
// throughout, and both streams are cut after --stall-timeout (2s here).
func TestDeepTreeStalledDownloadHoldsNoDescriptors(t *testing.T) {
	const depth = 20000
	const stall = 2 * time.Second
	e := newEnv(t, envOptions{serveArgs: []string{"--stall-timeout", stall.String()}})
	e.create(&warrenv1.CreateRequest{Id: "deep"})
	e.create(&warrenv1.CreateRequest{Id: "nb"})
	e.nest("deep", "/top", depth)
	closed := make(chan struct{})
	close(closed)
	e.execLatencies("nb", 5, closed) // warm
	base := e.daemonFDs()

	start := time.Now()
	finish := e.stallingDownloads("deep", "/top")
	// While the clients stall: sample the daemon's descriptors, run execs
	// in the neighbour, until both streams are cut.
	var most int
	cutDone := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := e.daemonFDs(); n > most {
				most = n
			}
			select {
			case <-cutDone:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	latc := make(chan []time.Duration)
	go func() { latc <- e.execLatencies("nb", 200, cutDone) }()
	deadline := time.Now().Add(stall + 20*time.Second)
	for strings.Count(e.logTail(400), "archive download failed mid-stream") < 2 {
		if time.Now().After(deadline) {
			close(cutDone)
			<-sampled
			<-latc
			t.Fatalf("the stalled downloads were not cut %v after they began (%d daemon descriptors, %d before):\n%s",
				time.Since(start), most, base, e.logTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	cut := time.Since(start)
	close(cutDone)
	<-sampled
	lat := <-latc
	t.Logf("daemon descriptors: %d before, %d at most while stalled; both streams cut %v after they began", base, most, cut)
	t.Logf("%d neighbour execs meanwhile: p50 %v p99 %v max %v", len(lat), lat[len(lat)/2], p99(lat), lat[len(lat)-1])
	if cut < stall {
		t.Errorf("streams cut after %v, before the %v stall timeout", cut, stall)
	}
	// Not a latency target (benchmarks measure those): a daemon that the
	// stalled streams held up would keep the neighbour's execs waiting
	// for the cut, seconds; a loaded CI machine makes p99s of 75 ms.
	if p99(lat) > time.Second {
		t.Errorf("neighbour exec p99 %v during the stalled downloads: the stalls hold the daemon up", p99(lat))
	}
	if most > base+64 {
		t.Errorf("the daemon held %d descriptors during the stalled downloads, %d before", most, base)
	}
	for i, err := range finish() {
		if err == nil {
			t.Errorf("download %d ended cleanly: want it cut after the stall", i)
		}
	}
	// Still serving: a complete archive of a small tree.
	e.shOK("deep", "mkdir -p /small && echo hi > /small/f")
	r, err := e.c.Download(ctxFor(t, 30*time.Second), "deep", "/small")
	if err != nil {
		t.Fatal(err)
	}
	if n := countEntries(t, r); n != 2 {
		t.Errorf("archive of /small has %d entries, want 2", n)
	}
}

func countEntries(t *testing.T, r io.ReadCloser) int {
	t.Helper()
	defer r.Close()
	tr := tar.NewReader(r)
	n := 0
	for {
		_, err := tr.Next()
		if err == io.EOF {
			return n
		}
		if err != nil {
			t.Fatalf("reading the archive after %d entries: %v", n, err)
		}
		n++
	}
}

// TestDeepTreeDeleteEmptiesTrash: the writable layer of a deleted sandbox
// that nested 21,000 directories is removed from the trash (os.RemoveAll
// gave up on it and left 161 MB there, also across restarts, without a
// word), both by the running daemon and by the next one when the daemon
// died before it got to it.
func TestDeepTreeDeleteEmptiesTrash(t *testing.T) {
	const depth = 21000
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "deep1"})
	e.create(&warrenv1.CreateRequest{Id: "deep2"})
	e.nest("deep1", "/top", depth)
	e.nest("deep2", "/top", depth)

	start := time.Now()
	if err := e.c.Delete(ctxFor(t, 60*time.Second), "deep1"); err != nil {
		t.Fatal(err)
	}
	e.waitTrashEmpty(60 * time.Second)
	t.Logf("deleted and reaped a %d-level tree in %v", depth, time.Since(start))

	// Stop the reaper before it begins: a SIGKILL right after the delete
	// leaves the layer in the trash for the next daemon.
	if err := e.c.Delete(ctxFor(t, 60*time.Second), "deep2"); err != nil {
		t.Fatal(err)
	}
	e.kill9()
	left := e.trashEntries()
	t.Logf("in the trash after the SIGKILL: %v", left)
	start = time.Now()
	e.start()
	e.waitTrashEmpty(60 * time.Second)
	t.Logf("the next daemon emptied the trash in %v", time.Since(start))
	if strings.Contains(e.logTail(400), "cannot remove") {
		t.Errorf("the reaper reported a failure:\n%s", e.logTail(20))
	}
}

// TestManyTinyFilesArchive: 100,000 empty files in one directory archive
// whole and fast.
func TestManyTinyFilesArchive(t *testing.T) {
	const files = 100000
	e := newEnv(t, envOptions{})
	e.create(&warrenv1.CreateRequest{Id: "many"})
	start := time.Now()
	e.shOK("many", fmt.Sprintf(`mkdir /many && cd /many && i=0 && while [ $i -lt %d ]; do : > f$i; i=$((i+1)); done`, files))
	t.Logf("made %d files in %v", files, time.Since(start))
	start = time.Now()
	r, err := e.c.Download(ctxFor(t, 2*time.Minute), "many", "/many")
	if err != nil {
		t.Fatal(err)
	}
	if n := countEntries(t, r); n != files+1 {
		t.Errorf("archive has %d entries, want %d", n, files+1)
	}
	t.Logf("archived %d files in %v", files, time.Since(start))
}

package conformance

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
)

// pause: a paused sandbox's counter stops and, once resumed, counts on
// from where it stopped; Pause with reclaim gives back its page cache; a
// paused sandbox is adopted by a new backend instance (a daemon restart)
// still paused and resumed through it; Destroy of a paused sandbox
// leaves nothing behind.
func pause(t *testing.T, b backend.Backend, h Harness) {
	base := h.Resources(t)
	sb := create(t, b, h, nil)
	p, ok := sb.(backend.Pauser)
	if !ok {
		t.Skip("the backend cannot pause sandboxes (backend.Pauser)")
	}
	if sb.Root() == "" {
		t.Skip("the suite reads the counter through Root")
	}
	ctx := context.Background()
	// 32 MB of page cache of its own, written back so that it is clean.
	sh(t, sb, "head -c 32000000 /dev/zero > /cache && sync /cache && cat /cache >/dev/null")
	proc, err := sb.Start(ctx, backend.ProcSpec{Argv: []string{"/bin/sh", "-c",
		"i=0; while :; do i=$((i+1)); echo $i > /count.tmp; mv /count.tmp /count; sleep 0.01; done"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	count := func(sb backend.Sandbox) int {
		b, _ := os.ReadFile(filepath.Join(sb.Root(), "count"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	waitFor(t, func() bool { return count(sb) > 5 })

	st, err := p.Pause(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pause: %+v", st)
	if st.Before.File < 30<<20 || st.After.File > st.Before.File-28<<20 || st.After.Bytes >= st.Before.Bytes {
		t.Errorf("Pause with reclaim: memory before %+v, after %+v: want the 32 MB file's page cache given back", st.Before, st.After)
	}
	c0 := count(sb)
	time.Sleep(200 * time.Millisecond)
	if c := count(sb); c != c0 {
		t.Fatalf("the counter went from %d to %d while paused", c0, c)
	}

	// A restarted daemon finds it paused and resumes it.
	sb2, err := h.New(t).Adopt(ctx, sb.ID(), sb.State())
	if err != nil {
		t.Fatal(err)
	}
	if c := count(sb2); c != c0 {
		t.Fatalf("the counter went from %d to %d while paused, across the adopt", c0, c)
	}
	limit := int64(256 << 20)
	if err := sb2.(backend.Pauser).Resume(ctx, backend.ResumeOptions{MemoryBytes: &limit}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return count(sb2) > c0+5 })
	if c := count(sb2); c > c0+500 {
		t.Fatalf("the counter jumped from %d to %d over a resume: it restarted or ran while paused", c0, c)
	}
	if r := sh(t, sb2, "cat /count >/dev/null && echo alive"); r.Stdout != "alive\n" {
		t.Fatalf("exec after resume: %+v", r)
	}

	// Destroy while paused, without reclaim this time.
	if _, err := sb2.(backend.Pauser).Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := sb2.Destroy(dctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb2.Exited().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a paused sandbox's init did not exit on Destroy")
	}
	_ = sb.Destroy(ctx)
	// The counter's handle belongs to the first instance: once the
	// garbage collector closed its connection, the agent would kill the
	// counter (a process whose client is gone), whatever the pause does.
	runtime.KeepAlive(proc)
	checkNoLeaks(t, h, base)
}

package microvm

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
)

// TestPauseStopsTheGuest: Pause (QMP stop) halts the whole guest: a call
// into it waits, and its clock does not run while paused; Resume (QMP
// cont) runs it on where it stopped, twice in a row harmlessly; the pause
// reports the VM's memory on the node; Destroy of a paused VM leaves no
// QEMU.
func TestPauseStopsTheGuest(t *testing.T) {
	sb := testSandbox(t)
	p := sb.(backend.Pauser)
	ctx := context.Background()
	uptime := func() float64 {
		t.Helper()
		r := conformance.Exec(t, sb, backend.ProcSpec{Argv: []string{"cat", "/proc/uptime"}}, "")
		f := strings.Fields(r.Stdout)
		if len(f) == 0 {
			t.Fatalf("uptime: %+v", r)
		}
		u, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	u0 := uptime()
	t0 := time.Now()
	st, err := p.Pause(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pause: %+v", st)
	// A reclaim does not grow the guest's memory (anonymous: the file
	// part is QEMU's code, whose share moves with the node's other QEMUs;
	// slack for TCG's code cache, which grows as the guest runs the
	// reclaim).
	if st.Before.Bytes == 0 || st.Before.Anon == 0 || st.After.Bytes == 0 || st.After.Anon > st.Before.Anon+(32<<20) {
		t.Errorf("pause stats: %+v", st)
	}
	// A call into the guest waits while it is paused.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = sb.Start(cctx, backend.ProcSpec{Argv: []string{"true"}})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a start into a paused VM: %v, want it held until its deadline", err)
	}
	if err := p.Resume(ctx, backend.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(ctx, backend.ResumeOptions{}); err != nil {
		t.Fatalf("resume of a running VM: %v", err)
	}
	host := time.Since(t0).Seconds()
	if guest := uptime() - u0; guest > host-1.5 {
		t.Fatalf("the guest's clock ran %.2fs of the %.2fs around a pause of 2s", guest, host)
	}
	if _, err := p.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	pid := sb.(*sandbox).vm.Pid()
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("QEMU %d runs after Destroy of a paused VM", pid)
	}
}

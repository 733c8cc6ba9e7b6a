package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// TestForgetBoundsRecords: an agent whose client forgets each exited
// process runs any number of them (3,000, past the 2,048 records it holds
// at once, and past the 1,024 of protocol version 2) in bounded memory.
func TestForgetBoundsRecords(t *testing.T) {
	a := startAgent(t, nil)
	c := a.client
	for i := range 3000 {
		pid := bg(t, c, "echo "+strconv.Itoa(i), backend.BackgroundOpts{})
		got, _ := follow(t, c, pid, 0, 0, "")
		if string(got.stdout) != strconv.Itoa(i)+"\n" || got.exit == nil || got.exit.Code != 0 {
			t.Fatalf("process %d: %q %+v", i, got.stdout, got.exit)
		}
		if err := c.ForgetBackground(ctx(t), pid); err != nil {
			t.Fatalf("forget process %d: %v", i, err)
		}
	}
	all, err := c.ListBackground(ctx(t))
	if err != nil || len(all) != 0 {
		t.Fatalf("after forgetting all: %d records, %v", len(all), err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			// 3,000 records with their output would be over 20 MiB.
			if kb, _ := strconv.Atoi(f[1]); kb == 0 || kb >= 4096 {
				t.Errorf("agent VmRSS %d KiB after 3,000 forgotten processes, want < 4 MiB", kb)
			}
		}
	}
}

// TestForgetSemantics: FORGET refuses a running process and an unknown
// pid, and a reader attached when the record is forgotten still reads all
// of it (the agent frees it after the last reader) while new requests no
// longer find it.
func TestForgetSemantics(t *testing.T) {
	a := startAgent(t, nil)
	c := a.client
	sleeper := bg(t, c, "sleep 100", backend.BackgroundOpts{})
	if err := c.ForgetBackground(ctx(t), sleeper); errdefs.CategoryOf(err) != errdefs.Conflict {
		t.Fatalf("forget a running process: %v, want conflict", err)
	}
	if err := c.ForgetBackground(ctx(t), 999999); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("forget an unknown pid: %v, want not found", err)
	}

	// More than a socket buffer of output: the agent is still sending it
	// when the record is forgotten.
	const size = 1 << 20
	pid := bg(t, c, fmt.Sprintf("head -c %d /dev/zero; exit 3", size), backend.BackgroundOpts{OutputCap: size})
	w, _ := follow(t, c, pid, backend.FromEnd, backend.FromEnd, "")
	if w.exit == nil || w.exit.Code != 3 {
		t.Fatalf("exit %+v", w.exit)
	}
	r, err := c.AttachBackground(ctx(t), pid, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	first, err := r.Next()
	if err != nil || len(first.Data) == 0 {
		t.Fatalf("first chunk: %+v %v", first, err)
	}
	if err := c.ForgetBackground(ctx(t), pid); err != nil {
		t.Fatal(err)
	}
	if info := listedOrNil(t, c, pid); info != nil {
		t.Fatalf("forgotten process still listed: %+v", info)
	}
	if err := c.ForgetBackground(ctx(t), pid); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatal("forgot the same record twice")
	}
	n := len(first.Data)
	for {
		o, err := r.Next()
		if err != nil {
			t.Fatalf("reading a forgotten record after %d bytes: %v", n, err)
		}
		if o.Exit != nil {
			if o.Exit.Code != 3 || n != size {
				t.Fatalf("read %d bytes, exit %+v; want %d, 3", n, o.Exit, size)
			}
			break
		}
		n += len(o.Data)
	}
	x, err := c.AttachBackground(ctx(t), pid, 0, 0)
	if err == nil {
		_, err = x.Next()
		x.Close()
	}
	if errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("attach to a forgotten process: %v, want not found", err)
	}
	if listedOrNil(t, c, sleeper) == nil {
		t.Fatal("the running process went from the list")
	}
}

func listedOrNil(t *testing.T, c *Client, pid int) *backend.BackgroundInfo {
	t.Helper()
	all, err := c.ListBackground(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range all {
		if all[i].Pid == pid {
			return &all[i]
		}
	}
	return nil
}

package container

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/testutil"
)

func TestVictimPid(t *testing.T) {
	for rec, want := range map[string]int{
		"3,1234,3526364858,-;Memory cgroup out of memory: Killed process 19747 (dd) total-vm:264412kB, anon-rss:15488kB": 19747,
		"3,99,1,-;Out of memory: Killed process 7 (a b) total-vm:1kB":                                                    7,
		"6,5,1,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=dd,pid=19747,uid=0":                                           0,
		"12,5333,3559375748,-;Killed process x (y)":                                                                      0,
		"no separator Killed process 5 (x)":                                                                              0,
	} {
		if got, ok := victimPid([]byte(rec)); got != want || ok != (want != 0) {
			t.Errorf("%q: %d %v, want %d", rec, got, ok, want)
		}
	}
}

// TestHostPid: the sandbox translates the pid of a process it started
// into the host's, which the kernel log names OOM victims by.
func TestHostPid(t *testing.T) {
	opts := testOptions(t, "hostpid")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sb, err := b.Create(t.Context(), backend.Spec{ID: "hostpid", Layers: backend.DirLayers(testutil.BusyboxRoot(t))})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(t.Context())
	p, err := sb.Start(t.Context(), backend.ProcSpec{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	host, err := sb.(*sandbox).hostPid(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(host) + "/status")
	if err != nil || !strings.Contains(string(st), "\nNSpid:\t"+strconv.Itoa(host)+"\t"+strconv.Itoa(p.Pid())+"\n") {
		t.Fatalf("host pid %d of sandbox pid %d: %s %v", host, p.Pid(), st, err)
	}
	if _, err := sb.(*sandbox).hostPid(12345); err == nil {
		t.Fatal("a pid the agent never started was found")
	}
	if sb.(*sandbox).TrackOOM(p) == nil && kernelLogOK() {
		t.Fatal("TrackOOM cannot tell for a running process")
	}
}

func kernelLogOK() bool { _, err := kernelLog(); return err == nil }

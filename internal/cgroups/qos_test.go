package cgroups

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestQoSClassesReadBack: SetQoS makes a group idle (cpu.idle 1, the
// default weight), then gives it a weight and pins it to a CPU (its
// tasks, present ones included, join the cpuset), then back, as read from
// this host's files; Delete removes the cpuset directory too.
func TestQoSClassesReadBack(t *testing.T) {
	parent := testParent(t)
	if !HasIdle() {
		t.Skip("no cpu.idle on this kernel")
	}
	g, err := New(parent, "sb", Resources{MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sleeper, done := child(t, "sleep", "100")
	if err := g.AddProc(sleeper.Process.Pid); err != nil {
		t.Fatal(err)
	}
	check := func(step string, idle bool, weight uint64, cpus string) {
		t.Helper()
		i, w, c, err := ReadQoS(g)
		if err != nil {
			t.Fatalf("%s: read back: %v", step, err)
		}
		if i != idle || (!idle && w != weight) || (cpus != "" && c != cpus) {
			t.Fatalf("%s: idle %v weight %d cpus %q, want %v %d %q", step, i, w, c, idle, weight, cpus)
		}
	}
	if err := g.SetQoS(QoS{Idle: true}); err != nil {
		t.Fatal(err)
	}
	check("be", true, 0, "")
	// Idle again: the kernel refuses a weight on an idle group, which
	// must not make a repeated class fail.
	if err := g.SetQoS(QoS{Idle: true}); err != nil {
		t.Fatalf("be twice: %v", err)
	}
	last := runtime.NumCPU() - 1
	if err := g.SetQoS(QoS{Weight: 1000, CPUs: []int{last}}); err != nil {
		t.Fatal(err)
	}
	want := itoa(last)
	check("ls pinned", false, 1000, want)
	if Mode() != "v2" {
		in := cgroupsOf(t, sleeper.Process.Pid)
		if in["cpuset"] != "/"+parent+"/sb" {
			t.Errorf("a task present before the pin is in cpuset group %q", in["cpuset"])
		}
	}
	// The task may then run on that CPU only.
	if got := allowedCPUs(t, sleeper.Process.Pid); got != want {
		t.Errorf("the task's Cpus_allowed_list after the pin: %q, want %q", got, want)
	}
	if err := g.SetQoS(QoS{Idle: true}); err != nil {
		t.Fatal(err)
	}
	check("be again", true, 0, "")
	_, _, c, _ := ReadQoS(g)
	if runtime.NumCPU() > 1 && c == want {
		t.Errorf("unpinned, the cpuset is still %q", c)
	}
	if err := g.SetQoS(QoS{}); err != nil {
		t.Fatal(err)
	}
	check("default", false, DefaultWeight, "")
	_ = sleeper.Process.Kill()
	<-done
	deleteGroup(t, g, parent, "sb")
}

func itoa(n int) string { return strconv.Itoa(n) }

func allowedCPUs(t *testing.T, pid int) string {
	for l := range strings.Lines(mustRead(t, "/proc/"+itoa(pid)+"/status")) {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestQoSOldLayout: the classes on a group of the legacy v1 layout (pure
// v1 hosts, and hybrid ones before the hybrid layout): cpu.idle and
// cpu.shares in its cpu directory, and a pin's cpuset removed by Delete.
func TestQoSOldLayout(t *testing.T) {
	parent := testParent(t)
	if Mode() == "v2" {
		t.Skip("no v1 hierarchies")
	}
	if !HasIdle() {
		t.Skip("no cpu.idle on this kernel")
	}
	g := oldLayoutGroup(t, parent)
	if err := g.SetQoS(QoS{Idle: true}); err != nil {
		t.Fatal(err)
	}
	if idle, _, _, err := ReadQoS(g); err != nil || !idle {
		t.Fatalf("be: idle %v %v", idle, err)
	}
	if err := g.SetQoS(QoS{Weight: 1000, CPUs: []int{0}}); err != nil {
		t.Fatal(err)
	}
	if idle, w, cpus, err := ReadQoS(g); err != nil || idle || w != 1000 || cpus != "0" {
		t.Fatalf("ls: idle %v weight %d cpus %q %v", idle, w, cpus, err)
	}
	deleteGroup(t, g, parent, "old")
}

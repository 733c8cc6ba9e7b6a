package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/cgroups"
)

// cpuIdleOf reads a sandbox's cpu.idle from its cgroup file.
func (e *env) cpuIdleOf(id string) string {
	e.t.Helper()
	p := filepath.Join(cgroups.Root, "cpu", e.parent, id, "cpu.idle")
	if cgroups.Mode() == "v2" {
		p = filepath.Join(cgroups.Root, e.parent, id, "cpu.idle")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestQoSClassesAndAdmission: through the API of a daemon started with
// --max-sandboxes 2 and --cpu-overcommit, a be sandbox's cgroup idles
// and an ls one's does not; `warren sandbox update --qos` and the Go
// client swap them (cpu.idle follows); NodeStatus counts the classes and
// the room left; a third create is refused as exhausted naming the limit,
// and so is one asking for more CPU than the ratio leaves.
func TestQoSClassesAndAdmission(t *testing.T) {
	t.Parallel()
	if !cgroups.HasIdle() {
		t.Skip("no cpu.idle on this kernel")
	}
	// 2 sandboxes, and 0.75 cores of quota per core of the node.
	e := newEnv(t, envOptions{serveArgs: []string{"--max-sandboxes", "2", "--cpu-overcommit", "0.75"}})
	ctx := ctxFor(t, 2*time.Minute)
	v, err := e.c.Version(ctx)
	if err != nil || !v.GetCpuIdle() {
		t.Fatalf("version: cpu_idle %v, %v", v.GetCpuIdle(), err)
	}
	e.create(&warrenv1.CreateRequest{Id: "be1"})
	e.create(&warrenv1.CreateRequest{Id: "ls1", Qos: "ls", Resources: &warrenv1.Resources{CpuMillis: 500}})
	if be, ls := e.cpuIdleOf("be1"), e.cpuIdleOf("ls1"); be != "1" || ls != "0" {
		t.Fatalf("cpu.idle: be %s, ls %s", be, ls)
	}
	nodes, err := e.c.NodeStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := nodes[0]
	if st.GetQos()["be"] != 1 || st.GetQos()["ls"] != 1 || st.GetFree().GetSandboxes() != 0 || st.GetCpuOvercommit() != 0.75 {
		t.Fatalf("node status: qos %v free %v overcommit %g", st.GetQos(), st.GetFree(), st.GetCpuOvercommit())
	}
	_, err = e.c.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Id: "third"})
	if !client.IsExhausted(err) || !strings.Contains(err.Error(), "--max-sandboxes is 2") {
		t.Fatalf("third create: %v, want exhausted naming --max-sandboxes", err)
	}

	out, errOut, code := e.cli(nil, "sandbox", "update", "be1", "--qos", "ls")
	if code != 0 || !strings.Contains(out, "QoS") {
		t.Fatalf("cli update --qos ls: %d %q %q", code, out, errOut)
	}
	be := "be"
	if sb, err := e.c.Update(ctx, "ls1", client.SandboxUpdate{QoS: &be}); err != nil || sb.GetQos() != "be" {
		t.Fatalf("client update to be: %v %v", sb.GetQos(), err)
	}
	if was, now := e.cpuIdleOf("be1"), e.cpuIdleOf("ls1"); was != "0" || now != "1" {
		t.Fatalf("cpu.idle after the swap: be1 (now ls) %s, ls1 (now be) %s", was, now)
	}

	// Room for one more, but not for what it asks of the CPU.
	if err := e.c.Delete(ctx, "be1"); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Id: "greedy",
		Resources: &warrenv1.Resources{CpuMillis: int64(float64(st.GetCpuMillis())*0.75) - 400}})
	if !client.IsExhausted(err) || !strings.Contains(err.Error(), "--cpu-overcommit") {
		t.Fatalf("greedy create: %v, want exhausted naming --cpu-overcommit", err)
	}
	e.create(&warrenv1.CreateRequest{Id: "fits", Resources: &warrenv1.Resources{CpuMillis: 100}})
}

// TestQoSFncallSandbox: an fncall sandbox (an environment taken from a
// pool of best-effort ones) asked for class ls runs latency-sensitive:
// its own cgroup, as it reads it, does not idle; one of the default class
// does.
func TestQoSFncallSandbox(t *testing.T) {
	t.Parallel()
	if !cgroups.HasIdle() {
		t.Skip("no cpu.idle on this kernel")
	}
	e := newEnv(t, envOptions{})
	const read = "cat /sys/fs/cgroup/cpu/cpu.idle 2>/dev/null || cat /sys/fs/cgroup/cpu.idle"
	e.create(&warrenv1.CreateRequest{Id: "fnbe", Backend: "fncall"})
	e.create(&warrenv1.CreateRequest{Id: "fnls", Backend: "fncall", Qos: "ls"})
	if be, ls := strings.TrimSpace(e.shOK("fnbe", read)), strings.TrimSpace(e.shOK("fnls", read)); be != "1" || ls != "0" {
		t.Fatalf("cpu.idle seen inside: be %q, ls %q", be, ls)
	}
}

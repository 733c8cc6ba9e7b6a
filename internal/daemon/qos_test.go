package daemon

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/container"
	"github.com/warrenrl/warren/internal/errdefs"
)

// qosFiles reads a sandbox's class back from its cgroup files.
func (e *env) qosFiles(id string) (idle bool, weight uint64, cpus string) {
	e.t.Helper()
	g, err := cgroups.Load(e.opts.CgroupParent, id)
	if err != nil {
		e.t.Fatal(err)
	}
	idle, weight, cpus, err = cgroups.ReadQoS(g)
	if err != nil {
		e.t.Fatal(err)
	}
	return idle, weight, cpus
}

// allowedIn is the Cpus_allowed_list of a process started in sandbox id.
func (e *env) allowedIn(id string) string {
	e.t.Helper()
	res := e.sh(id, "grep Cpus_allowed_list /proc/self/status")
	_, v, _ := strings.Cut(string(res.GetStdout()), ":")
	return strings.TrimSpace(v)
}

// TestQoSClassTakesEffectAndChanges: a sandbox is best-effort by default
// (its cgroup idles: cpu.idle 1), one created "ls" pinned to a CPU has
// the latency-sensitive weight and a cpuset its new processes run in;
// UpdateSandbox swaps both classes (files read back, pinning gone with
// the class), the records and NodeStatus say so, and a restarted daemon
// keeps the classes.
func TestQoSClassTakesEffectAndChanges(t *testing.T) {
	if !cgroups.HasIdle() {
		t.Skip("no cpu.idle on this kernel")
	}
	e := newEnv(t)
	ctx := ctxT(t)
	last := int32(runtime.NumCPU() - 1)
	be := e.create(&warrenv1.CreateRequest{Id: "crowd"})
	ls := e.create(&warrenv1.CreateRequest{Id: "chess", Qos: "ls", QosCpus: []int32{last}})
	if be.GetQos() != "be" || ls.GetQos() != "ls" || len(ls.GetQosCpus()) != 1 {
		t.Fatalf("records: %q %q %v", be.GetQos(), ls.GetQos(), ls.GetQosCpus())
	}
	if idle, _, _ := e.qosFiles("crowd"); !idle {
		t.Fatal("a default (be) sandbox's cgroup does not idle")
	}
	want := strconv.Itoa(int(last))
	if idle, w, cpus := e.qosFiles("chess"); idle || w != container.LSWeight || cpus != want {
		t.Fatalf("ls sandbox: idle %v weight %d cpus %q, want weight %d on CPU %s", idle, w, cpus, container.LSWeight, want)
	}
	if got := e.allowedIn("chess"); got != want {
		t.Fatalf("a process of the pinned sandbox may run on CPUs %q, want %s", got, want)
	}
	st, err := e.m.NodeStatus(ctx, &warrenv1.NodeStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if q := st.GetNodes()[0].GetQos(); q["be"] != 1 || q["ls"] != 1 {
		t.Fatalf("NodeStatus qos %v", q)
	}

	// Swap the classes of the running sandboxes.
	if _, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "chess", Qos: proto.String("be")}); err != nil {
		t.Fatal(err)
	}
	sb, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "crowd", Qos: proto.String("ls")})
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetQos() != "ls" {
		t.Fatalf("updated record: %q", sb.GetQos())
	}
	if idle, _, _ := e.qosFiles("chess"); !idle {
		t.Fatal("after update to be: cgroup does not idle")
	}
	if runtime.NumCPU() > 1 {
		if got := e.allowedIn("chess"); got == want {
			t.Fatalf("after update to be: still pinned to %q", got)
		}
	}
	if idle, w, _ := e.qosFiles("crowd"); idle || w != container.LSWeight {
		t.Fatalf("after update to ls: idle %v weight %d", idle, w)
	}
	// Pinning belongs to ls; an unknown class changes nothing.
	for _, req := range []*warrenv1.UpdateSandboxRequest{
		{Id: "chess", Qos: proto.String("be"), QosCpus: []int32{0}},
		{Id: "chess", Qos: proto.String("gold")},
		{Id: "chess", QosCpus: []int32{0}},
	} {
		if _, err := e.m.UpdateSandbox(ctx, req); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Fatalf("update %v: %v, want invalid", req, err)
		}
	}
	if idle, _, _ := e.qosFiles("chess"); !idle {
		t.Fatal("a refused update changed the class")
	}

	e.stop()
	e.start()
	for id, class := range map[string]string{"chess": "be", "crowd": "ls"} {
		sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: id})
		if err != nil || sb.GetQos() != class {
			t.Fatalf("after a restart, %s: %q %v, want %q", id, sb.GetQos(), err, class)
		}
	}
	// The adopted sandbox changes class too.
	if _, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "crowd", Qos: proto.String("be")}); err != nil {
		t.Fatal(err)
	}
	if idle, _, _ := e.qosFiles("crowd"); !idle {
		t.Fatal("after a restart and an update to be: cgroup does not idle")
	}
}

// TestAdmissionRefusesPastLimits: with --max-sandboxes, --cpu-overcommit
// and --memory-overcommit set, a create past any of them is refused as
// exhausted with the limit and the numbers in the message, NodeStatus
// reports the room left, and deleting a sandbox makes room again.
func TestAdmissionRefusesPastLimits(t *testing.T) {
	cpuCap, memCap := nodeCapacity()
	e := newEnv(t, func(c *Config) {
		c.MaxSandboxes = 3
		// Room for 1.5 cores' worth of quota and 600 MiB of limits.
		c.CPUOvercommit = 1500 / float64(cpuCap)
		c.MemoryOvercommit = float64(600<<20) / float64(memCap)
	})
	ctx := ctxT(t)
	refused := func(req *warrenv1.CreateRequest, want string) {
		t.Helper()
		req.Image = "busybox"
		_, err := e.m.Create(ctx, req)
		if errdefs.CategoryOf(err) != errdefs.Exhausted || !strings.Contains(err.Error(), want) {
			t.Fatalf("create %v: %v, want exhausted naming %q", req.GetResources(), err, want)
		}
	}
	e.create(&warrenv1.CreateRequest{Id: "a", Resources: &warrenv1.Resources{CpuMillis: 1000, MemoryBytes: 256 << 20}})
	refused(&warrenv1.CreateRequest{Id: "cpu", Resources: &warrenv1.Resources{CpuMillis: 600, MemoryBytes: 64 << 20}}, "--cpu-overcommit")
	refused(&warrenv1.CreateRequest{Id: "mem", Resources: &warrenv1.Resources{CpuMillis: 100, MemoryBytes: 400 << 20}}, "--memory-overcommit")
	e.create(&warrenv1.CreateRequest{Id: "b", Resources: &warrenv1.Resources{CpuMillis: 400, MemoryBytes: 64 << 20}})
	e.create(&warrenv1.CreateRequest{Id: "c", Resources: &warrenv1.Resources{CpuMillis: 0, MemoryBytes: 64 << 20}})
	refused(&warrenv1.CreateRequest{Id: "d", Resources: &warrenv1.Resources{MemoryBytes: 64 << 20}}, "--max-sandboxes is 3")

	st, err := e.m.NodeStatus(ctx, &warrenv1.NodeStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	f := st.GetNodes()[0].GetFree()
	if f.GetCpuMillis() != int64(float64(cpuCap)*e.m.cfg.CPUOvercommit)-1400 || f.GetSandboxes() != 0 ||
		f.GetMemoryBytes() != int64(float64(memCap)*e.m.cfg.MemoryOvercommit)-(384<<20) {
		t.Fatalf("NodeStatus free %v", f)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "a"}); err != nil {
		t.Fatal(err)
	}
	e.create(&warrenv1.CreateRequest{Id: "d", Resources: &warrenv1.Resources{CpuMillis: 1000, MemoryBytes: 256 << 20}})
}

// TestAdmissionOfRestoreAndFork: a hibernated sandbox takes no room, so
// another fits in its place; its restore is then refused as exhausted
// (and it stays hibernated, restorable), as is a fork of the running one;
// once room is made the restore goes through with its class (ls) back on
// its new cgroup.
func TestAdmissionOfRestoreAndFork(t *testing.T) {
	requireCRIU(t)
	e := newEnv(t, func(c *Config) { c.MaxSandboxes = 1 })
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "hib", Qos: "ls", UserNamespace: proto.Bool(false)})
	if _, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "hib"}); err != nil {
		t.Fatal(err)
	}
	e.create(&warrenv1.CreateRequest{Id: "other", UserNamespace: proto.Bool(false)})
	_, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "hib"})
	wantCat(t, err, errdefs.Exhausted, "--max-sandboxes is 1")
	// The source, hibernated for the checkpoint, keeps its room: the
	// fork does not fit beside it.
	_, err = e.m.Fork(ctx, &warrenv1.ForkRequest{Id: "other", Count: 1})
	wantCat(t, err, errdefs.Exhausted, "--max-sandboxes is 1")
	if sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "other"}); err != nil || sb.GetState() != stateRunning {
		t.Fatalf("the source of a refused fork: %v %v, want RUNNING", sb.GetState(), err)
	}
	if sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "hib"}); err != nil || sb.GetState() != stateHibernated {
		t.Fatalf("after a refused restore: %v %v", sb.GetState(), err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "other"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "hib"}); err != nil {
		t.Fatal(err)
	}
	if idle, w, _ := e.qosFiles("hib"); idle || w != container.LSWeight {
		t.Fatalf("restored ls sandbox: idle %v weight %d", idle, w)
	}
}

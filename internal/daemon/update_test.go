package daemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/errdefs"
)

// limitFiles reads a sandbox's CPU quota, memory limit and pids limit
// back from its cgroup files, in the host's layout ("-1"/"max" when
// unlimited).
func (e *env) limitFiles(id string) (cpu, mem, pids string) {
	e.t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			e.t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if cgroups.Mode() == "v2" {
		dir := filepath.Join(cgroups.Root, e.opts.CgroupParent, id)
		cpu, _, _ = strings.Cut(read(filepath.Join(dir, "cpu.max")), " ")
		return cpu, read(filepath.Join(dir, "memory.max")), read(filepath.Join(dir, "pids.max"))
	}
	v1 := func(sub, file string) string {
		return read(filepath.Join(cgroups.Root, sub, e.opts.CgroupParent, id, file))
	}
	return v1("cpu", "cpu.cfs_quota_us"), v1("memory", "memory.limit_in_bytes"), v1("pids", "pids.max")
}

// TestUpdateLimitsTakeEffect: UpdateSandbox writes the new CPU quota,
// memory limit and pids limit into the sandbox's cgroup files (read back
// here), changes labels (set and remove) and the lifetime, and a
// restarted daemon reports the updated values.
func TestUpdateLimitsTakeEffect(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "grow", Resources: &warrenv1.Resources{CpuMillis: 500, MemoryBytes: 64 << 20, PidsMax: 100},
		Labels: map[string]string{"keep": "1", "drop": "1", "over": "old"}})
	if cpu, mem, pids := e.limitFiles("grow"); cpu != "50000" || mem != "67108864" || pids != "100" {
		t.Fatalf("limits at create: cpu %s mem %s pids %s", cpu, mem, pids)
	}
	before := time.Now()
	sb, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "grow",
		CpuMillis: proto.Int64(1500), MemoryBytes: proto.Int64(128 << 20), PidsMax: proto.Int64(64),
		TimeoutSeconds: proto.Int64(7200),
		SetLabels:      map[string]string{"over": "new", "add": "2"}, RemoveLabels: []string{"drop", "absent"}})
	if err != nil {
		t.Fatal(err)
	}
	if cpu, mem, pids := e.limitFiles("grow"); cpu != "150000" || mem != "134217728" || pids != "64" {
		t.Fatalf("limits after update: cpu %s mem %s pids %s", cpu, mem, pids)
	}
	check := func(sb *warrenv1.Sandbox) {
		t.Helper()
		r := sb.GetResources()
		if r.GetCpuMillis() != 1500 || r.GetMemoryBytes() != 128<<20 || r.GetPidsMax() != 64 {
			t.Fatalf("resources %v", r)
		}
		if got := formatLabels(sb.GetLabels()); got != "add=2,keep=1,over=new" {
			t.Fatalf("labels %s", got)
		}
		if exp := time.UnixMilli(sb.GetExpiresAtUnixMs()); exp.Before(before.Add(2*time.Hour-time.Second)) || exp.After(time.Now().Add(2*time.Hour)) {
			t.Fatalf("expires %v", exp)
		}
	}
	check(sb)
	// The sandbox feels the pids limit: 64 processes at most.
	res := e.sh("grow", "for i in $(seq 80); do sleep 2 >/dev/null 2>&1 & done; echo done")
	if !strings.Contains(string(res.GetStderr()), "fork") {
		t.Fatalf("80 processes under pids.max 64: %q %q", res.GetStdout(), res.GetStderr())
	}

	// Partial updates leave the rest alone; 0 lifts the CPU quota and
	// gives memory the node default.
	sb, err = e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "grow", CpuMillis: proto.Int64(0)})
	if err != nil || sb.GetResources().GetCpuMillis() != 0 || sb.GetResources().GetPidsMax() != 64 {
		t.Fatalf("cpu 0: %v %v", sb.GetResources(), err)
	}
	if cpu, _, pids := e.limitFiles("grow"); cpu != "-1" && cpu != "max" || pids != "64" {
		t.Fatalf("after cpu 0: cpu %s pids %s", cpu, pids)
	}
	if _, err = e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "grow", CpuMillis: proto.Int64(1500)}); err != nil {
		t.Fatal(err)
	}

	e.stop()
	e.start()
	sb, err = e.m.Get(ctx, &warrenv1.GetRequest{Id: "grow"})
	if err != nil {
		t.Fatal(err)
	}
	check(sb)
	if cpu, mem, pids := e.limitFiles("grow"); cpu != "150000" || mem != "134217728" || pids != "64" {
		t.Fatalf("limits after restart: cpu %s mem %s pids %s", cpu, mem, pids)
	}
}

func formatLabels(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// TestUpdateRejectedChangesNothing: an invalid update is refused with
// invalid before anything changes, and one the kernel refuses midway (a
// memory limit below what the sandbox holds in tmpfs, which cannot be
// reclaimed without swap) puts back the CPU quota it had already written:
// the cgroup files, the reported sandbox and its record are unchanged.
func TestUpdateRejectedChangesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "firm", Resources: &warrenv1.Resources{CpuMillis: 500, MemoryBytes: 256 << 20, PidsMax: 100},
		Labels: map[string]string{"a": "1"}})
	want, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "firm"})
	cpu0, mem0, pids0 := e.limitFiles("firm")
	unchanged := func(what string) {
		t.Helper()
		if cpu, mem, pids := e.limitFiles("firm"); cpu != cpu0 || mem != mem0 || pids != pids0 {
			t.Fatalf("%s: cgroup changed: cpu %s mem %s pids %s", what, cpu, mem, pids)
		}
		got, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "firm"})
		if !proto.Equal(got, want) {
			t.Fatalf("%s: sandbox changed: %v", what, got)
		}
		rec, err := e.m.store.Get("firm")
		if err != nil || !proto.Equal(rec.Sandbox, want) {
			t.Fatalf("%s: record changed: %v %v", what, rec.Sandbox, err)
		}
	}
	many := map[string]string{}
	for i := range maxLabels {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for name, req := range map[string]*warrenv1.UpdateSandboxRequest{
		"memory too small": {CpuMillis: proto.Int64(1000), MemoryBytes: proto.Int64(1 << 20)},
		"negative cpu":     {CpuMillis: proto.Int64(-1), PidsMax: proto.Int64(50)},
		"too many cores":   {CpuMillis: proto.Int64(1 << 40)},
		"pids too small":   {PidsMax: proto.Int64(2), CpuMillis: proto.Int64(1000)},
		"timeout too long": {TimeoutSeconds: proto.Int64(1 << 40), CpuMillis: proto.Int64(1000)},
		"set and remove":   {SetLabels: map[string]string{"b": "2"}, RemoveLabels: []string{"b"}, CpuMillis: proto.Int64(1000)},
		"too many labels":  {SetLabels: many, CpuMillis: proto.Int64(1000)},
		"empty label key":  {SetLabels: map[string]string{"": "x"}},
		"bad network mode": {Network: &warrenv1.NetworkPolicy{Mode: "closed"}, CpuMillis: proto.Int64(1000)},
		"bad network cidr": {Network: &warrenv1.NetworkPolicy{Mode: "allowlist", Allow: []*warrenv1.NetworkRule{{Cidr: "10.0.0.0/40"}}}},
	} {
		req.Id = "firm"
		_, err := e.m.UpdateSandbox(ctx, req)
		if errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Fatalf("%s: %v, want invalid", name, err)
		}
		unchanged(name)
	}

	// 96 MiB of a shell variable is anonymous memory, which cannot be
	// reclaimed without swap: the kernel refuses a 32 MiB limit, after the
	// CPU quota was written.
	if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "firm",
		Shell: "v=$(head -c 100663296 /dev/zero | tr '\\0' a); sleep 600"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the sandbox to hold 96 MiB", func() bool {
		st, err := e.m.sandboxStats("firm")
		return err == nil && st.MemoryBytes > 96<<20
	})
	// The network goes first and is taken back too: no interface is left.
	_, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "firm", CpuMillis: proto.Int64(2000), PidsMax: proto.Int64(50),
		MemoryBytes: proto.Int64(32 << 20), SetLabels: map[string]string{"b": "2"}, Network: &warrenv1.NetworkPolicy{Mode: "open"}})
	wantCat(t, err, errdefs.Invalid, "cannot give back")
	unchanged("memory below use")
	if res := e.sh("firm", "cat /proc/net/dev"); strings.Contains(string(res.GetStdout()), "eth0") {
		t.Fatalf("refused update left the sandbox a network:\n%s", res.GetStdout())
	}
	if res := e.sh("firm", "echo alive"); string(res.GetStdout()) != "alive\n" {
		t.Fatalf("sandbox after refused update: %q", res.GetStdout())
	}
}

// TestUpdateConflictUnlessRunning: UpdateSandbox of a STOPPED, DELETING
// or CREATING sandbox is a conflict naming the state, and changes nothing.
func TestUpdateConflictUnlessRunning(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "dying"})
	forceState(t, e.m, "dying", stateDeleting)
	_, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "dying", PidsMax: proto.Int64(64)})
	wantCat(t, err, errdefs.Conflict, "sandbox dying is DELETING: update needs RUNNING")
	forceState(t, e.m, "dying", stateRunning)

	killInit(t, e.m, "dying")
	eventually(t, 10*time.Second, "sandbox to stop", func() bool {
		sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "dying"})
		return err == nil && sb.GetState() == stateStopped
	})
	_, err = e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "dying", SetLabels: map[string]string{"x": "y"}})
	wantCat(t, err, errdefs.Conflict, "sandbox dying is STOPPED (init exited): update needs RUNNING")
	if sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "dying"}); len(sb.GetLabels()) != 0 {
		t.Fatalf("labels changed: %v", sb.GetLabels())
	}
	_, err = e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "nosuch", PidsMax: proto.Int64(64)})
	wantCat(t, err, errdefs.NotFound, "not found")
}

// sandboxStats reads a running sandbox's counters from its backend.
func (m *Manager) sandboxStats(id string) (backend.Stats, error) {
	_, v, err := m.live(context.Background(), opExec, id)
	if err != nil {
		return backend.Stats{}, err
	}
	return v.sb.Stats()
}

// plainBackend hides the container sandboxes' Updater, as a backend
// without one would.
type plainBackend struct{ backend.Backend }

type plainSandbox struct{ backend.Sandbox }

func (p plainBackend) Create(ctx context.Context, spec backend.Spec) (backend.Sandbox, error) {
	sb, err := p.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return plainSandbox{sb}, nil
}

// TestUpdateWithoutUpdater: on a backend without backend.Updater, an
// update of limits is unsupported (never retried) and changes nothing, while
// labels and the lifetime, which the daemon keeps, still change.
func TestUpdateWithoutUpdater(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Backends["container"] = plainBackend{c.Backends["container"]} })
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "plain"})
	_, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "plain", PidsMax: proto.Int64(64), SetLabels: map[string]string{"a": "b"}})
	wantCat(t, err, errdefs.Unsupported, "cannot change the limits")
	if sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "plain"}); len(sb.GetLabels()) != 0 || sb.GetResources().GetPidsMax() == 64 {
		t.Fatalf("changed: %v", sb)
	}
	sb, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "plain", SetLabels: map[string]string{"a": "b"}})
	if err != nil || sb.GetLabels()["a"] != "b" {
		t.Fatalf("labels only: %v %v", sb, err)
	}
}

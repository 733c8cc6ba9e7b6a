package daemon

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/container"
	"github.com/warrenrl/warren/internal/errdefs"
)

// pidEnv runs background processes to their end in one sandbox.
type pidEnv struct {
	*env
	t  *testing.T
	id string
}

func (e pidEnv) run(out string) (*warrenv1.ProcessInfo, *warrenv1.ExecResult) {
	e.t.Helper()
	ctx := ctxT(e.t)
	p, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: e.id, Argv: []string{"echo", out}})
	if err != nil {
		e.t.Fatal(err)
	}
	res, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: e.id, ProcessId: p.GetProcessId()})
	if err != nil {
		e.t.Fatal(err)
	}
	if got := string(res.GetStdout()); got != out+"\n" || res.GetExitCode() != 0 {
		e.t.Fatalf("%s (pid %d): stdout %q exit %d, want %q: another process's record", p.GetProcessId(), p.GetPid(), got, res.GetExitCode(), out+"\n")
	}
	return p, res
}

// initPid is the sandbox's init, as the node sees it.
func (e pidEnv) initPid() int {
	s, err := e.m.lookup(e.id)
	if err != nil {
		e.t.Fatal(err)
	}
	s.mu.Lock()
	root := s.sb.Root()
	s.mu.Unlock()
	pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(root, "/proc/"), "/root"))
	if err != nil {
		e.t.Fatalf("sandbox root %q: %v", root, err)
	}
	return pid
}

// TestProcessPIDsContinueAfterRestore: after a restore, new processes get
// pids past those of the processes that exited before the checkpoint (CRIU
// alone hands them out from the bottom again), and each reads its own
// output.
func TestProcessPIDsContinueAfterRestore(t *testing.T) {
	requireCRIU(t)
	e := pidEnv{newEnv(t), t, "cont"}
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: e.id, UserNamespace: proto.Bool(false)})
	if _, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: e.id, Argv: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	last := 0
	for i := range 3 {
		p, _ := e.run(fmt.Sprintf("before-%d", i))
		last = max(last, int(p.GetPid()))
	}
	if _, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: e.id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: e.id}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		p, _ := e.run(fmt.Sprintf("after-%d", i))
		if int(p.GetPid()) <= last {
			t.Errorf("%s after the restore got pid %d; pids up to %d were used before it", p.GetProcessId(), p.GetPid(), last)
		}
	}
}

// TestProcessPIDReuse: when a new process gets the pid of one that exited
// (the namespace wrapped, or was set back), it reads its own output and
// exit, and the daemon lets go of the older record rather than show the
// new process's output as its own.
func TestProcessPIDReuse(t *testing.T) {
	e := pidEnv{newEnv(t), t, "reuse"}
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: e.id, UserNamespace: proto.Bool(true)})
	first, _ := e.run("first")
	second, _ := e.run("second")
	// The next process gets first's pid.
	if err := container.SetLastPID(e.initPid(), int(first.GetPid())-1, false); err != nil {
		t.Fatal(err)
	}
	third, _ := e.run("third")
	if third.GetPid() != first.GetPid() {
		t.Fatalf("the pid namespace gave pid %d, not %d as set: the test cannot check reuse", third.GetPid(), first.GetPid())
	}
	_, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: e.id, ProcessId: first.GetProcessId()})
	wantCat(t, err, errdefs.NotFound, first.GetProcessId())
	if res, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: e.id, ProcessId: second.GetProcessId()}); err != nil || string(res.GetStdout()) != "second\n" {
		t.Fatalf("the record of a process whose pid was not reused: %v %v", res, err)
	}
	// The agent forgot the older record too: after a daemon restart the
	// adopted list has each pid once.
	e.stop()
	e.start()
	list, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: e.id})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range list.GetProcesses() {
		ids = append(ids, p.GetProcessId())
	}
	if strings.Join(ids, ",") != second.GetProcessId()+","+third.GetProcessId() {
		t.Fatalf("processes after a restart: %v, want %s and %s", ids, second.GetProcessId(), third.GetProcessId())
	}
	if res, err := e.m.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: e.id, ProcessId: third.GetProcessId()}); err != nil || string(res.GetStdout()) != "third\n" {
		t.Fatalf("the process that has the pid, after a restart: %v %v", res, err)
	}
}

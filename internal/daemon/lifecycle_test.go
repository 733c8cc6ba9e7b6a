package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
	"github.com/warrenrl/warren/internal/store"
)

var allOps = []op{opInspect, opExec, opFiles, opCommit, opUpdate, opExtend, opDelete, opPause, opResume, opProcess, opHibernate, opFork, opPort}

// unknownState is a state number no daemon of this version knows.
const unknownState = state(42)

// TestLifecycleTableRefusesWithConflictNamingTheState: for every state
// and every call class, allowLocked permits exactly what the table lists,
// and every refusal is a Conflict that names the state and what the call
// needs (NotFound once the sandbox is gone).
func TestLifecycleTableRefusesWithConflictNamingTheState(t *testing.T) {
	states := append(slices.Clone(known), unknownState, stateGone)
	want := map[state][]op{
		stateCreating: {opInspect, opProcess},
		stateRunning:  {opInspect, opExec, opFiles, opCommit, opUpdate, opExtend, opDelete, opPause, opProcess, opHibernate, opPort},
		statePaused:   {opInspect, opExtend, opDelete, opResume, opHibernate},
		// Nothing runs: calls that reach the agent are refused, as
		// while paused; Fork takes its checkpoint.
		stateHibernated: {opInspect, opExtend, opDelete, opResume, opFork},
		stateStopped:    {opInspect, opExtend, opDelete, opProcess},
		stateLost:       {opInspect, opExtend, opDelete, opProcess},
		stateDeleting:   {opInspect, opProcess},
		unknownState:    {opInspect, opDelete},
		stateGone:       nil,
	}
	refused := 0
	for _, st := range states {
		for _, o := range allOps {
			s := &sandbox{id: "x", st: st, info: &warrenv1.Sandbox{State: st}}
			err := s.allowLocked(o)
			if slices.Contains(want[st], o) {
				if err != nil {
					t.Errorf("%s in %s refused: %v", o, stateName(st), err)
				}
				continue
			}
			refused++
			switch {
			case err == nil:
				t.Errorf("%s in %s permitted", o, stateName(st))
			case st == stateGone:
				if errdefs.CategoryOf(err) != errdefs.NotFound {
					t.Errorf("%s when gone: %v, want not_found", o, err)
				}
			case errdefs.CategoryOf(err) != errdefs.Conflict ||
				!strings.Contains(err.Error(), "sandbox x is "+stateName(st)) ||
				!strings.Contains(err.Error(), o.String()+" needs "):
				t.Errorf("%s in %s: %s %v, want a conflict naming the state", o, stateName(st), errdefs.CategoryOf(err), err)
			}
		}
	}
	if refused < 30 {
		t.Fatalf("only %d refusals checked", refused)
	}
	s := &sandbox{id: "x", st: statePaused, info: &warrenv1.Sandbox{State: statePaused}}
	if err := s.allowLocked(opExec); err == nil || err.Error() != "sandbox x is PAUSED (its processes are frozen: Resume it first): exec needs RUNNING" {
		t.Fatalf("message: %v", err)
	}
	s = &sandbox{id: "x", st: unknownState, info: &warrenv1.Sandbox{State: unknownState}}
	if err := s.allowLocked(opUpdate); err == nil || !strings.Contains(err.Error(), "state 42, which this daemon does not know") {
		t.Fatalf("message: %v", err)
	}
}

// TestLifecycleTransitions: setState makes exactly the moves of the
// table and refuses every other one (Internal), leaving the state alone.
func TestLifecycleTransitions(t *testing.T) {
	m := &Manager{log: discardLogger()}
	states := append(slices.Clone(known), unknownState, stateGone)
	want := map[[2]state]bool{}
	for from, tos := range transitions {
		for _, to := range tos {
			want[[2]state{from, to}] = true
		}
	}
	want[[2]state{unknownState, stateDeleting}] = true
	want[[2]state{stateDeleting, unknownState}] = true
	forbidden := 0
	for _, from := range states {
		for _, to := range states {
			s := &sandbox{id: "x", st: from, info: &warrenv1.Sandbox{State: from}}
			err := m.setState(s, to)
			if want[[2]state{from, to}] {
				if err != nil || s.st != to {
					t.Errorf("%s -> %s: %v", stateName(from), stateName(to), err)
				}
				continue
			}
			forbidden++
			if err == nil || errdefs.CategoryOf(err) != errdefs.Internal || s.st != from {
				t.Errorf("%s -> %s permitted (%v)", stateName(from), stateName(to), err)
			}
		}
	}
	// Spot checks of the moves that matter most.
	for _, tr := range [][2]state{{stateStopped, stateRunning}, {stateDeleting, stateCreating}, {stateGone, stateRunning}, {stateCreating, stateStopped}} {
		if canTransition(tr[0], tr[1]) {
			t.Errorf("%s -> %s in the table", stateName(tr[0]), stateName(tr[1]))
		}
	}
	if forbidden < 50 {
		t.Fatalf("only %d forbidden transitions checked", forbidden)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// forceState moves a live sandbox along the table from the test, as the
// pause and hibernate calls of a later version will.
func forceState(t *testing.T, m *Manager, id string, sts ...state) {
	t.Helper()
	s, err := m.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range sts {
		if err := m.setState(s, st); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCallsRefusedWhenPausedOrHibernated: exec, processes, every file
// call, commit and update are refused with a conflict naming the state in
// PAUSED and HIBERNATED; Get, List, ExtendTimeout and Delete still work.
func TestCallsRefusedWhenPausedOrHibernated(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "nap"})
	calls := map[string]func() error{
		"exec": func() error {
			_, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "nap", Argv: []string{"true"}})
			return err
		},
		"exec stream": func() error {
			return e.m.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "nap", Argv: []string{"true"}}, func(*warrenv1.ExecEvent) error { return nil })
		},
		"start process": func() error {
			_, err := e.m.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "nap", Argv: []string{"true"}})
			return err
		},
		"write file": func() error {
			_, err := e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "nap", Path: "/tmp/x", Content: []byte("x")})
			return err
		},
		"read file": func() error {
			_, err := e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: "nap", Path: "/etc/passwd"})
			return err
		},
		"list files": func() error {
			_, err := e.m.ListFiles(ctx, &warrenv1.ListFilesRequest{SandboxId: "nap", Path: "/"})
			return err
		},
		"stat": func() error {
			_, err := e.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: "nap", Path: "/"})
			return err
		},
		"mkdir": func() error {
			_, err := e.m.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: "nap", Path: "/tmp/d"})
			return err
		},
		"remove": func() error {
			_, err := e.m.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: "nap", Path: "/tmp/x"})
			return err
		},
		"tar out": func() error { return e.m.TarOut(ctx, "nap", "/etc", io.Discard, sandboxfs.TarOptions{}) },
		"tar in":  func() error { return e.m.TarIn(ctx, "nap", "/tmp", bytes.NewReader(nil)) },
		"commit": func() error {
			_, err := e.m.CommitSandbox(ctx, &warrenv1.CommitSandboxRequest{SandboxId: "nap", Name: "nap-layer"})
			return err
		},
		"update": func() error {
			_, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "nap", PidsMax: proto.Int64(64)})
			return err
		},
		"update labels": func() error {
			_, err := e.m.UpdateSandbox(ctx, &warrenv1.UpdateSandboxRequest{Id: "nap", SetLabels: map[string]string{"a": "b"}})
			return err
		},
	}
	check := func(name string) {
		t.Helper()
		for call, f := range calls {
			err := f()
			if errdefs.CategoryOf(err) != errdefs.Conflict || !strings.Contains(err.Error(), "sandbox nap is "+name) ||
				!strings.Contains(err.Error(), "needs RUNNING") {
				t.Errorf("%s in %s: %s %v", call, name, errdefs.CategoryOf(err), err)
			}
		}
		sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "nap"})
		if err != nil || sb.GetState().String() != "SANDBOX_STATE_"+name {
			t.Errorf("get in %s: %v %v", name, sb.GetState(), err)
		}
		if _, err := e.m.ExtendTimeout(ctx, &warrenv1.ExtendTimeoutRequest{Id: "nap", TimeoutSeconds: 600}); err != nil {
			t.Errorf("extend in %s: %v", name, err)
		}
	}
	forceState(t, e.m, "nap", statePaused)
	check("PAUSED")
	forceState(t, e.m, "nap", stateHibernated)
	check("HIBERNATED")
	// Back to RUNNING (a resume), and the calls work again.
	forceState(t, e.m, "nap", stateRunning)
	if res := e.sh("nap", "echo ok"); string(res.GetStdout()) != "ok\n" {
		t.Fatalf("exec after resume: %q", res.GetStdout())
	}
	forceState(t, e.m, "nap", statePaused)
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "nap"}); err != nil {
		t.Fatalf("delete paused: %v", err)
	}
	if left := sweepLeftovers(e, "nap"); left != "" {
		t.Fatalf("left behind: %s", left)
	}
}

// rewriteRecord changes a stopped daemon's record of id.
func rewriteRecord(t *testing.T, e *env, id string, f func(*warrenv1.Sandbox)) {
	t.Helper()
	st, err := store.Open(e.dir + "/state")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	f(rec.Sandbox)
	if err := st.Put(rec); err != nil {
		t.Fatal(err)
	}
}

// initAlive reports whether the init in a container backend state blob
// still runs.
func initAlive(t *testing.T, blob []byte) bool {
	t.Helper()
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(blob, &st); err != nil || st.Pid <= 1 {
		t.Fatalf("backend state %s: %v", blob, err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", st.Pid))
	return err == nil && !strings.Contains(string(b[bytes.LastIndexByte(b, ')')+1:]), " Z ")
}

func recordBlob(t *testing.T, e *env, id string) []byte {
	t.Helper()
	s, err := e.m.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.backendState)
}

// TestUnknownStateRecordSurvivesRestart: a record in a state this daemon
// does not know (a newer daemon's number), and a PAUSED one (adopted as
// such, whether or not its sandbox is frozen), are kept across restarts, listed with its state, its sandbox left running
// and its resources untouched by the sweep; calls other than Delete are
// refused; Delete removes it and everything it had. (Before the table,
// adoption deleted such records and the sweep tore their sandboxes down.)
func TestUnknownStateRecordSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "future"})
	e.create(&warrenv1.CreateRequest{Id: "frozen"})
	blobs := map[string][]byte{"future": recordBlob(t, e, "future"), "frozen": recordBlob(t, e, "frozen")}
	e.stop()
	rewriteRecord(t, e, "future", func(sb *warrenv1.Sandbox) { sb.State = unknownState })
	rewriteRecord(t, e, "frozen", func(sb *warrenv1.Sandbox) { sb.State = statePaused })
	for range 2 {
		e.start()
		list, err := e.m.List(ctx, &warrenv1.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]state{}
		for _, sb := range list.GetSandboxes() {
			got[sb.GetId()] = sb.GetState()
		}
		if got["future"] != unknownState || got["frozen"] != statePaused {
			t.Fatalf("listed %v", got)
		}
		for id, blob := range blobs {
			if !initAlive(t, blob) {
				t.Fatalf("%s: init killed by the adoption", id)
			}
		}
		_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "future", Argv: []string{"true"}})
		wantCat(t, err, errdefs.Conflict, "sandbox future is state 42")
		_, err = e.m.ExtendTimeout(ctx, &warrenv1.ExtendTimeoutRequest{Id: "future", TimeoutSeconds: 60})
		wantCat(t, err, errdefs.Conflict, "sandbox future is state 42")
		_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "frozen", Argv: []string{"true"}})
		wantCat(t, err, errdefs.Conflict, "sandbox frozen is PAUSED")
		if e.gauge("unknown") != 1 || e.gauge("paused") != 1 {
			t.Fatalf("gauges unknown %v paused %v", e.gauge("unknown"), e.gauge("paused"))
		}
		e.stop()
	}
	e.start()
	for id, blob := range blobs {
		if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: id}); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		if initAlive(t, blob) {
			t.Fatalf("%s: init runs on after delete", id)
		}
		if left := sweepLeftovers(e, id); left != "" {
			t.Fatalf("%s left behind: %s", id, left)
		}
	}
}

// flakyBackend fails Adopt with Unavailable while failAdopt > 0, and its
// sandboxes' Destroy once while failDestroy is set; everything else is
// the real container backend.
type flakyBackend struct {
	backend.Backend
	failAdopt   atomic.Int32
	failDestroy atomic.Bool
}

func (f *flakyBackend) Adopt(ctx context.Context, id string, blob []byte) (backend.Sandbox, error) {
	if f.failAdopt.Add(-1) >= 0 {
		return nil, errdefs.Unavailablef("injected: out of file descriptors")
	}
	sb, err := f.Backend.Adopt(ctx, id, blob)
	if err != nil {
		return nil, err
	}
	return &flakySandbox{Sandbox: sb, f: f}, nil
}

func (f *flakyBackend) Create(ctx context.Context, spec backend.Spec) (backend.Sandbox, error) {
	sb, err := f.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &flakySandbox{Sandbox: sb, f: f}, nil
}

type flakySandbox struct {
	backend.Sandbox
	f *flakyBackend
}

// Destroy kills the sandbox (its init exits) but reports a failure, as a
// teardown that cannot unmount would.
func (s *flakySandbox) Destroy(ctx context.Context) error {
	err := s.Sandbox.Destroy(ctx)
	if s.f.failDestroy.CompareAndSwap(true, false) {
		return errdefs.Internalf("injected: unmount failed")
	}
	return err
}

func (s *flakySandbox) Update(ctx context.Context, u backend.Update) error {
	return s.Sandbox.(backend.Updater).Update(ctx, u)
}

func flaky(f *flakyBackend) func(*Config) {
	return func(c *Config) {
		f.Backend = c.Backends["container"]
		c.Backends["container"] = f
	}
}

// TestTransientAdoptFailureIsLostAndRetried: an Adopt that fails without
// proving the sandbox gone leaves it LOST (reported, calls refused with a
// conflict naming the state), its init running and its resources kept by
// the sweep; the daemon adopts it again in the background and it serves
// execs as before. (Before, any Adopt error tore the sandbox down.)
func TestTransientAdoptFailureIsLostAndRetried(t *testing.T) {
	f := &flakyBackend{}
	e := newEnv(t, flaky(f))
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "far"})
	e.sh("far", "echo kept > /tmp/mark")
	blob := recordBlob(t, e, "far")
	e.stop()
	f.failAdopt.Store(2) // the adoption at start and the first retry
	e.start()
	sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "far"})
	if err != nil || sb.GetState() != stateLost || !strings.Contains(sb.GetDeadReason(), "out of file descriptors") {
		t.Fatalf("after failed adopt: %v %v", sb, err)
	}
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "far", Argv: []string{"true"}})
	wantCat(t, err, errdefs.Conflict, "sandbox far is LOST")
	if !initAlive(t, blob) {
		t.Fatal("the sandbox of a failed adoption was torn down")
	}
	// The record still says RUNNING: a restart tries again.
	rec, err := e.m.store.Get("far")
	if err != nil || rec.State() != stateRunning {
		t.Fatalf("record %v %v", rec.State(), err)
	}
	eventually(t, 15*time.Second, "LOST sandbox adopted again", func() bool {
		sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "far"})
		return err == nil && sb.GetState() == stateRunning
	})
	if out := e.sh("far", "cat /tmp/mark"); string(out.GetStdout()) != "kept\n" {
		t.Fatalf("after re-adoption: %q", out.GetStdout())
	}
	if e.gauge("lost") != 0 || e.gauge("running") != 1 {
		t.Fatalf("gauges lost %v running %v", e.gauge("lost"), e.gauge("running"))
	}
}

// TestLostSandboxDelete: while a LOST sandbox cannot be reached, its
// delete fails with unavailable and changes nothing, and the background
// adoption goes on; once reachable it is RUNNING again and deletes whole.
func TestLostSandboxDelete(t *testing.T) {
	f := &flakyBackend{}
	e := newEnv(t, flaky(f))
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "far"})
	e.create(&warrenv1.CreateRequest{Id: "near"})
	blob, nearBlob := recordBlob(t, e, "far"), recordBlob(t, e, "near")
	e.stop()
	f.failAdopt.Store(1000)
	e.start()
	_, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "far"})
	wantCat(t, err, errdefs.Unavailable, "cannot be reached")
	if sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "far"}); err != nil || sb.GetState() != stateLost || !initAlive(t, blob) {
		t.Fatalf("after failed delete: %v %v", sb, err)
	}
	f.failAdopt.Store(0)
	// Reachable again: the delete adopts it itself (before the background
	// retry, due after a second) and destroys it.
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "near"}); err != nil {
		t.Fatalf("delete of a reachable LOST sandbox: %v", err)
	}
	if initAlive(t, nearBlob) || sweepLeftovers(e, "near") != "" {
		t.Fatalf("near left behind: %s", sweepLeftovers(e, "near"))
	}
	// The other is still retried in the background after its failed delete.
	eventually(t, 15*time.Second, "LOST sandbox adopted again after a failed delete", func() bool {
		sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "far"})
		return err == nil && sb.GetState() == stateRunning
	})
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "far"}); err != nil {
		t.Fatal(err)
	}
	if initAlive(t, blob) {
		t.Fatal("init runs on after delete")
	}
	if left := sweepLeftovers(e, "far"); left != "" {
		t.Fatalf("left behind: %s", left)
	}
}

// TestFailedDestroyShowsStopped: a Delete whose Destroy fails after the
// init died leaves the sandbox STOPPED with the failure as its reason,
// not RUNNING (before, it went back to RUNNING and execs failed oddly);
// the next Delete finishes the job.
func TestFailedDestroyShowsStopped(t *testing.T) {
	f := &flakyBackend{}
	e := newEnv(t, flaky(f))
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "stuck"})
	f.failDestroy.Store(true)
	_, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "stuck"})
	wantCat(t, err, errdefs.Internal, "injected")
	sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "stuck"})
	if err != nil || sb.GetState() != stateStopped || !strings.Contains(sb.GetDeadReason(), "injected") {
		t.Fatalf("after failed delete: %v %v", sb, err)
	}
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "stuck", Argv: []string{"true"}})
	wantCat(t, err, errdefs.Conflict, "sandbox stuck is STOPPED")
	if rec, err := e.m.store.Get("stuck"); err != nil || rec.State() != stateStopped {
		t.Fatalf("record %v %v", rec.State(), err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "stuck"}); err != nil {
		t.Fatal(err)
	}
}

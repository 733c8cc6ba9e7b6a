package trajectory

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

func execCall(session string, seq uint64, shell string) Call {
	req := &warrenv1.ExecRequest{SandboxId: "sb", Shell: shell, SessionId: session, Seq: seq}
	return Call{Session: session, Seq: seq, Hash: RequestHash(MethodExec, req), Entry: NewEntry(MethodExec, req)}
}

// run begins c and finishes it live with stdout out; it fails the test
// unless the step ran live.
func run(t *testing.T, l *Log, c Call, out string) uint64 {
	t.Helper()
	o, err := l.Begin(context.Background(), c)
	if err != nil || o.Live == nil {
		t.Fatalf("begin %v: %+v %v", c.Seq, o, err)
	}
	if err := o.Live.Finish(&warrenv1.ExecResult{Stdout: []byte(out)}, nil, false, nil); err != nil {
		t.Fatal(err)
	}
	return o.Live.Seq()
}

// A recorded step is replayed (same request) or refused (another one),
// across a reopen of the file; a step past the end runs live.
func TestReplayMatchesAndRefusesMismatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sb.log")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if seq := run(t, l, execCall("s", 0, fmt.Sprintf("echo %d >> f", i)), fmt.Sprint(i)); seq != uint64(i) {
			t.Fatalf("next seq %d, want %d", seq, i)
		}
	}
	l.Close()
	if l, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 1; i <= 3; i++ {
		o, err := l.Begin(context.Background(), execCall("s", uint64(i), fmt.Sprintf("echo %d >> f", i)))
		if err != nil || o.Replay == nil || string(o.Replay.GetExecResult().GetStdout()) != fmt.Sprint(i) || o.Replay.GetSeq() != uint64(i) {
			t.Fatalf("replay %d: %+v %v", i, o, err)
		}
	}
	_, err = l.Begin(context.Background(), execCall("s", 2, "echo other >> f"))
	var mm *MismatchError
	if errdefs.CategoryOf(err) != errdefs.Conflict || !errors.As(err, &mm) || mm.Seq != 2 ||
		!strings.Contains(err.Error(), `shell: recorded "echo 2 >> f", got "echo other >> f"`) {
		t.Fatalf("mismatch: %v", err)
	}
	// Another session numbers its own steps.
	if seq := run(t, l, execCall("t", 0, "echo 1 >> f"), "t1"); seq != 1 {
		t.Fatalf("session t seq %d", seq)
	}
	if seq := run(t, l, execCall("s", 4, "echo 4 >> f"), "4"); seq != 4 {
		t.Fatalf("live past the end: %d", seq)
	}
}

// A payload (stdin, file content) takes part in the match through its
// digest, and is not kept in the entry.
func TestPayloadDigest(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "sb.log"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mk := func(content string) Call {
		req := &warrenv1.WriteFileRequest{SandboxId: "sb", Path: "/a", Content: []byte(content), Seq: 1}
		return Call{Session: "s", Seq: 1, Hash: RequestHash(MethodWriteFile, req), Entry: NewEntry(MethodWriteFile, req)}
	}
	o, err := l.Begin(context.Background(), mk("hello"))
	if err != nil || o.Live == nil {
		t.Fatal(o, err)
	}
	if err := o.Live.Finish(nil, nil, false, nil); err != nil {
		t.Fatal(err)
	}
	o, err = l.Begin(context.Background(), mk("hello"))
	if err != nil || o.Replay == nil || len(o.Replay.GetWriteFile().GetContent()) != 0 || o.Replay.GetPayloadBytes() != 5 {
		t.Fatalf("replay %v %v", o.Replay, err)
	}
	if _, err = l.Begin(context.Background(), mk("hullo")); err == nil || !strings.Contains(err.Error(), "payload: recorded 5 bytes") {
		t.Fatalf("payload mismatch: %v", err)
	}
}

// A step begun by a daemon that stopped before its outcome was recorded
// is neither replayed nor run again; a torn frame at the tail is cut.
func TestInterruptedStepAndTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sb.log")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, l, execCall("s", 1, "a"), "a")
	if _, err := l.Begin(context.Background(), execCall("s", 2, "b")); err != nil { // never finished
		t.Fatal(err)
	}
	l.Close()
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte{200, 0, 0, 0, 1, 2}) // a torn frame
	f.Close()
	before, _ := os.Stat(path)

	l, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if after, _ := os.Stat(path); after.Size() != before.Size()-6 {
		t.Fatalf("torn tail not cut: %d -> %d", before.Size(), after.Size())
	}
	_, err = l.Begin(context.Background(), execCall("s", 2, "b"))
	if errdefs.CategoryOf(err) != errdefs.Conflict || !strings.Contains(err.Error(), "never recorded") {
		t.Fatalf("interrupted step: %v", err)
	}
	ents, next, err := l.Read(0, "", true, 10)
	if err != nil || next != 0 || len(ents) != 2 || ents[0].GetSeq() != 1 || !ents[1].GetInterrupted() || ents[1].GetSeq() != 2 {
		t.Fatalf("read %v %v %v", ents, next, err)
	}
	// The next unnumbered step follows the interrupted one.
	if seq := run(t, l, execCall("s", 0, "c"), "c"); seq != 3 {
		t.Fatalf("next after interrupted %d", seq)
	}
}

// A step refused before it ran is run again, and superseded.
func TestNotRunStepRunsAgain(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "sb.log"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	o, _ := l.Begin(context.Background(), execCall("s", 1, "a"))
	if err := o.Live.Abandon(errdefs.Conflictf("sandbox is STOPPED")); err != nil {
		t.Fatal(err)
	}
	if seq := run(t, l, execCall("s", 1, "a"), "ran"); seq != 1 {
		t.Fatal(seq)
	}
	o, err = l.Begin(context.Background(), execCall("s", 1, "a"))
	if err != nil || string(o.Replay.GetExecResult().GetStdout()) != "ran" {
		t.Fatalf("%v %v", o, err)
	}
}

// A recorded error is replayed with its category.
func TestErrorReplayed(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "sb.log"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	o, _ := l.Begin(context.Background(), execCall("s", 1, "mkdir"))
	if err := o.Live.Finish(nil, errdefs.AlreadyExistsf("/x exists"), false, nil); err != nil {
		t.Fatal(err)
	}
	o, _ = l.Begin(context.Background(), execCall("s", 1, "mkdir"))
	if err := Err(o.Replay); !errdefs.IsAlreadyExists(err) || err.Error() != "/x exists" {
		t.Fatalf("replayed error %v", err)
	}
}

// The cap refuses a numbered step and runs an unnumbered one unrecorded.
func TestCap(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "sb.log"), Options{MaxBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	run(t, l, execCall("s", 0, strings.Repeat("x", 100)), "")
	_, err = l.Begin(context.Background(), execCall("s", 2, "y"))
	if errdefs.CategoryOf(err) != errdefs.Exhausted || !strings.Contains(err.Error(), "full") {
		t.Fatalf("numbered past the cap: %v", err)
	}
	o, err := l.Begin(context.Background(), execCall("s", 0, "y"))
	if err != nil || o.Live != nil || o.Replay != nil || l.Stats().Unrecorded != 1 {
		t.Fatalf("unnumbered past the cap: %+v %v", o, err)
	}
	// Recorded steps still replay.
	if o, err := l.Begin(context.Background(), execCall("s", 1, strings.Repeat("x", 100))); err != nil || o.Replay == nil {
		t.Fatalf("replay past the cap: %v", err)
	}
}

// Concurrent steps record once each; a call with the seq of a running
// step waits and replays it.
func TestConcurrentSteps(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "sb.log"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	o, err := l.Begin(context.Background(), execCall("s", 1, "slow"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *warrenv1.TrajectoryEntry)
	go func() {
		o2, _ := l.Begin(context.Background(), execCall("s", 1, "slow"))
		got <- o2.Replay
	}()
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(t, l, execCall("c", uint64(i+1), fmt.Sprint(i)), fmt.Sprint(i))
		}()
	}
	wg.Wait()
	o.Live.Finish(&warrenv1.ExecResult{Stdout: []byte("done")}, nil, false, nil)
	if r := <-got; string(r.GetExecResult().GetStdout()) != "done" {
		t.Fatalf("waiter replayed %v", r)
	}
	ents, _, err := l.Read(0, "c", false, 1000)
	if err != nil || len(ents) != 32 {
		t.Fatalf("read session c: %d %v", len(ents), err)
	}
	// Paged.
	page, next, _ := l.Read(0, "", true, 10)
	if len(page) != 10 || next == 0 {
		t.Fatalf("page %d next %d", len(page), next)
	}
}

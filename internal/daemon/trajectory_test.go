package daemon

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// rollout is an agent loop's calls on sandbox id in session: each
// command appends a line to /work/log, a file write and a mkdir between.
// It returns how many of its calls were replayed.
func rollout(t *testing.T, m *Manager, id, session string, steps int) (replayed int) {
	t.Helper()
	ctx := ctxT(t)
	seq := uint64(0)
	for i := range steps {
		seq++
		res, err := m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, SessionId: session, Seq: seq, Shell: fmt.Sprintf("mkdir -p /work && echo line-%d >> /work/log && wc -l < /work/log", i)})
		if err != nil || res.GetSeq() != seq || res.GetExitCode() != 0 {
			t.Fatalf("step %d: %v %v", seq, res, err)
		}
		if res.GetReplayed() {
			replayed++
		}
		seq++
		w, err := m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, SessionId: session, Seq: seq, Path: "/work/notes", Content: []byte(fmt.Sprintf("note %d\n", i)), Append: true})
		if err != nil || w.GetSeq() != seq {
			t.Fatalf("write step %d: %v %v", seq, w, err)
		}
		if w.GetReplayed() {
			replayed++
		}
	}
	return replayed
}

// The guarantee: a rollout re-run from the start after a trainer restart
// (the same calls with the same seqs), and again after a daemon restart,
// runs nothing twice: each appended line and note is in the files once,
// every replayed result is the recorded one, and the steps past the log
// run live.
func TestTrajectoryReplayRunsNothingTwice(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "traj"})
	if n := rollout(t, e.m, "traj", "r1", 3); n != 0 {
		t.Fatalf("first run replayed %d", n)
	}
	// The trainer restarts: its loop runs again from the start, and
	// further.
	if n := rollout(t, e.m, "traj", "r1", 5); n != 6 {
		t.Fatalf("second run replayed %d, want 6", n)
	}
	e.stop()
	e.start()
	if n := rollout(t, e.m, "traj", "r1", 6); n != 10 {
		t.Fatalf("after daemon restart replayed %d, want 10", n)
	}
	res := e.sh("traj", "cat /work/log; cat /work/notes")
	var want strings.Builder
	for i := range 6 {
		fmt.Fprintf(&want, "line-%d\n", i)
	}
	for i := range 6 {
		fmt.Fprintf(&want, "note %d\n", i)
	}
	if string(res.GetStdout()) != want.String() {
		t.Fatalf("files after replays:\n%s\nwant\n%s", res.GetStdout(), want.String())
	}
	// A replayed result is the recorded one: wc saw 2 lines at step 3.
	r, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "traj", SessionId: "r1", Seq: 3, Shell: "mkdir -p /work && echo line-1 >> /work/log && wc -l < /work/log"})
	if err != nil || !r.GetReplayed() || strings.TrimSpace(string(r.GetStdout())) != "2" {
		t.Fatalf("replayed result %v %v", r, err)
	}
	if v := metricValue(t, e.metrics.TrajectoryCalls.WithLabelValues("replayed")); v != 10+1 { // metrics start anew with the daemon
		t.Fatalf("replayed metric %v", v)
	}
}

// A replayed step whose request differs is refused with a conflict that
// names the step and the field, and runs nothing.
func TestTrajectoryMismatch(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "mm"})
	rollout(t, e.m, "mm", "s", 1)
	_, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "mm", SessionId: "s", Seq: 1, Shell: "echo diverged >> /work/log"})
	wantCat(t, err, errdefs.Conflict, `trajectory step 1 of session "s" does not match`)
	if !strings.Contains(err.Error(), `shell: recorded "mkdir -p /work && echo line-0`) {
		t.Fatalf("mismatch does not say what differs: %v", err)
	}
	_, err = e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "mm", SessionId: "s", Seq: 2, Path: "/work/notes", Content: []byte("other\n"), Append: true})
	wantCat(t, err, errdefs.Conflict, "payload: recorded 7 bytes")
	// A write where an exec was recorded.
	_, err = e.m.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: "mm", SessionId: "s", Seq: 1, Path: "/x"})
	wantCat(t, err, errdefs.Conflict, "recorded exec")
	if res := e.sh("mm", "cat /work/log /work/notes; ls /x 2>&1"); !strings.HasPrefix(string(res.GetStdout()), "line-0\nnote 0\n") || strings.Contains(string(res.GetStdout()), "diverged") {
		t.Fatalf("a mismatch ran something: %q", res.GetStdout())
	}
	if v := metricValue(t, e.metrics.TrajectoryMismatches); v != 3 {
		t.Fatalf("mismatch metric %v", v)
	}
}

// File writes, mkdir, remove, uploads and streamed execs are replayed as
// well; failures are recorded and replayed with their category; the log
// exports every step in order; the log is gone after delete.
func TestTrajectoryFilesExportAndDelete(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "files"})
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	tw.WriteHeader(&tar.Header{Name: "up.txt", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
	tw.Write([]byte("up\n"))
	tw.Close()
	var streamed []string
	calls := func() (replayed []bool) {
		mk, err := e.m.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: "files", SessionId: "f", Seq: 1, Path: "/d"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.m.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: "files", SessionId: "f", Seq: 2, Path: "/d"})
		wantCat(t, err, errdefs.Conflict, "/d")
		if !errdefs.IsAlreadyExists(err) {
			t.Fatalf("mkdir of an existing dir: %v", err)
		}
		wf, err := e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: "files", SessionId: "f", Seq: 3, Path: "/d/a", Content: []byte("a\n"), Append: true})
		if err != nil {
			t.Fatal(err)
		}
		seq, rep, err := e.m.TarInStep(ctx, "files", "/d", "f", 4, bytes.NewReader(tarBuf.Bytes()))
		if err != nil || seq != 4 {
			t.Fatal(seq, err)
		}
		rm, err := e.m.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: "files", SessionId: "f", Seq: 5, Path: "/d/a"})
		if err != nil {
			t.Fatal(err)
		}
		streamed = streamed[:0]
		err = e.m.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "files", SessionId: "f", Seq: 6, Shell: "cat /d/up.txt; echo x >> /d/count"}, func(ev *warrenv1.ExecEvent) error {
			switch x := ev.GetEvent().(type) {
			case *warrenv1.ExecEvent_Stdout:
				streamed = append(streamed, string(x.Stdout))
			case *warrenv1.ExecEvent_Result:
				if x.Result.GetSeq() != 6 {
					t.Errorf("stream result %v", x.Result)
				}
				replayed = append(replayed, x.Result.GetReplayed())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return append(replayed, mk.GetReplayed(), wf.GetReplayed(), rep, rm.GetReplayed())
	}
	if r := calls(); fmt.Sprint(r) != "[false false false false false]" {
		t.Fatalf("first run replayed %v", r)
	}
	if r := calls(); fmt.Sprint(r) != "[true true true true true]" {
		t.Fatalf("second run replayed %v", r)
	}
	if strings.Join(streamed, "") != "up\n" {
		t.Fatalf("replayed stream %q", streamed)
	}
	if res := e.sh("files", "ls /d; cat /d/count"); string(res.GetStdout()) != "count\nup.txt\nx\n" {
		t.Fatalf("files after replay %q", res.GetStdout())
	}
	// An upload of another body under a recorded step is a mismatch.
	_, _, err := e.m.TarInStep(ctx, "files", "/d", "f", 4, strings.NewReader("not the same tar"))
	wantCat(t, err, errdefs.Conflict, "payload")

	// Export: the six steps of session f, then the unnumbered exec above.
	var ents []*warrenv1.TrajectoryEntry
	tok := ""
	for {
		page, err := e.m.ReadTrajectory(ctx, &warrenv1.ReadTrajectoryRequest{SandboxId: "files", PageSize: 2, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		ents = append(ents, page.GetEntries()...)
		if tok = page.GetNextPageToken(); tok == "" {
			if page.GetLogBytes() <= 0 || page.GetMaxBytes() != DefaultTrajectoryMaxBytes {
				t.Fatalf("log stats %v", page)
			}
			break
		}
	}
	var got []string
	for _, en := range ents {
		got = append(got, fmt.Sprintf("%s/%d/%s/%s", en.GetSessionId(), en.GetSeq(), en.GetMethod(), en.GetErrorCategory()))
	}
	want := "f/1/make_dir/ f/2/make_dir/already_exists f/3/write_file/ f/4/upload/ f/5/remove_file/ f/6/exec/ /1/exec/"
	if strings.Join(got, " ") != want {
		t.Fatalf("exported\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	if ents[5].GetExecResult().GetExitCode() != 0 || ents[2].GetPayloadBytes() != 2 || ents[0].GetRequestSha256() == "" || ents[0].GetStartedUnixMs() == 0 {
		t.Fatalf("entries %v", ents)
	}

	logPath := filepath.Join(e.dir, "state", trajDirName, "files.log")
	if _, err := os.Stat(logPath); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "files"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(logPath); !os.IsNotExist(err) {
		t.Fatalf("log left after delete: %v", err)
	}
	_, err = e.m.ReadTrajectory(ctx, &warrenv1.ReadTrajectoryRequest{SandboxId: "files"})
	wantCat(t, err, errdefs.NotFound, "files")
}

// A log whose sandbox record is gone (the daemon died between the two
// removals) is swept at the next start.
func TestTrajectoryOrphanSwept(t *testing.T) {
	e := newEnv(t)
	e.create(&warrenv1.CreateRequest{Id: "kept"})
	e.sh("kept", "true")
	e.stop()
	orphan := filepath.Join(e.dir, "state", trajDirName, "ghost.log")
	if err := os.WriteFile(orphan, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("orphan log kept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "state", trajDirName, "kept.log")); err != nil {
		t.Fatalf("live sandbox's log swept: %v", err)
	}
}

// A full log refuses numbered steps (nothing runs) and runs unnumbered
// calls unrecorded.
func TestTrajectoryCap(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TrajectoryMaxBytes = 1024 })
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "cap"})
	e.exec(&warrenv1.ExecRequest{SandboxId: "cap", Shell: "head -c 2000 /dev/zero | tr '\\0' x"})
	_, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "cap", SessionId: "s", Seq: 1, Shell: "echo ran > /ran"})
	wantCat(t, err, errdefs.Exhausted, "trajectory log is full")
	res := e.sh("cap", "cat /ran 2>/dev/null; echo end")
	if string(res.GetStdout()) != "end\n" || res.GetSeq() != 0 {
		t.Fatalf("after refusal %q seq %d", res.GetStdout(), res.GetSeq())
	}
	page, err := e.m.ReadTrajectory(ctx, &warrenv1.ReadTrajectoryRequest{SandboxId: "cap"})
	if err != nil || page.GetUnrecorded() != 1 || len(page.GetEntries()) != 1 {
		t.Fatalf("log %v %v", page, err)
	}
}

// A sandbox created with no_trajectory records nothing and refuses seqs.
func TestTrajectoryOffPerSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "off", NoTrajectory: true})
	if res := e.sh("off", "echo hi"); res.GetSeq() != 0 {
		t.Fatalf("recorded: %v", res)
	}
	_, err := e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "off", SessionId: "s", Seq: 1, Shell: "true"})
	wantCat(t, err, errdefs.Unsupported, "records no trajectory log")
	if _, err := os.Stat(filepath.Join(e.dir, "state", trajDirName, "off.log")); !os.IsNotExist(err) {
		t.Fatalf("log file of a sandbox without one: %v", err)
	}
}

// An exec cut short by the daemon stopping records its outcome before the
// log closes: after the restart its step is answered with a conflict that
// says it was cut short (it is not run again), not left interrupted.
func TestTrajectoryExecCutByCloseIsRecorded(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "cut"})
	req := &warrenv1.ExecRequest{SandboxId: "cut", SessionId: "s", Seq: 1, Shell: "echo ran >> /ran; sleep 1000"}
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Exec(ctx, req)
		done <- err
	}()
	eventually(t, 10*time.Second, "sleep to start", func() bool {
		ps := e.sh("cut", "cat /ran 2>/dev/null")
		return string(ps.GetStdout()) == "ran\n"
	})
	e.stop()
	wantCat(t, <-done, errdefs.Unavailable, "shutting down")
	e.start()
	_, err := e.m.Exec(ctx, req)
	wantCat(t, err, errdefs.Conflict, "cut short after it started")
	if res := e.sh("cut", "cat /ran"); string(res.GetStdout()) != "ran\n" {
		t.Fatalf("ran again: %q", res.GetStdout())
	}
}

// A retry of an unnumbered exec with its idempotency key is the same
// call: the first run's result, step number included, and no new step.
func TestTrajectoryIdempotentRetryIsOneStep(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "idem"})
	req := &warrenv1.ExecRequest{SandboxId: "idem", Shell: "echo run >> /c; wc -l < /c", IdempotencyKey: "k1"}
	r1 := e.exec(req)
	r2 := e.exec(req)
	if r1.GetSeq() != 1 || r2.GetSeq() != 1 || string(r2.GetStdout()) != "1\n" {
		t.Fatalf("retry %v, first %v", r2, r1)
	}
	page, err := e.m.ReadTrajectory(ctx, &warrenv1.ReadTrajectoryRequest{SandboxId: "idem"})
	if err != nil || len(page.GetEntries()) != 1 {
		t.Fatalf("log %v %v", page, err)
	}
}

// Without fdatasync the outcomes are still written before they are
// returned: a daemon restart replays them, and sync makes them durable.
func TestTrajectoryNoSyncSurvivesDaemonRestart(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TrajectoryNoSync = true })
	e.create(&warrenv1.CreateRequest{Id: "nosync"})
	if n := rollout(t, e.m, "nosync", "s", 2); n != 0 {
		t.Fatalf("first run replayed %d", n)
	}
	if err := e.m.traj.sync("nosync"); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.start()
	if n := rollout(t, e.m, "nosync", "s", 3); n != 4 {
		t.Fatalf("after restart replayed %d, want 4", n)
	}
	if res := e.sh("nosync", "cat /work/log"); string(res.GetStdout()) != "line-0\nline-1\nline-2\n" {
		t.Fatalf("file %q", res.GetStdout())
	}
}

// A paused sandbox answers its recorded steps from the log (nothing has
// to run) and refuses new ones as not run; after resume the refused step
// runs live.
func TestTrajectoryReplayWhilePaused(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "zz"})
	rollout(t, e.m, "zz", "s", 1)
	if _, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "zz"}); err != nil {
		t.Fatal(err)
	}
	if n := rollout(t, e.m, "zz", "s", 1); n != 2 {
		t.Fatalf("replayed %d while paused, want 2", n)
	}
	next := &warrenv1.ExecRequest{SandboxId: "zz", SessionId: "s", Seq: 3, Shell: "echo new >> /work/log"}
	_, err := e.m.Exec(ctx, next)
	wantCat(t, err, errdefs.Conflict, "PAUSED")
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "zz"}); err != nil {
		t.Fatal(err)
	}
	if res, err := e.m.Exec(ctx, next); err != nil || res.GetReplayed() || res.GetSeq() != 3 {
		t.Fatalf("after resume %v %v", res, err)
	}
	if res := e.sh("zz", "cat /work/log"); string(res.GetStdout()) != "line-0\nnew\n" {
		t.Fatalf("file %q", res.GetStdout())
	}
}

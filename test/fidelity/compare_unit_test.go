package fidelity

import (
	"slices"
	"strings"
	"testing"
)

// The comparison's own tests need no root and no network: they check
// that a sandbox-only failure fails the suite, that an exception excuses
// exactly what it names, and that a stale exception fails it too.

const sampleJUnit = `<testsuites tests="6" errors="1" failures="1">
<testsuite tests="3"><testcase name="test.test_os.A.test_ok" status="run" result="completed" time="0.1" />
<testcase name="test.test_os.A.test_inode" status="run" result="completed"><failure type="AssertionError" message="1 != 2">tb</failure></testcase>
<testcase name="test.test_os.A.test_skip" status="run" result="completed"><skipped>needs chflags</skipped></testcase></testsuite>
<testsuite tests="3"><testcase name="test.fork_wait.ForkWait.test_wait" status="run" result="completed" />
<testcase name="test.test_x.B.test_xfail" status="run" result="completed"><output type="AssertionError">expected</output></testcase>
<testcase name="test.test_x.B.test_err" status="run" result="completed"><error type="OSError">boom</error></testcase></testsuite>
<testsuite tests="1"><testcase name="test.fork_wait.ForkWait.test_wait" status="run" result="completed"><failure>x</failure></testcase>
<testcase name="test.test_x.B.test_lucky" status="run" result="completed"><outcome>UNEXPECTED_SUCCESS</outcome></testcase></testsuite>
</testsuites>`

func TestParseJUnit(t *testing.T) {
	got, err := parseJUnit(strings.NewReader(sampleJUnit))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]outcome{
		"test.test_os.A.test_ok":    passed,
		"test.test_os.A.test_inode": failed,
		"test.test_os.A.test_skip":  skipped,
		// test_wait3 and test_wait4 share this id: the worst counts.
		"test.fork_wait.ForkWait.test_wait": failed,
		"test.test_x.B.test_xfail":          passed,
		"test.test_x.B.test_err":            failed,
		"test.test_x.B.test_lucky":          failed,
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %v, want %v", id, got[id], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d cases, want %d: %v", len(got), len(want), got)
	}
	if _, err := parseJUnit(strings.NewReader("<testsuites><testsuite>")); err == nil {
		t.Error("truncated XML parsed")
	}
	secs, err := moduleSeconds(strings.NewReader(sampleJUnit))
	if err != nil || secs["test_os"] != 0.1 || len(secs) != 3 {
		t.Errorf("module seconds %v, %v", secs, err)
	}
}

func TestParseProgress(t *testing.T) {
	log := `0:00:03 load avg: 2.34 [ 9/92] test_os passed
0:01:48 load avg: 10.09 [43/92] test_ssl passed (37.9 sec) -- running: test_socket (55.7 sec)
0:03:40 load avg: 13.03 [57/92/2] test_sysconfig failed (3 failures) -- running: test_concurrent_futures (36.6 sec)
0:03:55 load avg: 10.88 [74/92/3] test_venv failed (uncaught exception) -- running: test_x (52.3 sec)
0:06:23 load avg: 1.43 [47/92/2] test_socket crashed (Exit code 1)
0:05:01 load avg: 3.10 [50/92/3] test_logging timed out (3 min) (3 min)
0:05:01 load avg: 3.10 [51/92/3] test_threading failed (env changed)
[52/92/3] test_socketserver skipped (resource denied)
[53/92/3] test_x ran no tests
test test_sysconfig failed -- multiple errors occurred
`
	mods, words, err := parseProgress(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]outcome{
		"test_os": passed, "test_ssl": passed, "test_sysconfig": failed, "test_venv": failed,
		"test_socket": failed, "test_logging": failed, "test_threading": passed,
		"test_socketserver": skipped, "test_x": skipped,
	}
	for m, w := range want {
		if mods[m] != w {
			t.Errorf("%s: %v, want %v", m, mods[m], w)
		}
	}
	if len(mods) != len(want) {
		t.Errorf("%d modules, want %d: %v", len(mods), len(want), mods)
	}
	if w := words["test_logging"]; w != "timed out (3 min) (3 min)" {
		t.Errorf("test_logging's words %q", w)
	}
}

func TestParseExceptions(t *testing.T) {
	exc, err := parseExceptions(strings.NewReader("# comment\n\ntest.test_os.A.test_inode  # overlay\ntest_socket # flaky: load\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(exc) != 2 || exc[0].id != "test.test_os.A.test_inode" || exc[0].reason != "overlay" || exc[0].flaky || !exc[1].flaky || exc[1].line != 4 {
		t.Fatalf("parsed %+v", exc)
	}
	for _, bad := range []string{"test_os\n", "test_os #\n", "a b # two ids\n", "x # r\nx # again\n"} {
		if _, err := parseExceptions(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCovers(t *testing.T) {
	for _, c := range []struct {
		e, d string
		want bool
	}{
		{"test_os", "test_os", true},
		{"test_os", "test.test_os.A.test_x", true},
		{"test_os", "test.test_ossaudiodev.A.b", false},
		{"test_os", "test_ossaudiodev", false},
		{"test.test_os.A", "test.test_os.A.test_x", true},
		{"test.test_os.A", "test.test_os.AB.test_x", false},
		{"test.test_os.A.test_x", "test.test_os.A.test_x", true},
		{"test.test_os.A.test_x", "test_os", false},
	} {
		if got := covers(c.e, c.d); got != c.want {
			t.Errorf("covers(%q, %q) = %v", c.e, c.d, got)
		}
	}
}

// TestCompare: a case or module that passed in the chroot and did not in
// the sandbox fails the suite unless excepted; absent (its module timed
// out) counts as not passed; an exception that excuses nothing is stale
// unless flaky; what failed in both or only in the chroot never fails it.
func TestCompare(t *testing.T) {
	chroot := results{
		modules: map[string]outcome{"test_os": passed, "test_logging": passed, "test_venv": failed, "test_pty": failed, "test_uuid": passed},
		cases: map[string]outcome{
			"test.test_os.A.ok": passed, "test.test_os.A.inode": passed, "test.test_os.A.skip": skipped,
			"test.test_logging.L.hosts": passed, "test.test_pty.P.x": failed, "test.test_venv.V.y": failed,
			"test.test_uuid.U.mac": passed,
		},
	}
	sandbox := results{
		modules:     map[string]outcome{"test_os": failed, "test_logging": failed, "test_venv": failed, "test_pty": passed, "test_uuid": passed},
		moduleWords: map[string]string{"test_logging": "timed out (3 min)"},
		cases: map[string]outcome{
			"test.test_os.A.ok": passed, "test.test_os.A.inode": failed, "test.test_os.A.skip": skipped,
			"test.test_pty.P.x": passed, "test.test_venv.V.y": failed,
			"test.test_uuid.U.mac": skipped,
		},
	}
	exc := []exception{
		{id: "test.test_uuid.U.mac", reason: "no NIC in the sandbox", line: 1},
		{id: "test.test_gone.G.x", reason: "fixed long ago", line: 2},
		{id: "test.test_maybe.M.x", reason: "flaky: load", flaky: true, line: 3},
	}
	r := compare(chroot, sandbox, exc)
	fails := r.failures()
	for _, want := range []string{
		"module test_os: passed in the chroot, failed in the sandbox",
		"module test_logging: passed in the chroot, timed out (3 min) in the sandbox",
		"test case test.test_os.A.inode: passed in the chroot, failed in the sandbox",
		"test case test.test_logging.L.hosts: passed in the chroot, absent in the sandbox",
		"test.test_gone.G.x (exceptions.txt:2): passes in the sandbox now, or did not run; remove it",
	} {
		if !slices.Contains(fails, want) {
			t.Errorf("missing failure %q in %q", want, fails)
		}
	}
	if len(fails) != 5 {
		t.Errorf("%d failures, want 5: %q", len(fails), fails)
	}
	if r.Cases.Excepted != 1 || r.Cases.SandboxOnly != 3 || r.Cases.BothPassed != 1 || r.Cases.BothFailed != 1 ||
		r.Cases.BothSkipped != 1 || r.Cases.ChrootOnly != 1 || r.Cases.ChrootPassed != 4 || r.Cases.SandboxPassed != 2 {
		t.Errorf("case counts %+v", r.Cases)
	}
	if r.Modules.SandboxOnly != 2 || r.Modules.ChrootOnly != 1 || r.Modules.BothFailed != 1 || r.Modules.BothPassed != 1 {
		t.Errorf("module counts %+v", r.Modules)
	}
	if !slices.Equal(r.FailedBoth, []string{"test_venv"}) {
		t.Errorf("failed in both: %v", r.FailedBoth)
	}
	// With the differences fixed, nothing fails but the stale exception.
	r = compare(chroot, chroot, exc[1:2])
	if f := r.failures(); len(f) != 1 || !strings.Contains(f[0], "test.test_gone.G.x") {
		t.Errorf("identical runs: %q", f)
	}
	if f := compare(chroot, chroot, nil).failures(); len(f) != 0 {
		t.Errorf("identical runs without exceptions: %q", f)
	}
}

// TestExceptionsFile: the committed list parses, every entry with a
// reason and listed once.
func TestExceptionsFile(t *testing.T) {
	if exc := readExceptions(t); len(exc) == 0 {
		t.Log("exceptions.txt lists nothing")
	}
}

// TestRerun: only unexcused sandbox-only failures of known modules are
// re-run; one that passes alone stops failing the suite, one that fails
// again still does.
func TestRerun(t *testing.T) {
	chroot := results{modules: map[string]outcome{"test_os": passed, "test_time": passed}, cases: map[string]outcome{
		"test.test_os.A.flaky": passed, "test.test_os.A.broken": passed, "test.test_os.A.skip": passed,
		"test.test_time.T.excused": passed, "test.fork_wait.ForkWait.test_wait": passed,
	}}
	sandbox := results{modules: map[string]outcome{"test_os": failed, "test_time": passed}, cases: map[string]outcome{
		"test.test_os.A.flaky": failed, "test.test_os.A.broken": failed, "test.test_os.A.skip": skipped,
		"test.test_time.T.excused": failed, "test.fork_wait.ForkWait.test_wait": failed,
	}}
	r := compare(chroot, sandbox, []exception{{id: "test.test_time.T.excused", reason: "r"}})
	ids, mods := r.rerunIDs([]string{"test_os", "test_time", "test_wait3"})
	if !slices.Equal(ids, []string{"test.test_os.A.broken", "test.test_os.A.flaky"}) || !slices.Equal(mods, []string{"test_os"}) {
		t.Fatalf("re-run %v of %v", ids, mods)
	}
	r.applyRerun(map[string]outcome{"test.test_os.A.flaky": passed, "test.test_os.A.broken": failed})
	fails := r.failures()
	want := []string{
		"module test_os: passed in the chroot, failed in the sandbox",
		"test case test.fork_wait.ForkWait.test_wait: passed in the chroot, failed in the sandbox",
		"test case test.test_os.A.broken: passed in the chroot, failed in the sandbox",
		"test case test.test_os.A.skip: passed in the chroot, skipped in the sandbox",
	}
	slices.Sort(fails)
	if !slices.Equal(fails, want) {
		t.Errorf("failures %q, want %q", fails, want)
	}
	if r.Cases.PassedOnRerun != 1 {
		t.Errorf("passed on re-run: %d", r.Cases.PassedOnRerun)
	}
}

// TestCompareModuleExcusedByItsCases: a module that failed in the sandbox
// only through test cases that are all excepted is excused with them; one
// unexcepted failing case, or a crash, keeps the module a failure.
func TestCompareModuleExcusedByItsCases(t *testing.T) {
	chroot := results{
		modules: map[string]outcome{"test_posix": passed, "test_os": passed, "test_pty": passed},
		cases: map[string]outcome{
			"test.test_posix.P.chown": passed, "test.test_posix.P.ok": passed,
			"test.test_os.O.chown": passed, "test.test_os.O.other": passed,
			"test.test_pty.T.chown": passed,
		},
	}
	sandbox := results{
		modules:     map[string]outcome{"test_posix": failed, "test_os": failed, "test_pty": failed},
		moduleWords: map[string]string{"test_posix": "failed (1 error)", "test_os": "failed (2 errors)", "test_pty": "crashed (Exit code 1)"},
		cases: map[string]outcome{
			"test.test_posix.P.chown": failed, "test.test_posix.P.ok": passed,
			"test.test_os.O.chown": failed, "test.test_os.O.other": failed,
			"test.test_pty.T.chown": failed,
		},
	}
	exc := []exception{
		{id: "test.test_posix.P.chown", reason: "user namespace", line: 1},
		{id: "test.test_os.O.chown", reason: "user namespace", line: 2},
		{id: "test.test_pty.T.chown", reason: "user namespace", line: 3},
	}
	fails := compare(chroot, sandbox, exc).failures()
	want := []string{
		"module test_os: passed in the chroot, failed (2 errors) in the sandbox",
		"test case test.test_os.O.other: passed in the chroot, failed in the sandbox",
		"module test_pty: passed in the chroot, crashed (Exit code 1) in the sandbox",
	}
	slices.Sort(fails)
	slices.Sort(want)
	if !slices.Equal(fails, want) {
		t.Errorf("failures %q, want %q", fails, want)
	}
}

package fidelity

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/testutil"
)

const (
	imageName = "debian"
	layerName = "py311-testsuite"
	// sideTimeout bounds one side's regrtest run: the modules' own
	// timeouts make a hang a failure long before it.
	sideTimeout = 12 * time.Minute
	// minChrootPassed keeps the suite from passing vacuously: a chroot
	// side that broke (no python, no tests found) passes few modules,
	// and there would be nothing to compare. 84 of the 89 modules pass
	// there.
	minChrootPassed = 50
)

// TestFidelity: every CPython regression test case (and module) that
// passes in a plain unshare+chroot of the default Debian image's files
// passes in a Warren sandbox of that image, unless exceptions.txt lists
// it with its reason; an exception that no longer differs is stale and
// fails the test too. The counts are printed and written as JSON (see
// outDir).
func TestFidelity(t *testing.T) {
	if v := os.Getenv("WARREN_FIDELITY"); v == "skip" || v == "0" {
		t.Skip("WARREN_FIDELITY=" + v + ": fidelity suite skipped")
	}
	testutil.RequireRoot(t)
	exc := readExceptions(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	start := time.Now()

	in := prepare(t, ctx)
	for _, l := range in.log {
		t.Log(l)
	}
	prepared := time.Since(start)

	d := startDaemon(t)
	if _, err := d.c.ImportImage(ctx, imageName, in.rootfs); err != nil {
		t.Fatalf("import the Debian tree as image %s: %v", imageName, err)
	}
	if _, err := d.c.BuildLayer(ctx, layerName, in.layer); err != nil {
		t.Fatalf("build layer %s from %s: %v", layerName, in.layer, err)
	}
	root := chrootDir(t, in)
	if err := makeChroot(ctx, in, root); err != nil {
		t.Fatal(err)
	}
	setUp := time.Since(start)

	// Both sides at once (see workers).
	var chroot, sandbox *sideResult
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); chroot = runChroot(ctx, root) }()
	go func() { defer wg.Done(); sandbox = runSandbox(ctx, d.c, imageName, layerName, sideTimeout) }()
	wg.Wait()

	out := outDir(t)
	for _, s := range []*sideResult{chroot, sandbox} {
		_ = os.WriteFile(filepath.Join(out, s.name+".log"), s.output, 0o644)
		_ = os.WriteFile(filepath.Join(out, s.name+".xml"), s.junit, 0o644)
		if s.err != nil {
			t.Fatalf("%s side: %v\n%s", s.name, s.err, tail(string(s.output), 3000))
		}
		t.Logf("%s: regrtest exit %d in %v", s.name, s.exit, s.duration.Round(time.Second))
	}
	cr, err := chroot.parse()
	if err != nil {
		t.Fatal(err)
	}
	sr, err := sandbox.parse()
	if err != nil {
		t.Fatal(err)
	}
	rep := compare(cr, sr, exc)
	if ids, mods := rep.rerunIDs(modules); len(ids) > 0 {
		rerun, rout, err := rerunSandbox(ctx, d.c, ids, mods)
		_ = os.WriteFile(filepath.Join(out, "sandbox-rerun.log"), rout, 0o644)
		if err != nil {
			t.Errorf("re-run of %d sandbox-only failures: %v", len(ids), err)
		} else {
			rep.applyRerun(rerun)
		}
	}
	rep.Timing = timing{
		PrepareSeconds: prepared.Seconds(), SetUpSeconds: setUp.Seconds(),
		ChrootSeconds: chroot.duration.Seconds(), SandboxSeconds: sandbox.duration.Seconds(),
		TotalSeconds: time.Since(start).Seconds(), Workers: workers, ModuleTimeoutSeconds: moduleTimeout.Seconds(),
	}
	rep.Python = in.python
	rep.Seconds = map[string]sides{}
	cs, _ := moduleSeconds(bytes.NewReader(chroot.junit))
	ss, _ := moduleSeconds(bytes.NewReader(sandbox.junit))
	for m, v := range cs {
		rep.Seconds[m] = sides{Chroot: v, Sandbox: ss[m]}
	}
	for m, v := range ss {
		rep.Seconds[m] = sides{Chroot: cs[m], Sandbox: v}
	}
	rep.ModuleList = modules

	var text bytes.Buffer
	fmt.Fprintf(&text, "fidelity: %d modules, python3.11 %s, %d workers a side; chroot %v, sandbox %v, total %v\n",
		len(modules), in.python, workers, chroot.duration.Round(time.Second), sandbox.duration.Round(time.Second), time.Since(start).Round(time.Second))
	rep.table(&text)
	rep.details(&text)
	rep.slowest(&text, 12)
	_ = os.WriteFile(filepath.Join(out, "report.txt"), text.Bytes(), 0o644)
	if err := rep.writeJSON(filepath.Join(out, "report.json")); err != nil {
		t.Error(err)
	}
	t.Logf("\n%s(logs, JUnit XML and report.json in %s)", text.String(), out)

	if rep.Modules.ChrootPassed < minChrootPassed {
		t.Errorf("only %d modules passed in the chroot (want >= %d): the reference side is broken, nothing was compared", rep.Modules.ChrootPassed, minChrootPassed)
	}
	for _, f := range rep.failures() {
		t.Error(f)
	}
	if ms, _ := mountinfo.Under(root); len(ms) > 0 {
		t.Errorf("the chroot's mount namespace left %d mounts below %s", len(ms), root)
	}
}

// readExceptions reads exceptions.txt next to this file.
func readExceptions(t *testing.T) []exception {
	t.Helper()
	b, err := os.ReadFile("exceptions.txt")
	if err != nil {
		t.Fatal(err)
	}
	exc, err := parseExceptions(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return exc
}

// chrootDir makes the chroot's directory in the inputs' cache directory
// (the same filesystem, so cp can reflink where it supports that; the
// run holds its lock) and removes it at the end. What an earlier run that
// was killed left there is removed first.
func chrootDir(t *testing.T, in *inputs) string {
	t.Helper()
	old, _ := filepath.Glob(filepath.Join(in.dir, "chroot-*"))
	for _, o := range old {
		removeUnmounted(t, o)
	}
	dir, err := os.MkdirTemp(in.dir, "chroot-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeUnmounted(t, dir) })
	return dir
}

// removeUnmounted removes dir unless something is mounted below it
// (never remove through a mount).
func removeUnmounted(t *testing.T, dir string) {
	if ms, _ := mountinfo.Under(dir); len(ms) > 0 {
		t.Errorf("not removing %s: %d mounts below it", dir, len(ms))
		return
	}
	_ = os.RemoveAll(dir)
}

// outDir is where the logs, XML and report go: WARREN_FIDELITY_OUT, else
// <cache>/last (the previous run's are replaced).
func outDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("WARREN_FIDELITY_OUT")
	if dir == "" {
		dir = filepath.Join(cacheDir(), "last")
		_ = os.RemoveAll(dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

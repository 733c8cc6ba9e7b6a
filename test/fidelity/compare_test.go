package fidelity

import (
	"bufio"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
)

// outcome is what one test case or module did in one run. The order
// matters: a test id that occurs more than once in a run (test_wait3 and
// test_wait4 both report test.fork_wait.ForkWait.test_wait) keeps its
// worst outcome.
type outcome int

const (
	absent  outcome = iota // not reported: its module crashed, timed out or did not import
	passed                 // passed, or an expected failure
	skipped                // skipped, or a module that ran no tests
	failed                 // failed, errored, unexpected success, crashed, timed out
)

func (o outcome) String() string {
	return [...]string{"absent", "passed", "skipped", "failed"}[o]
}

func (o outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// results is one side's run: regrtest's verdict per module (from its
// progress lines) and per test case (from its JUnit XML).
type results struct {
	modules map[string]outcome
	// moduleWords keeps regrtest's own words ("timed out (5 min)",
	// "failed (env changed)") for the report.
	moduleWords map[string]string
	cases       map[string]outcome
}

type junitCase struct {
	Name    string    `xml:"name,attr"`
	Time    float64   `xml:"time,attr"`
	Error   *struct{} `xml:"error"`
	Failure *struct{} `xml:"failure"`
	Skipped *struct{} `xml:"skipped"`
	Outcome string    `xml:"outcome"` // UNEXPECTED_SUCCESS
}

type junitSuites struct {
	Suites []struct {
		Cases []junitCase `xml:"testcase"`
	} `xml:"testsuite"`
}

// parseJUnit reads the JUnit XML of `python3 -m test --junit-xml` into
// test id -> outcome. A test case element without a name (regrtest
// leaves one when only a subtest failed) is counted under
// "<unnamed>" as a failure: the module's own verdict names it.
func parseJUnit(r io.Reader) (map[string]outcome, error) {
	var doc junitSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("parse JUnit XML: %w", err)
	}
	out := map[string]outcome{}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			o := passed
			switch {
			case c.Error != nil || c.Failure != nil || c.Outcome != "":
				o = failed
			case c.Skipped != nil:
				o = skipped
			}
			name := c.Name
			if name == "" {
				name, o = "<unnamed>", failed
			}
			out[name] = max(out[name], o)
		}
	}
	return out, nil
}

// moduleSeconds sums the test cases' times of a JUnit XML by module
// (the second part of the id: test.test_os.X.y is test_os; a helper
// module shared by two test modules, as test.fork_wait, is its own). It
// leaves out imports and class set-ups: a measure of where the time goes,
// not of wall time.
func moduleSeconds(r io.Reader) (map[string]float64, error) {
	var doc junitSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("parse JUnit XML: %w", err)
	}
	out := map[string]float64{}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			m := c.Name
			if parts := strings.Split(c.Name, "."); len(parts) > 2 && parts[0] == "test" {
				m = parts[1]
			}
			out[m] += c.Time
		}
	}
	return out, nil
}

// progressRe matches regrtest's progress lines, e.g.
//
//	0:01:48 load avg: 10.09 [43/92] test_ssl passed (37.9 sec) -- running: ...
//	0:05:01 load avg: 3.10 [50/92/3] test_logging timed out (5 min) (5 min)
var progressRe = regexp.MustCompile(`\[\s*\d+/\d+(?:/\d+)?\] (test_\w+) (passed|failed|skipped|crashed|timed out|interrupted|ran no tests)(.*?)(?: -- running: .*)?$`)

// parseProgress reads regrtest's output into module -> outcome and
// module -> regrtest's words. "failed (env changed)" (a test left a
// thread, a file or a changed setting behind) counts as passed: the test
// cases themselves passed, and regrtest exits 0 for it by default.
func parseProgress(r io.Reader) (map[string]outcome, map[string]string, error) {
	mods, words := map[string]outcome{}, map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := progressRe.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		name, verdict, rest := m[1], m[2], strings.TrimSpace(m[3])
		o := failed
		switch {
		case verdict == "passed", verdict == "failed" && strings.HasPrefix(rest, "(env changed)"):
			o = passed
		case verdict == "skipped", verdict == "ran no tests":
			o = skipped
		}
		mods[name] = o
		words[name] = strings.TrimSpace(verdict + " " + rest)
	}
	return mods, words, sc.Err()
}

// exception is one line of exceptions.txt: a test id, class or module
// that may fail in the sandbox although it passes in the chroot.
type exception struct {
	id     string
	reason string
	// flaky exceptions (reason "flaky: ...") are not stale when the test
	// passes.
	flaky bool
	line  int
}

// parseExceptions reads "ID  # reason" lines; blank lines and lines that
// start with # are comments. Every exception needs a reason.
func parseExceptions(r io.Reader) ([]exception, error) {
	var out []exception
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, reason, ok := strings.Cut(line, "#")
		id, reason = strings.TrimSpace(id), strings.TrimSpace(reason)
		if !ok || reason == "" {
			return nil, fmt.Errorf("exceptions.txt:%d: %q has no reason (format: ID  # reason)", n, line)
		}
		if strings.ContainsAny(id, " \t") {
			return nil, fmt.Errorf("exceptions.txt:%d: %q is not one test id", n, id)
		}
		if prev, dup := seen[id]; dup {
			return nil, fmt.Errorf("exceptions.txt:%d: %s is already listed on line %d", n, id, prev)
		}
		seen[id] = n
		out = append(out, exception{id: id, reason: reason, flaky: strings.HasPrefix(reason, "flaky:"), line: n})
	}
	return out, sc.Err()
}

// covers reports whether exception id e covers a difference of test id or
// module name d. A module name (test_os) covers the module and every test
// case in it (test.test_os.*); a dotted id covers itself and what is below
// it (a class covers its methods).
func covers(e, d string) bool {
	if e == d {
		return true
	}
	if !strings.Contains(e, ".") {
		e = "test." + e
	}
	return d == e || strings.HasPrefix(d, e+".")
}

// difference is one module or test case that did not pass in the sandbox
// although it passed in the chroot (or the reverse).
type difference struct {
	ID        string  `json:"id"`
	Module    bool    `json:"module,omitempty"`
	Chroot    outcome `json:"chroot"`
	Sandbox   outcome `json:"sandbox"`
	Words     string  `json:"regrtest,omitempty"` // regrtest's verdict in the sandbox, for modules
	Exception string  `json:"exception,omitempty"`
	// Rerun is the outcome of the one re-run in the sandbox of a
	// sandbox-only failure without an exception (see rerunIDs).
	Rerun outcome `json:"rerun,omitempty"`
}

// counts tallies one level (modules or test cases) of a comparison.
type counts struct {
	ChrootPassed   int `json:"chroot_passed"`
	ChrootFailed   int `json:"chroot_failed"`
	ChrootSkipped  int `json:"chroot_skipped"`
	SandboxPassed  int `json:"sandbox_passed"`
	SandboxFailed  int `json:"sandbox_failed"`
	SandboxSkipped int `json:"sandbox_skipped"`
	BothPassed     int `json:"both_passed"`
	BothFailed     int `json:"both_failed"`
	BothSkipped    int `json:"both_skipped"`
	SandboxOnly    int `json:"sandbox_only_failures"` // passed in the chroot only
	Excepted       int `json:"excepted"`              // of those, listed in exceptions.txt
	PassedOnRerun  int `json:"passed_on_rerun"`       // of the others, passed when run again alone
	ChrootOnly     int `json:"chroot_only_failures"`  // passed in the sandbox only
}

// report is the comparison of the two runs.
type report struct {
	Python      string       `json:"python"`
	ModuleList  []string     `json:"module_list"`
	Timing      timing       `json:"timing"`
	Modules     counts       `json:"modules"`
	Cases       counts       `json:"test_cases"`
	SandboxOnly []difference `json:"sandbox_only"` // excepted or not
	ChrootOnly  []difference `json:"chroot_only"`
	Stale       []string     `json:"stale_exceptions,omitempty"`
	FailedBoth  []string     `json:"failed_both_modules,omitempty"`
	// Seconds are the test cases' summed times per module on each side.
	Seconds   map[string]sides `json:"module_seconds,omitempty"`
	unexcused []difference     // sandbox-only differences without an exception
}

// sides is one number for each side.
type sides struct {
	Chroot  float64 `json:"chroot"`
	Sandbox float64 `json:"sandbox"`
}

// slowest writes the n modules that took longest on either side.
func (r *report) slowest(w io.Writer, n int) {
	var ms []string
	for m := range r.Seconds {
		ms = append(ms, m)
	}
	longer := func(m string) float64 { return max(r.Seconds[m].Chroot, r.Seconds[m].Sandbox) }
	sort.Slice(ms, func(i, j int) bool { return longer(ms[i]) > longer(ms[j]) })
	if len(ms) > n {
		ms = ms[:n]
	}
	fmt.Fprintf(w, "slowest modules (test cases' seconds, chroot / sandbox):")
	for _, m := range ms {
		fmt.Fprintf(w, " %s %.0f/%.0f", m, r.Seconds[m].Chroot, r.Seconds[m].Sandbox)
	}
	fmt.Fprintln(w)
}

// timing is where the run's time went.
type timing struct {
	PrepareSeconds       float64 `json:"prepare_seconds"` // debootstrap and the .debs, or the cache
	SetUpSeconds         float64 `json:"set_up_seconds"`  // + daemon, image import, layer, chroot copy
	ChrootSeconds        float64 `json:"chroot_seconds"`
	SandboxSeconds       float64 `json:"sandbox_seconds"`
	TotalSeconds         float64 `json:"total_seconds"`
	Workers              int     `json:"workers_per_side"`
	ModuleTimeoutSeconds float64 `json:"module_timeout_seconds"`
}

// compare compares the chroot's run with the sandbox's. A module or test
// case that passed in the chroot and did anything else in the sandbox
// (failed, was skipped, or is absent because its module crashed or timed
// out) is a sandbox-only difference; it fails the suite unless an
// exception covers it. An exception that covers no difference is stale
// (unless flaky): the test passes now and the entry must go.
func compare(chroot, sandbox results, exc []exception) *report {
	r := &report{}
	used := map[string]bool{}
	// casesExcused says whether module m failed (not crashed or timed
	// out) in the sandbox with at least one sandbox-only test case, every
	// one of them excepted: what failed is what the exceptions name.
	casesExcused := func(m string) bool {
		if !strings.HasPrefix(sandbox.moduleWords[m], "failed") {
			return false
		}
		n := 0
		for _, d := range r.SandboxOnly {
			if !d.Module && covers(m, d.ID) {
				if d.Exception == "" {
					return false
				}
				n++
			}
		}
		return n > 0
	}
	classify := func(c *counts, id string, module bool, co, so outcome) {
		tally(c, co, so)
		d := difference{ID: id, Module: module, Chroot: co, Sandbox: so}
		if module {
			d.Words = sandbox.moduleWords[id]
		}
		switch {
		case co == passed && so != passed:
			c.SandboxOnly++
			for _, e := range exc {
				if covers(e.id, id) {
					d.Exception = e.reason
					used[e.id] = true
					break
				}
			}
			if d.Exception == "" && module && casesExcused(id) {
				d.Exception = "every test case of it that fails in the sandbox is excepted"
			}
			if d.Exception != "" {
				c.Excepted++
			} else {
				r.unexcused = append(r.unexcused, d)
			}
			r.SandboxOnly = append(r.SandboxOnly, d)
		case so == passed && co != passed:
			c.ChrootOnly++
			r.ChrootOnly = append(r.ChrootOnly, d)
		}
	}
	// Cases first: a module that failed only through test cases that are
	// all excepted is excused with them (casesExcused).
	for _, id := range union(chroot.cases, sandbox.cases) {
		classify(&r.Cases, id, false, chroot.cases[id], sandbox.cases[id])
	}
	for _, m := range union(chroot.modules, sandbox.modules) {
		co, so := chroot.modules[m], sandbox.modules[m]
		classify(&r.Modules, m, true, co, so)
		if co == failed && so == failed {
			r.FailedBoth = append(r.FailedBoth, m)
		}
	}
	for _, e := range exc {
		if !used[e.id] && !e.flaky {
			r.Stale = append(r.Stale, fmt.Sprintf("%s (exceptions.txt:%d): passes in the sandbox now, or did not run; remove it", e.id, e.line))
		}
	}
	return r
}

func tally(c *counts, co, so outcome) {
	switch co {
	case passed:
		c.ChrootPassed++
	case failed:
		c.ChrootFailed++
	case skipped:
		c.ChrootSkipped++
	}
	switch so {
	case passed:
		c.SandboxPassed++
	case failed:
		c.SandboxFailed++
	case skipped:
		c.SandboxSkipped++
	}
	switch {
	case co == passed && so == passed:
		c.BothPassed++
	case co == failed && so == failed:
		c.BothFailed++
	case co == skipped && so == skipped:
		c.BothSkipped++
	}
}

func union(a, b map[string]outcome) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// maxRerun bounds the re-run: more sandbox-only failures than this are
// no flakes, and re-running them would only cost time.
const maxRerun = 30

// rerunIDs lists the sandbox-only test cases that failed (not skipped:
// a skip is decided by the environment, not by timing) without an
// exception, with their modules, for one re-run alone in the sandbox. A
// timing-sensitive test can fail when both sides share the two cores;
// one that passes alone is reported as flaky and does not fail the
// suite. Test cases whose module cannot be told from the id (a shared
// helper module's, as test.fork_wait.*) and modules that crashed or timed
// out are not re-run: a module's time-out already cost minutes.
func (r *report) rerunIDs(known []string) (ids, mods []string) {
	seen := map[string]bool{}
	for _, d := range r.unexcused {
		if d.Module || d.Sandbox != failed {
			continue
		}
		parts := strings.Split(d.ID, ".")
		if len(parts) < 3 || parts[0] != "test" || !slices.Contains(known, parts[1]) {
			continue
		}
		ids = append(ids, d.ID)
		if !seen[parts[1]] {
			seen[parts[1]] = true
			mods = append(mods, parts[1])
		}
	}
	if len(ids) > maxRerun {
		return nil, nil
	}
	return ids, mods
}

// applyRerun records the re-run's outcomes: a test case that passed
// alone leaves the failures (it counts as passed on a re-run).
func (r *report) applyRerun(rerun map[string]outcome) {
	var still []difference
	for _, d := range r.unexcused {
		o, ran := rerun[d.ID]
		if !d.Module && ran {
			d.Rerun = o
			for i := range r.SandboxOnly {
				if r.SandboxOnly[i].ID == d.ID && !r.SandboxOnly[i].Module {
					r.SandboxOnly[i].Rerun = o
				}
			}
			if o == passed {
				r.Cases.PassedOnRerun++
				continue
			}
		}
		still = append(still, d)
	}
	r.unexcused = still
}

// failures lists what fails the suite: unexcused sandbox-only differences
// and stale exceptions.
func (r *report) failures() []string {
	var out []string
	for _, d := range r.unexcused {
		kind := "test case"
		if d.Module {
			kind = "module"
		}
		what := d.Sandbox.String()
		if d.Words != "" {
			what = d.Words
		}
		out = append(out, fmt.Sprintf("%s %s: passed in the chroot, %s in the sandbox", kind, d.ID, what))
	}
	return append(out, r.Stale...)
}

// table writes the counts as a table.
func (r *report) table(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tmodules\ttest cases\t")
	row := func(name string, f func(c counts) int) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t\n", name, f(r.Modules), f(r.Cases))
	}
	row("passed in the chroot", func(c counts) int { return c.ChrootPassed })
	row("passed in the sandbox", func(c counts) int { return c.SandboxPassed })
	row("passed in both", func(c counts) int { return c.BothPassed })
	row("skipped in both", func(c counts) int { return c.BothSkipped })
	row("failed in both", func(c counts) int { return c.BothFailed })
	row("sandbox-only failures", func(c counts) int { return c.SandboxOnly })
	row("  of which excepted", func(c counts) int { return c.Excepted })
	row("  passed on a re-run", func(c counts) int { return c.PassedOnRerun })
	row("chroot-only failures", func(c counts) int { return c.ChrootOnly })
	tw.Flush()
}

// details writes every difference, one a line.
func (r *report) details(w io.Writer) {
	for _, d := range r.SandboxOnly {
		why := "NOT EXCEPTED"
		switch {
		case d.Exception != "":
			why = "excepted: " + d.Exception
		case d.Rerun == passed:
			why = "flaky: passed on a re-run alone"
		case d.Rerun != absent:
			why = "NOT EXCEPTED, " + d.Rerun.String() + " again on a re-run"
		}
		fmt.Fprintf(w, "sandbox-only  %-70s chroot %-7s sandbox %-7s %s %s\n", d.ID, d.Chroot, d.Sandbox, d.Words, why)
	}
	for _, d := range r.ChrootOnly {
		fmt.Fprintf(w, "chroot-only   %-70s chroot %-7s sandbox %s\n", d.ID, d.Chroot, d.Sandbox)
	}
	if len(r.FailedBoth) > 0 {
		fmt.Fprintf(w, "modules failed in both: %s\n", strings.Join(r.FailedBoth, " "))
	}
	for _, s := range r.Stale {
		fmt.Fprintf(w, "stale exception: %s\n", s)
	}
}

// writeJSON writes the report as indented JSON to path.
func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

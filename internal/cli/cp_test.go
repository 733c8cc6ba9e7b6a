package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenrl/warren/client"
)

// Issue #18 case 3 through the CLI: a symlink a sandbox planted in an
// earlier copy is never written through by a later copy, and the masks and
// budgets of copies out show up in flags, exit codes and the warning line.
func TestCopyOutTreatsTheTreeAsHostile(t *testing.T) {
	f, addr := startDaemon(t)
	hostDir := t.TempDir()
	target := filepath.Join(hostDir, "host-file")
	os.WriteFile(target, []byte("host"), 0o644)
	os.MkdirAll(filepath.Join(f.root, "out"), 0o755)
	os.MkdirAll(filepath.Join(f.root, "final"), 0o755)
	os.Symlink(target, filepath.Join(f.root, "out", "report.txt"))
	os.WriteFile(filepath.Join(f.root, "out", "tool"), []byte("#!"), 0o755)
	os.Chmod(filepath.Join(f.root, "out", "tool"), os.ModeSetuid|0o777)
	os.WriteFile(filepath.Join(f.root, "final", "report.txt"), []byte("pwned"), 0o644)

	dl := t.TempDir()
	r := run(t, addr, "", "sandbox", "cp", "sb1:/out", dl)
	if r.code == 0 || !strings.Contains(r.stderr, "--symlinks-as-is") {
		t.Fatalf("cp of a tree with an absolute symlink: %+v", r)
	}
	if _, err := os.Lstat(filepath.Join(dl, "out")); !os.IsNotExist(err) {
		t.Fatalf("refused copy left %v", err)
	}
	r = run(t, addr, "", "sandbox", "cp", "--symlinks-as-is", "sb1:/out", dl)
	if r.code != 0 {
		t.Fatalf("cp out: %+v", r)
	}
	if !strings.Contains(r.stderr, "stripped setuid/setgid/sticky bits from 1 entries") {
		t.Errorf("no warning about the setuid bit: %q", r.stderr)
	}
	if fi, _ := os.Lstat(filepath.Join(dl, "out", "tool")); fi == nil || fi.Mode() != 0o755 {
		t.Errorf("tool mode %v", fi)
	}
	r = run(t, addr, "", "sandbox", "cp", "sb1:/final/report.txt", filepath.Join(dl, "out", "report.txt"))
	if r.code == 0 || !strings.Contains(r.stderr, "invalid: ") || !strings.Contains(r.stderr, "realpath") {
		t.Fatalf("second cp through the planted link: %+v", r)
	}
	r = run(t, addr, "", "sandbox", "cp", "sb1:/final", filepath.Join(dl, "out", "report.txt"))
	if r.code == 0 {
		t.Fatalf("tree cp through the planted link: %+v", r)
	}
	if b, _ := os.ReadFile(target); string(b) != "host" {
		t.Fatalf("host file now %q", b)
	}

	// Budgets: exceeded is exhausted and leaves nothing; 0 lifts them.
	r = run(t, addr, "", "sandbox", "cp", "--max-bytes", "3", "sb1:/final", filepath.Join(dl, "b"))
	if r.code == 0 || !strings.Contains(r.stderr, "exhausted: ") || !strings.Contains(r.stderr, "--max-bytes") {
		t.Fatalf("over --max-bytes: %+v", r)
	}
	if _, err := os.Lstat(filepath.Join(dl, "b")); !os.IsNotExist(err) {
		t.Fatalf("partial copy left: %v", err)
	}
	if r = run(t, addr, "", "sandbox", "cp", "--max-bytes", "0", "--max-entries", "0", "sb1:/final", filepath.Join(dl, "b")); r.code != 0 {
		t.Fatalf("no limits: %+v", r)
	}
	if r = run(t, addr, "", "sandbox", "cp", "--max-bytes", "lots", "sb1:/final", dl); r.code == 0 {
		t.Fatalf("bad --max-bytes accepted")
	}
	// --preserve keeps the bits.
	if r = run(t, addr, "", "sandbox", "cp", "--preserve", "sb1:/out/tool", filepath.Join(dl, "tool")); r.code != 0 {
		t.Fatalf("preserve: %+v", r)
	}
	if fi, _ := os.Lstat(filepath.Join(dl, "tool")); fi == nil || fi.Mode() != os.ModeSetuid|0o777 {
		t.Errorf("preserved mode %v", fi)
	}
}

func TestSkippedWarning(t *testing.T) {
	if w := skippedWarning(&client.DownloadStats{}); w != "" {
		t.Errorf("nothing skipped: %q", w)
	}
	w := skippedWarning(&client.DownloadStats{Skipped: 2, ModesMasked: 3, SpecialBits: 1, XattrsDropped: 4})
	for _, s := range []string{"2 device", "setuid/setgid/sticky bits from 1", "group/other write on 2", "4 xattrs"} {
		if !strings.Contains(w, s) {
			t.Errorf("%q lacks %q", w, s)
		}
	}
}

package sandboxfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

func replaceIf(t *testing.T, fs *FS, p, old, data string) bool {
	t.Helper()
	ok, err := fs.ReplaceIf(ctx, p, []byte(old), []byte(data))
	if err != nil {
		t.Fatalf("ReplaceIf %s: %v", p, err)
	}
	return ok
}

// noTemps fails if a temporary file of ReplaceIf is left in dir.
func noTemps(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.Contains(e.Name(), ".warren-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

// TestReplaceIfOnlyWhileUnchanged: ReplaceIf replaces a file that holds
// exactly the old content, keeping its mode and owner, and leaves alone
// one with other content, a symlink (even to a file holding the old
// content), a missing file and a special file.
func TestReplaceIfOnlyWhileUnchanged(t *testing.T) {
	fs, root, _ := setup(t)
	conf := filepath.Join(root, "etc/resolv.conf")
	write(t, conf, "old\n")
	if err := os.Chown(conf, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(conf, 0o640); err != nil {
		t.Fatal(err)
	}
	if !replaceIf(t, fs, "/etc/resolv.conf", "old\n", "new\n") {
		t.Fatal("a file holding the old content was not replaced")
	}
	var st unix.Stat_t
	if err := unix.Stat(conf, &st); err != nil {
		t.Fatal(err)
	}
	if got := read(t, conf); got != "new\n" || st.Mode&0o7777 != 0o640 || st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("after ReplaceIf: %q mode %o owner %d:%d, want new, 640, 1234:5678", got, st.Mode&0o7777, st.Uid, st.Gid)
	}
	// Content that differs (or only starts the same) stays.
	for _, have := range []string{"edited\n", "new\nmore\n", "new"} {
		write(t, conf, have)
		if replaceIf(t, fs, "/etc/resolv.conf", "new\n", "x\n") || read(t, conf) != have {
			t.Errorf("a file holding %q was replaced", have)
		}
	}
	// A symlink is the sandbox's own file, whatever it leads to.
	write(t, filepath.Join(root, "etc/real"), "new\n")
	os.Remove(conf)
	if err := os.Symlink("real", conf); err != nil {
		t.Fatal(err)
	}
	if replaceIf(t, fs, "/etc/resolv.conf", "new\n", "x\n") || read(t, filepath.Join(root, "etc/real")) != "new\n" {
		t.Error("a symlink was replaced or written through")
	}
	if fi, err := os.Lstat(conf); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the symlink is gone: %v %v", fi, err)
	}
	os.Remove(conf)
	if replaceIf(t, fs, "/etc/resolv.conf", "new\n", "x\n") {
		t.Error("a missing file was created")
	}
	if _, err := os.Lstat(conf); !os.IsNotExist(err) {
		t.Errorf("a missing file exists after ReplaceIf: %v", err)
	}
	if err := unix.Mkfifo(conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if replaceIf(t, fs, "/etc/resolv.conf", "", "x\n") {
		t.Error("a FIFO was replaced")
	}
	if replaceIf(t, fs, "/nodir/resolv.conf", "", "x\n") {
		t.Error("a file in a missing directory was created")
	}
	noTemps(t, filepath.Join(root, "etc"))
}

// TestReplaceIfStaysInRoot: a directory symlink the sandbox planted on the
// way is followed inside its root, never to the host's file it names.
func TestReplaceIfStaysInRoot(t *testing.T) {
	fs, root, _ := setup(t)
	// /hostdir -> the host directory holding victim ("host secret"): the
	// host's file must neither be compared nor replaced (setup checks).
	if replaceIf(t, fs, "/hostdir/victim", "host secret", "pwned") {
		t.Error("ReplaceIf through a host path reported a replacement")
	}
	// Inside the root, /etclink/shadow is /etc/shadow.
	if !replaceIf(t, fs, "/etclink/shadow", "sandbox shadow", "replaced") || read(t, filepath.Join(root, "etc/shadow")) != "replaced" {
		t.Error("a file behind an in-root directory symlink was not replaced")
	}
}

// TestReplaceIfAtomic: a reader of the file sees the old content or the
// new, never an empty or partial file, while ReplaceIf swaps it back and
// forth.
func TestReplaceIfAtomic(t *testing.T) {
	fs, root, _ := setup(t)
	conf := filepath.Join(root, "etc/resolv.conf")
	a, b := strings.Repeat("a", 64<<10), strings.Repeat("b", 64<<10)
	write(t, conf, a)
	var stop atomic.Bool
	var bad atomic.Value
	var reads atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			got, err := os.ReadFile(conf)
			if err != nil {
				bad.Store(err.Error())
				return
			}
			if s := string(got); s != a && s != b {
				bad.Store(fmt.Sprintf("a read of %d bytes matches neither content", len(got)))
				return
			}
			reads.Add(1)
		}
	}()
	from, to := a, b
	for range 300 {
		if !replaceIf(t, fs, "/etc/resolv.conf", from, to) {
			t.Fatal("not replaced")
		}
		from, to = to, from
	}
	stop.Store(true)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if reads.Load() == 0 {
		t.Fatal("the reader read nothing")
	}
	noTemps(t, filepath.Join(root, "etc"))
}

// TestReplaceIfEditRace: an edit made between ReplaceIf's check and its
// exchange is kept: the old file is checked again after the exchange and
// put back.
func TestReplaceIfEditRace(t *testing.T) {
	fs, root, _ := setup(t)
	conf := filepath.Join(root, "etc/resolv.conf")
	write(t, conf, "old\n")
	beforeExchange = func() { write(t, conf, "edit\n") }
	defer func() { beforeExchange = nil }()
	if replaceIf(t, fs, "/etc/resolv.conf", "old\n", "new\n") {
		t.Error("ReplaceIf reported a replacement over an edit")
	}
	if got := read(t, conf); got != "edit\n" {
		t.Errorf("the sandbox's edit was lost: %q", got)
	}
	noTemps(t, filepath.Join(root, "etc"))
}

// TestReplaceIfMapped: in a user namespace the temporary file is made as
// the sandbox's root and ends with the replaced file's owner.
func TestReplaceIfMapped(t *testing.T) {
	_, root, _ := setup(t)
	const base = 200000
	fs := NewMapped(root, IDMap{Base: base, Size: 65536})
	conf := filepath.Join(root, "etc/resolv.conf")
	write(t, conf, "old\n")
	if err := os.Chown(conf, base, base); err != nil {
		t.Fatal(err)
	}
	if !replaceIf(t, fs, "/etc/resolv.conf", "old\n", "new\n") {
		t.Fatal("not replaced")
	}
	var st unix.Stat_t
	if err := unix.Stat(conf, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != base || st.Gid != base {
		t.Errorf("owner %d:%d, want the sandbox's root %d", st.Uid, st.Gid, base)
	}
}

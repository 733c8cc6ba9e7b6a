package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/store"
)

const stateHibernated = warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED

// TestHibernateAcrossKill9AndFork: through the CLI, a sandbox hibernated
// to disk holds nothing on the node, survives a kill -9 of the daemon,
// and resumes with its counter going on from the saved value; a fork of
// it makes copies that count on too; deleting everything leaves nothing.
func TestHibernateAcrossKill9AndFork(t *testing.T) {
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4.2 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 3*time.Minute)
	e.create(&warrenv1.CreateRequest{Id: "hb"}) // in a user namespace, the default
	e.shOK("hb", "echo kept > /root/f")
	if _, err := e.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "hb",
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /count.tmp; mv /count.tmp /count; sleep 0.01; done"}); err != nil {
		t.Fatal(err)
	}
	e.waitCount("hb", 5)
	out, errOut, code := e.cli(nil, "sandbox", "hibernate", "hb")
	if code != 0 || !strings.Contains(out, "hb hibernated") {
		t.Fatalf("cli hibernate: %d %q %q", code, out, errOut)
	}
	e.expectNoResources("hb", "hibernated")
	b, err := os.ReadFile(filepath.Join(e.stateDir, "checkpoints", "hb", "upper", "count"))
	if err != nil {
		t.Fatal(err)
	}
	saved, _ := strconv.Atoi(strings.TrimSpace(string(b)))

	e.kill9()
	e.start()
	sb, err := e.c.Get(ctx, "hb")
	if err != nil || sb.GetState() != stateHibernated {
		t.Fatalf("after kill -9 and restart: %v %v", sb.GetState(), err)
	}
	// Eagerly (the daemon's default is lazy: TestLazyForkSurvives...).
	out, errOut, code = e.cli(nil, "sandbox", "resume", "--lazy-pages=false", "hb")
	if code != 0 || !strings.Contains(out, "hb restored") {
		t.Fatalf("cli resume: %d %q %q", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(e.runDir, "sb", "hb", "lazy-pages.log")); err == nil {
		t.Errorf("resume --lazy-pages=false started a lazy-pages server")
	}
	if c := e.counterOf("hb"); c < saved || c > saved+100 {
		t.Fatalf("counter %d after the restore, %d saved: restarted or lost", c, saved)
	}
	e.waitCount("hb", saved+5)
	if got := e.shOK("hb", "cat /root/f"); got != "kept\n" {
		t.Fatalf("file after restore: %q", got)
	}

	out, errOut, code = e.cli(nil, "sandbox", "fork", "hb", "-n", "2")
	if code != 0 {
		t.Fatalf("cli fork: %d %q %q", code, out, errOut)
	}
	forks := strings.Fields(out)
	if len(forks) != 2 {
		t.Fatalf("fork printed %q", out)
	}
	for _, id := range forks {
		c := e.counterOf(id)
		e.waitCount(id, c+5)
		if got := e.shOK(id, "cat /root/f"); got != "kept\n" {
			t.Fatalf("fork %s: %q", id, got)
		}
	}
	if sb, err := e.c.Get(ctx, "hb"); err != nil || sb.GetState() != stateRunning {
		t.Fatalf("the source after the fork: %v %v", sb.GetState(), err)
	}
	m, _ := e.scrape(t)
	lazy, _ := m.get(`warren_sandbox_restore_seconds_count{memory="lazy"}`)
	eager, _ := m.get(`warren_sandbox_restore_seconds_count{memory="eager"}`)
	if n := lazy + eager; n < 4 {
		t.Errorf("restores counted %v, want 4 (resume, 2 forks, the source put back)", n)
	}
	for _, id := range append(forks, "hb") {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		e.expectNoResources(id, "delete")
	}
	// Checkpoints are removed in the background.
	for _, d := range []string{"checkpoints", "bases"} {
		deadline := time.Now().Add(15 * time.Second)
		for {
			ents, _ := os.ReadDir(filepath.Join(e.stateDir, d))
			if len(ents) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s left: %v", d, ents)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	e.expectBaseline("hibernated and forked sandboxes deleted")
}

// TestRestoreOnAnotherNode: two nodes share an image store and a
// checkpoint directory (a filesystem of its own, so that writable layers
// are copied to it and back, not renamed). A sandbox hibernated on node a
// is restored on node b through the CLI: its counter goes on from the
// saved value, its files and trajectory log come with it, and node a
// forgets it (NotFound naming b, also after a restart). A checkpoint of
// one node's sandbox is not another's to overwrite. Deleting leaves
// nothing on either node or in the shared directory.
func TestRestoreOnAnotherNode(t *testing.T) {
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4.2 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	t.Parallel()
	// The user-namespace sandbox may restore lazily (as under warren
	// serve's default), its images on another filesystem than node b's
	// state: the page server's links are made beside the checkpoints.
	holdUffdKnob(t, "1")
	shared := t.TempDir()
	ck := filepath.Join(shared, "checkpoints")
	if err := os.Mkdir(ck, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", ck, "tmpfs", 0, "size=1g,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(ck, unix.MNT_DETACH) })
	args := func(node string) []string {
		return []string{"--image-store", filepath.Join(shared, "images"), "--checkpoint-dir", ck, "--node-name", node}
	}
	a := newEnv(t, envOptions{serveArgs: args("a")})
	b := newEnv(t, envOptions{serveArgs: args("b")})
	ctx := ctxFor(t, 3*time.Minute)

	a.create(&warrenv1.CreateRequest{Id: "mv", Labels: map[string]string{"run": "x"}}) // in a user namespace, the default
	if _, err := a.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "mv", SessionId: "agent", Seq: 1, Shell: "echo step >> /root/log"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: "mv",
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /count.tmp; mv /count.tmp /count; sleep 0.01; done"}); err != nil {
		t.Fatal(err)
	}
	a.waitCount("mv", 5)
	if _, err := a.c.Hibernate(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	a.expectNoResources("mv", "hibernated")
	saved, _ := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(ck, "mv", "upper", "count"))))

	out, errOut, code := b.cli(nil, "sandbox", "restore", "mv")
	if code != 0 || !strings.Contains(out, "mv restored") {
		t.Fatalf("cli restore on node b: %d %q %q", code, out, errOut)
	}
	if !strings.Contains(out, "memory lazily") {
		t.Errorf("cli restore on node b: %q, want its memory restored lazily", out)
	}
	if c := b.counterOf("mv"); c < saved || c > saved+100 {
		t.Fatalf("counter %d on node b, %d saved: restarted or lost", c, saved)
	}
	b.waitCount("mv", saved+5)
	// The links the page server read, beside the checkpoints (the
	// tmpfs), go once it is done; the checkpoint itself went at once.
	if _, err := os.Stat(filepath.Join(ck, ".lazy")); err != nil {
		t.Errorf("no links beside the checkpoints: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ents, _ := os.ReadDir(filepath.Join(ck, ".lazy"))
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("links left beside the checkpoints after the page server: %v", ents)
			break
		}
	}
	if got := b.shOK("mv", "cat /root/log"); got != "step\n" {
		t.Fatalf("file on node b: %q", got)
	}
	// The recorded step replays on b from the log that came along: its
	// command is not run again.
	res, err := b.c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "mv", SessionId: "agent", Seq: 1, Shell: "echo step >> /root/log"})
	if err != nil || !res.GetReplayed() {
		t.Fatalf("replay of seq 1 on node b: replayed=%v err=%v", res.GetReplayed(), err)
	}
	if got := b.shOK("mv", "cat /root/log"); got != "step\n" {
		t.Fatalf("the replayed step ran again: %q", got)
	}
	if sb, err := b.c.Get(ctx, "mv"); err != nil || sb.GetLabels()["run"] != "x" || sb.GetState() != stateRunning {
		t.Fatalf("on node b: %v %v", sb, err)
	}

	// Node a forgot it, and does not bring it back at a restart.
	if _, err := a.c.Get(ctx, "mv"); !client.IsNotFound(err) || !strings.Contains(err.Error(), "node b") {
		t.Fatalf("node a after the move: %v", err)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	a.start()
	if sbs, err := a.c.List(ctx, nil); err != nil || len(sbs) != 0 {
		t.Fatalf("node a lists %d sandboxes after a restart: %v", len(sbs), err)
	}

	// One node's checkpoint is not another's to overwrite (ids are the
	// caller's to choose), and a restore of what is not there is
	// NotFound.
	a.create(&warrenv1.CreateRequest{Id: "dup", UserNamespace: proto.Bool(false)})
	b.create(&warrenv1.CreateRequest{Id: "dup", UserNamespace: proto.Bool(false)})
	if _, err := b.c.Hibernate(ctx, "dup"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Hibernate(ctx, "dup"); !client.IsConflict(err) {
		t.Fatalf("hibernate over another node's checkpoint: %v", err)
	}
	a.shOK("dup", "true") // still running
	if _, err := a.c.Restore(ctx, "none"); !client.IsNotFound(err) {
		t.Fatalf("restore of no checkpoint: %v", err)
	}

	for _, e := range []*env{a, b} {
		for _, id := range []string{"mv", "dup"} {
			if err := e.c.Delete(ctx, id); err != nil && !client.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
	a.expectNoResources("dup", "deleted")
	b.expectNoResources("mv", "deleted")
	deadline := time.Now().Add(15 * time.Second)
	for {
		// What may stay: the tombstones' and the page servers' links'
		// directories, empty.
		var left []string
		ents, _ := os.ReadDir(ck)
		for _, e := range ents {
			in, _ := os.ReadDir(filepath.Join(ck, e.Name()))
			if (e.Name() != ".moved" && e.Name() != ".lazy") || len(in) > 0 {
				left = append(left, e.Name())
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left in the shared checkpoint directory: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// forkedOnSharedNodes starts nodes a and b sharing an image store and a
// checkpoint directory ck, and on a a sandbox "src" with /root/f and two
// forks of it, f1 and f2 (their base on ck). Parallel; skips without CRIU.
func forkedOnSharedNodes(t *testing.T) (a, b *env, ck, f1, f2 string) {
	t.Helper()
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4.2 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	t.Parallel()
	shared := t.TempDir()
	ck = filepath.Join(shared, "checkpoints")
	args := func(node string) []string {
		return []string{"--image-store", filepath.Join(shared, "images"), "--checkpoint-dir", ck, "--node-name", node}
	}
	a = newEnv(t, envOptions{serveArgs: args("a")})
	b = newEnv(t, envOptions{serveArgs: args("b")})
	a.create(&warrenv1.CreateRequest{Id: "src"})
	a.shOK("src", "echo from-source > /root/f")
	fr, err := a.c.Fork(ctxFor(t, 3*time.Minute), &warrenv1.ForkRequest{Id: "src", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	return a, b, ck, fr.GetSandboxes()[0].GetId(), fr.GetSandboxes()[1].GetId()
}

// TestRestoreForkOnAnotherNode: with a shared checkpoint directory, a
// fork's base sits beside the checkpoints, so a fork hibernated on node a
// restores on node b and sees the source's files through its base. The
// base stays while any sandbox on any node stands on it (the source and
// the other fork deleted on a, the moved fork still running on b) and
// goes with the last of them.
func TestRestoreForkOnAnotherNode(t *testing.T) {
	a, b, ck, f1, f2 := forkedOnSharedNodes(t)
	ctx := ctxFor(t, 3*time.Minute)
	a.shOK(f1, "echo own > /root/g")
	bases, _ := filepath.Glob(filepath.Join(ck, ".bases", "src-*"))
	if len(bases) != 2 { // the base and its list
		t.Fatalf("shared bases after the fork: %v", bases)
	}
	if _, err := a.c.Hibernate(ctx, f1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Restore(ctx, f1); err != nil {
		t.Fatalf("restore of a fork on another node: %v", err)
	}
	if got := b.shOK(f1, "cat /root/f /root/g"); got != "from-source\nown\n" {
		t.Fatalf("the fork's files on node b: %q", got)
	}
	for _, id := range []string{"src", f2} {
		if err := a.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	a.expectNoResources("src", "deleted")
	if got := b.shOK(f1, "cat /root/f"); got != "from-source\n" {
		t.Fatalf("the moved fork after its source and sibling were deleted on node a: %q", got)
	}
	if left, _ := filepath.Glob(filepath.Join(ck, ".bases", "src-*")); len(left) != 2 {
		t.Fatalf("the base went while the moved fork stands on it: %v", left)
	}
	if err := b.c.Delete(ctx, f1); err != nil {
		t.Fatal(err)
	}
	b.expectNoResources(f1, "deleted")
	if left, _ := filepath.Glob(filepath.Join(ck, ".bases", "*")); len(left) != 0 {
		t.Fatalf("shared bases left after every sandbox on them was deleted: %v", left)
	}
}

// TestSharedBaseStaleEntrySwept: a node that crashed between a delete and
// taking the sandbox off its shared base's list finds the stale entry
// (it names this node, and no record here holds the sandbox) when it
// starts again, and removes it, and the base with the last entry; the
// entries of sandboxes it still holds, and those naming other nodes (a
// fork moved to node b, which renamed its entry), stay.
func TestSharedBaseStaleEntrySwept(t *testing.T) {
	a, b, ck, f1, f2 := forkedOnSharedNodes(t)
	ctx := ctxFor(t, 3*time.Minute)
	bases, _ := filepath.Glob(filepath.Join(ck, ".bases", "src-*.refs"))
	if len(bases) != 1 {
		t.Fatalf("shared base lists after the fork: %v", bases)
	}
	refs := bases[0]
	entry := func(id string) (string, bool) {
		b, err := os.ReadFile(filepath.Join(refs, id))
		return strings.TrimSpace(string(b)), err == nil
	}
	for _, id := range []string{"src", f1, f2} {
		if n, ok := entry(id); !ok || n != "a" {
			t.Fatalf("entry of %s: %q, %v (want one naming node a)", id, n, ok)
		}
	}
	if _, err := a.c.Hibernate(ctx, f1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Restore(ctx, f1); err != nil {
		t.Fatalf("restore of a fork on another node: %v", err)
	}
	if n, _ := entry(f1); n != "b" {
		t.Fatalf("the moved fork's entry names %q, want b", n)
	}
	// Node a crashes; its record of f2 is gone as a delete removes it,
	// its entry not yet.
	a.kill9()
	st, err := store.Open(a.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(f2); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	a.start()
	if _, ok := entry(f2); ok {
		t.Fatalf("the stale entry of %s (deleted on node a, which crashed) is still on the base's list", f2)
	}
	for _, id := range []string{"src", f1} {
		if _, ok := entry(id); !ok {
			t.Fatalf("the entry of %s went with the stale one", id)
		}
	}
	if got := b.shOK(f1, "cat /root/f"); got != "from-source\n" {
		t.Fatalf("the moved fork after node a's sweep: %q", got)
	}
	for _, env := range []struct {
		e  *env
		id string
	}{{a, "src"}, {b, f1}} {
		if err := env.e.c.Delete(ctx, env.id); err != nil {
			t.Fatal(err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(ck, ".bases", "*")); len(left) != 0 {
		t.Fatalf("shared bases left after every sandbox on them was deleted: %v", left)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

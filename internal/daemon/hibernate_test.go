package daemon

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/caller"
	"github.com/warrenrl/warren/internal/container"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/store"
)

func requireCRIU(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(container.CRIUPath); err != nil {
		t.Skipf("no CRIU >= 4.2 at %s (scripts/criu.sh installs it): %v", container.CRIUPath, err)
	}
}

// TestHibernateRestoreAcrossRestart: a hibernated sandbox's processes and
// memory are gone from the node, its record survives a daemon restart
// (and the loss of the store's copy), and Resume restores it: a counter
// continues from where it stopped, files written before are there, the
// background process is listed again. Calls are refused while it is
// HIBERNATED; delete of a hibernated sandbox leaves nothing.
func TestHibernateRestoreAcrossRestart(t *testing.T) { testHibernateRestoreAcrossRestart(t, false) }

// TestHibernateRestoreAcrossRestartUserNS: the same in a user namespace (the default).
func TestHibernateRestoreAcrossRestartUserNS(t *testing.T) {
	if container.UserNSSupported() != nil {
		t.Skip(container.UserNSSupported())
	}
	testHibernateRestoreAcrossRestart(t, true)
}

func testHibernateRestoreAcrossRestart(t *testing.T, userns bool) {
	requireCRIU(t)
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "hib", UserNamespace: proto.Bool(userns)})
	if res := e.sh("hib", "echo before > /f"); res.GetExitCode() != 0 {
		t.Fatalf("write: %v", res)
	}
	count := counter(t, e, "hib")
	res, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "hib"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hibernate: checkpoint %d us, %d bytes, total %d us, before %v", res.GetCheckpointUs(), res.GetBytes(), res.GetTotalUs(), res.GetBefore())
	if sb := res.GetSandbox(); sb.GetState() != stateHibernated || sb.GetHibernatedAtUnixMs() == 0 || sb.GetCheckpointBytes() == 0 {
		t.Fatalf("hibernated sandbox: %v", sb)
	}
	// Nothing of it runs on the node: no cgroup, no run directory.
	if left := sweepLeftovers(e, "hib"); left != "" {
		t.Fatalf("resources of a hibernated sandbox: %s", left)
	}
	_, err = e.m.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "hib", Argv: []string{"true"}})
	wantCat(t, err, errdefs.Conflict, "is HIBERNATED")
	_, err = e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "hib"})
	wantCat(t, err, errdefs.Conflict, "is HIBERNATED")
	if e.gauge("hibernated") != 1 {
		t.Errorf("gauge hibernated = %v", e.gauge("hibernated"))
	}
	ckpt := e.m.checkpointDir("hib")

	// A restart whose store lost the record (a torn file of an ended
	// boot) gets it back from the checkpoint.
	e.stop()
	st, err := store.Open(filepath.Join(e.dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Delete("hib"); err != nil {
		t.Fatal(err)
	}
	st.Close()
	e.start()
	sb, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: "hib"})
	if err != nil || sb.GetState() != stateHibernated {
		t.Fatalf("after restart: %v %v", sb, err)
	}
	// Its background process is listed as it was at the hibernation,
	// across the restart too.
	hl, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: "hib"})
	if err != nil || len(hl.GetProcesses()) != 1 || !hl.GetProcesses()[0].GetRunning() || hl.GetProcesses()[0].GetPid() == 0 {
		t.Fatalf("processes of the hibernated sandbox: %v %v", hl, err)
	}
	// The counter's value as saved (its reader needs a running sandbox).
	saved := readFileInt(t, filepath.Join(ckpt, "upper", "count"))
	rr, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "hib"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore: %d us, hibernated %d ms", rr.GetRestoreUs(), rr.GetPausedMs())
	if !rr.GetRestored() || rr.GetSandbox().GetState() != stateRunning || rr.GetSandbox().GetHibernatedAtUnixMs() != 0 {
		t.Fatalf("resumed: %v", rr)
	}
	if n := count(); n < saved || n > saved+50 {
		t.Fatalf("counter after restore = %d, saved %d: restarted or lost", n, saved)
	}
	waitUntil(t, "the counter to count after the restore", func() bool { return count() > saved+5 })
	if out := e.sh("hib", "cat /f").GetStdout(); string(out) != "before\n" {
		t.Fatalf("file written before hibernation: %q", out)
	}
	list, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: "hib"})
	if err != nil || len(list.GetProcesses()) != 1 || !list.GetProcesses()[0].GetRunning() {
		t.Fatalf("processes after restore: %v %v", list, err)
	}
	if a, b := hl.GetProcesses()[0], list.GetProcesses()[0]; a.GetProcessId() != b.GetProcessId() || a.GetPid() != b.GetPid() {
		t.Errorf("process while hibernated %v, after the restore %v", a, b)
	}
	if _, err := os.Stat(ckpt); !os.IsNotExist(err) {
		t.Errorf("checkpoint left after restore: %v", err)
	}

	// Hibernated again, then deleted: nothing is left.
	if _, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "hib"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "hib"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the hibernated sandbox's resources to go", func() bool { return sweepLeftovers(e, "hib") == "" })
	if _, err := os.Stat(ckpt); !os.IsNotExist(err) {
		t.Errorf("checkpoint left after delete: %v", err)
	}
	if e.gauge("hibernated") != 0 {
		t.Errorf("gauge hibernated %v after delete", e.gauge("hibernated"))
	}
}

// TestHibernatePausedAndByLabel: a PAUSED sandbox hibernates too;
// HibernateByLabel takes exactly the matching ones, ResumeByLabel brings
// them back; a sandbox CRIU cannot take (user namespace) is refused with
// the reason and keeps running.
func TestHibernatePausedAndByLabel(t *testing.T) {
	requireCRIU(t)
	e := newEnv(t)
	ctx := ctxT(t)
	for _, id := range []string{"a", "b", "other"} {
		lab := map[string]string{"batch": "1"}
		if id == "other" {
			lab = map[string]string{"batch": "2"}
		}
		e.create(&warrenv1.CreateRequest{Id: id, Labels: lab, UserNamespace: proto.Bool(false)})
	}
	if _, err := e.m.Pause(ctx, &warrenv1.PauseRequest{Id: "a"}); err != nil {
		t.Fatal(err)
	}
	var evs []*warrenv1.ByLabelEvent
	if err := e.m.HibernateByLabel(ctx, &warrenv1.HibernateByLabelRequest{Labels: map[string]string{"batch": "1"}}, func(ev *warrenv1.ByLabelEvent) error {
		evs = append(evs, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if !last.GetDone() || last.GetTotal() != 2 || last.GetFailed() != 0 {
		t.Fatalf("events: %v", evs)
	}
	for _, id := range []string{"a", "b"} {
		if sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: id}); sb.GetState() != stateHibernated {
			t.Fatalf("%s: %v", id, sb)
		}
	}
	if sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: "other"}); sb.GetState() != stateRunning {
		t.Fatalf("other: %v", sb)
	}
	evs = nil
	if err := e.m.ResumeByLabel(ctx, &warrenv1.ResumeByLabelRequest{Labels: map[string]string{"batch": "1"}}, func(ev *warrenv1.ByLabelEvent) error {
		evs = append(evs, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; last.GetTotal() != 2 || last.GetFailed() != 0 {
		t.Fatalf("resume events: %v", evs)
	}
	for _, id := range []string{"a", "b"} {
		if out := e.sh(id, "echo up").GetStdout(); string(out) != "up\n" {
			t.Fatalf("%s after ResumeByLabel: %q", id, out)
		}
	}

}

func readFileInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, c := range strings.TrimSpace(string(b)) {
		n = n*10 + int(c-'0')
	}
	return n
}

// TestFork: Fork of a RUNNING sandbox makes copies that continue its
// counter from the checkpoint, see its files, and diverge independently;
// the source runs on; the shared base outlives the source's delete and
// goes with the last fork. A HIBERNATED source stays so; bad counts are
// refused.
func TestFork(t *testing.T) { testFork(t, false) }

// TestForkUserNS: the same in a user namespace (the default).
func TestForkUserNS(t *testing.T) {
	if container.UserNSSupported() != nil {
		t.Skip(container.UserNSSupported())
	}
	testFork(t, true)
}

func testFork(t *testing.T, userns bool) {
	requireCRIU(t)
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "src", UserNamespace: proto.Bool(userns), Labels: map[string]string{"run": "1"}})
	if res := e.sh("src", "echo shared > /root/f"); res.GetExitCode() != 0 {
		t.Fatalf("write: %v", res)
	}
	count := counter(t, e, "src")
	_, err := e.m.Fork(ctx, &warrenv1.ForkRequest{Id: "src", Count: 0})
	wantCat(t, err, errdefs.Invalid, "count 0")
	_, err = e.m.Fork(ctx, &warrenv1.ForkRequest{Id: "nope", Count: 1})
	wantCat(t, err, errdefs.NotFound, "")

	res, err := e.m.Fork(ctx, &warrenv1.ForkRequest{Id: "src", Count: 3, Labels: map[string]string{"branch": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork of 3: checkpoint %d us, restores %v us, total %d us", res.GetCheckpointUs(), res.GetRestoreUs(), res.GetTotalUs())
	if len(res.GetSandboxes()) != 3 || res.GetSource().GetState() != stateRunning {
		t.Fatalf("fork: %v", res)
	}
	saved := count()
	var ids []string
	for i, f := range res.GetSandboxes() {
		if f.GetState() != stateRunning || f.GetForkedFrom() != "src" || f.GetLabels()["run"] != "1" || f.GetLabels()["branch"] != "yes" {
			t.Fatalf("fork %d: %v", i, f)
		}
		ids = append(ids, f.GetId())
	}
	for i, id := range ids {
		out := e.sh(id, "cat /root/f; cat /count; echo "+string(rune('a'+i))+" > /root/mine")
		if !strings.HasPrefix(string(out.GetStdout()), "shared\n") {
			t.Fatalf("fork %s: %v", id, out)
		}
	}
	for i, id := range ids {
		if out := e.sh(id, "cat /root/mine").GetStdout(); string(out) != string(rune('a'+i))+"\n" {
			t.Errorf("fork %s sees %q: forks do not diverge", id, out)
		}
		list, err := e.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: id})
		if err != nil || len(list.GetProcesses()) != 1 {
			t.Errorf("fork %s's processes: %v %v", id, list, err)
		}
	}
	if out := e.sh("src", "cat /root/mine 2>&1; cat /root/f").GetStdout(); !strings.HasSuffix(string(out), "shared\n") || strings.Contains(string(out), "\na\n") {
		t.Errorf("the source sees a fork's file: %q", out)
	}
	waitUntil(t, "the source's counter to go on", func() bool { return count() > saved+5 })

	// The source goes; its forks keep their shared base.
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "src"}); err != nil {
		t.Fatal(err)
	}
	if out := e.sh(ids[0], "cat /root/f").GetStdout(); string(out) != "shared\n" {
		t.Fatalf("fork after its source's delete: %q", out)
	}
	// A hibernated fork forks again, and stays hibernated.
	if _, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: ids[0]}); err != nil {
		t.Fatal(err)
	}
	res2, err := e.m.Fork(ctx, &warrenv1.ForkRequest{Id: ids[0], Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if sb, _ := e.m.Get(ctx, &warrenv1.GetRequest{Id: ids[0]}); sb.GetState() != stateHibernated {
		t.Fatalf("hibernated source after a fork: %v", sb)
	}
	g := res2.GetSandboxes()[0].GetId()
	if out := e.sh(g, "cat /root/f /root/mine").GetStdout(); string(out) != "shared\na\n" {
		t.Fatalf("fork of a fork: %q", out)
	}
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if out := e.sh(ids[0], "cat /root/mine").GetStdout(); string(out) != "a\n" {
		t.Fatalf("restored forked fork: %q", out)
	}
	for _, id := range append(ids, g) {
		if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range append(ids, g, "src") {
		waitUntil(t, "the resources of "+id+" to go", func() bool { return sweepLeftovers(e, id) == "" })
	}
	if ents, _ := os.ReadDir(e.m.basesDir()); len(ents) != 0 {
		t.Errorf("bases left: %v", ents)
	}
}

// TestHibernateWithNetwork: a sandbox with a network hibernates and comes
// back with its interface, its address and its resolver; a fork of it
// gets an address of its own and a resolv.conf naming its own gateway;
// nothing of either is left after delete.
func TestHibernateWithNetwork(t *testing.T) { testHibernateWithNetwork(t, false) }

// TestHibernateWithNetworkUserNS: the same in a user namespace (the default).
func TestHibernateWithNetworkUserNS(t *testing.T) {
	if container.UserNSSupported() != nil {
		t.Skip(container.UserNSSupported())
	}
	testHibernateWithNetwork(t, true)
}

func testHibernateWithNetwork(t *testing.T, userns bool) {
	requireCRIU(t)
	e := newEnv(t)
	ctx := ctxT(t)
	sb := e.create(&warrenv1.CreateRequest{Id: "net", UserNamespace: proto.Bool(userns), Network: &warrenv1.NetworkPolicy{Mode: "open"}})
	addr := sb.GetNetworkAddress()
	if addr == "" {
		t.Fatalf("no address: %v", sb)
	}
	resolv := string(e.sh("net", "cat /etc/resolv.conf").GetStdout())
	if _, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "net"}); err != nil {
		t.Fatal(err)
	}
	if left := sweepLeftovers(e, "net"); left != "" {
		t.Fatalf("resources of a hibernated sandbox: %s", left)
	}
	// The copy of its record in the checkpoint is the store's whole
	// record: a recovered one still knows what its resolv.conf names.
	b, err := os.ReadFile(filepath.Join(e.m.checkpointDir("net"), hibernatedRecord))
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := store.Decode(b); err != nil || rec.EtcNameserver == "" || rec.State() != stateHibernated {
		t.Fatalf("record in the checkpoint: %+v %v", rec, err)
	}
	rr, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "net"})
	if err != nil {
		t.Fatal(err)
	}
	if got := rr.GetSandbox().GetNetworkAddress(); got != addr {
		t.Errorf("address after restore %q, was %q", got, addr)
	}
	if out := string(e.sh("net", "ip -o -4 addr show eth0 2>/dev/null || cat /proc/net/dev").GetStdout()); !strings.Contains(out, "eth0") {
		t.Errorf("no eth0 after restore: %q", out)
	}
	// The node's end of its veth is in the node's namespace, named for
	// the sandbox (not both ends in the sandbox's).
	if out, err := exec.Command("ip", "-o", "link").CombinedOutput(); err != nil || !strings.Contains(string(out), "alias net") {
		t.Errorf("no veth of the restored sandbox on the node (%v):\n%s", err, out)
	}
	if out := string(e.sh("net", "cat /etc/resolv.conf").GetStdout()); out != resolv {
		t.Errorf("resolv.conf after restore %q, was %q", out, resolv)
	}
	res, err := e.m.Fork(ctx, &warrenv1.ForkRequest{Id: "net", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := res.GetSandboxes()[0]
	if f.GetNetworkAddress() == "" || f.GetNetworkAddress() == addr {
		t.Errorf("fork's address %q, source's %q", f.GetNetworkAddress(), addr)
	}
	fr := string(e.sh(f.GetId(), "cat /etc/resolv.conf").GetStdout())
	if fr == resolv || !strings.Contains(fr, "nameserver") {
		t.Errorf("fork's resolv.conf %q, source's %q: want its own gateway", fr, resolv)
	}
	for _, id := range []string{f.GetId(), "net"} {
		if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the resources of "+id+" to go", func() bool { return sweepLeftovers(e, id) == "" })
	}
	// No host end of a veth names either (its alias is the sandbox id).
	out, err := exec.Command("ip", "-o", "link").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{f.GetId(), "net"} {
		if strings.Contains(string(out), "alias "+id+"\n") || strings.HasSuffix(strings.TrimSpace(string(out)), "alias "+id) {
			t.Errorf("a veth of %s is left:\n%s", id, out)
		}
	}
}

// TestForkOfHarnessChildren: a harness cannot be hibernated or forked (its
// route's connections); forks of its child are its children too, within
// its cap, and go with it.
func TestForkOfHarnessChildren(t *testing.T) {
	requireCRIU(t)
	rt := &routes{open: map[string]string{}}
	e := newEnv(t, func(c *Config) { c.Router = rt })
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, &warrenv1.CreateRequest{Id: "h", Image: "busybox", UserNamespace: proto.Bool(false), Harness: &warrenv1.HarnessOptions{MaxChildren: 3}}); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "h"})
	wantCat(t, err, errdefs.Unsupported, "is a harness")
	_, err = e.m.Fork(ctx, &warrenv1.ForkRequest{Id: "h", Count: 1})
	wantCat(t, err, errdefs.Unsupported, "is a harness")
	hctx := caller.WithHarness(ctx, "h")
	if _, err := e.m.Create(hctx, &warrenv1.CreateRequest{Id: "kid", Image: "busybox", UserNamespace: proto.Bool(false)}); err != nil {
		t.Fatal(err)
	}
	res, err := e.m.Fork(hctx, &warrenv1.ForkRequest{Id: "kid", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.GetSandboxes() {
		if f.GetParent() != "h" {
			t.Errorf("fork of a child: parent %q", f.GetParent())
		}
	}
	// Three children now: the cap refuses another fork, all or nothing.
	_, err = e.m.Fork(hctx, &warrenv1.ForkRequest{Id: "kid", Count: 1})
	wantCat(t, err, errdefs.Exhausted, "max_children")
	if list, err := e.m.List(hctx, &warrenv1.ListRequest{}); err != nil || len(list.GetSandboxes()) != 3 {
		t.Fatalf("the harness's children: %v %v", list, err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: "h"}); err != nil {
		t.Fatal(err)
	}
	for _, f := range res.GetSandboxes() {
		if _, err := e.m.Get(ctx, &warrenv1.GetRequest{Id: f.GetId()}); errdefs.CategoryOf(err) != errdefs.NotFound {
			t.Errorf("fork %s after its harness's delete: %v", f.GetId(), err)
		}
	}
}

// TestHibernateAfterDaemonRestart: a sandbox created by an earlier daemon
// (whose shared filesystems the next one mounted again) hibernates and
// restores.
func TestHibernateAfterDaemonRestart(t *testing.T) {
	requireCRIU(t)
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "old", UserNamespace: proto.Bool(false)})
	e.stop()
	e.start()
	if _, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "old"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "old"}); err != nil {
		t.Fatal(err)
	}
	if out := e.sh("old", "echo up").GetStdout(); string(out) != "up\n" {
		t.Fatalf("after restore: %q", out)
	}
}

// TestHibernateWithDiskLimit: a sandbox whose writable layer is on a disk
// of its own (disk_bytes) hibernates, its layer copied off the disk into
// the checkpoint, and restores onto a new disk of that size: its counter
// goes on, its files are there, and the limit holds (a write past it
// fails inside, nothing else). A fork of it gets a disk of its own too.
// Delete leaves no disk, mount or loop device.
func TestHibernateWithDiskLimit(t *testing.T) {
	requireCRIU(t)
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "dk", UserNamespace: proto.Bool(false), Resources: &warrenv1.Resources{DiskBytes: 64 << 20}})
	if res := e.sh("dk", "head -c 4194304 /dev/zero > /data && echo kept > /f"); res.GetExitCode() != 0 {
		t.Fatalf("write: %v", res)
	}
	count := counter(t, e, "dk")
	if _, err := e.m.Hibernate(ctx, &warrenv1.HibernateRequest{Id: "dk"}); err != nil {
		t.Fatal(err)
	}
	if left := sweepLeftovers(e, "dk"); left != "" {
		t.Fatalf("resources of a hibernated sandbox: %s", left)
	}
	saved := readFileInt(t, filepath.Join(e.m.checkpointDir("dk"), "upper", "count"))
	if _, err := e.m.Resume(ctx, &warrenv1.ResumeRequest{Id: "dk"}); err != nil {
		t.Fatal(err)
	}
	if c := count(); c < saved {
		t.Fatalf("counter %d after the restore, %d saved", c, saved)
	}
	if out := e.sh("dk", "cat /f; wc -c < /data").GetStdout(); string(out) != "kept\n4194304\n" {
		t.Fatalf("files after the restore: %q", out)
	}
	// The restored layer is on a 64 MiB disk again: 80 MiB do not fit.
	res := e.sh("dk", "head -c 83886080 /dev/zero > /big; echo $?; df -k / | tail -1")
	if out := string(res.GetStdout()); !strings.HasPrefix(out, "1\n") {
		t.Fatalf("a write past the disk limit after the restore: %q %q", out, res.GetStderr())
	}
	e.sh("dk", "rm -f /big")

	fr, err := e.m.Fork(ctx, &warrenv1.ForkRequest{Id: "dk", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := fr.GetSandboxes()[0].GetId()
	res = e.sh(f, "cat /f; head -c 83886080 /dev/zero > /big; echo $?")
	if out := string(res.GetStdout()); out != "kept\n1\n" {
		t.Fatalf("fork of a disk-limited sandbox: %q %q", out, res.GetStderr())
	}
	for _, id := range []string{f, "dk"} {
		if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
		if left := sweepLeftovers(e, id); left != "" {
			t.Fatalf("left after delete of %s: %s", id, left)
		}
	}
	// The disks' mounts hold their loop devices (AUTOCLEAR): none left.
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), filepath.Join(e.opts.StateDir, "sandboxes")) {
		t.Fatalf("disk mounts left:\n%s", mi)
	}
}

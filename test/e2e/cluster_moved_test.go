package e2e

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestClusterArchivesFollowRestoredSandbox checks that archive uploads
// and downloads through a gateway reach a sandbox restored on another
// node, as exec and file calls do: its id still names its first node,
// which answers NotFound once that node is back, and the gateway finds
// the node it moved to.
func TestClusterArchivesFollowRestoredSandbox(t *testing.T) {
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4.2 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	cl := newCluster(t, clusterOptions{checkpoints: true})
	ctx := ctxFor(t, 5*time.Minute)
	a, b := cl.gws[0].c, cl.gws[1].c

	sb, err := a.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Node: "node0"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetId()
	if _, err := a.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "echo before > /root/f"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Hibernate(ctx, id); err != nil {
		t.Fatalf("hibernate through the gateway: %v", err)
	}
	// node0 dies; the sandbox is restored on another node.
	cl.nodes[0].kill9()
	cl.waitNodes(30*time.Second, "node1", "node2")
	if _, err := b.Restore(ctx, id); err != nil {
		t.Fatalf("restore through the gateway with node0 down: %v\n%s", err, cl.gwLogs())
	}
	moved, err := b.Get(ctx, id)
	if err != nil || moved.GetNode() == "node0" || moved.GetState() != warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("restored sandbox: %v %v", moved, err)
	}
	// node0 back: the id's tag leads there, and it has forgotten it.
	cl.nodes[0].start()
	cl.waitNodes(30*time.Second, "node0", "node1", "node2")
	if err := b.Upload(ctx, id, "/tmp", tarOf(t, map[string]string{"up.txt": "after the move"})); err != nil {
		t.Fatalf("archive upload through the gateway to the moved sandbox: %v", err)
	}
	rc, err := a.Download(ctx, id, "/root/f")
	if err != nil {
		t.Fatalf("archive download through the gateway from the moved sandbox: %v", err)
	}
	data, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Contains(data, []byte("before")) {
		t.Fatalf("download of /root/f from the moved sandbox lacks its content")
	}
	res, err := a.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "cat /tmp/up.txt"})
	if err != nil || strings.TrimSpace(string(res.GetStdout())) != "after the move" {
		t.Fatalf("the upload did not reach the moved sandbox: %v %v", res, err)
	}
	if err := a.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

// cluster is three node daemons, each in a test host's network namespace
// with its own directories, cgroup parent, user-namespace ids and sandbox
// subnet, sharing one image store, and two gateways in the test's
// namespace, all in one gossip pool.
type cluster struct {
	t     *testing.T
	token string
	tokF  string
	nodes []*env
	hosts []*testutil.TestHost
	gws   []*gwProc
}

// gwProc is one `warren gateway` process.
type gwProc struct {
	t           *testing.T
	bin, name   string
	api, gossip string // host:port
	join        []string
	tokF, log   string
	keyF        string
	extra       []string // more flags of `warren gateway`
	cmd         *exec.Cmd
	exited      chan struct{}
	c           *client.Client
}

func freePort(t *testing.T) int {
	t.Helper()
	// Both protocols: memberlist takes the port on UDP and TCP.
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if u, err := net.ListenPacket("udp", fmt.Sprintf("0.0.0.0:%d", port)); err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

func (g *gwProc) start() {
	g.t.Helper()
	logf, err := os.OpenFile(g.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		g.t.Fatal(err)
	}
	defer logf.Close()
	_, gport, _ := net.SplitHostPort(g.gossip)
	g.cmd = exec.Command(g.bin, "gateway", "--name", g.name, "--listen", g.api, "--token-file", g.tokF,
		"--gossip", "0.0.0.0:"+gport, "--gossip-advertise", g.gossip, "--join", strings.Join(g.join, ","),
		"--gossip-key-file", g.keyF, "--pull-interval", "300ms", "--down-after", "1500ms", "--log-level", "debug")
	g.cmd.Args = append(g.cmd.Args, g.extra...)
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	g.exited = make(chan struct{})
	go func() { _ = g.cmd.Wait(); close(g.exited) }()
}

func (g *gwProc) stop(sig syscall.Signal) {
	_ = g.cmd.Process.Signal(sig)
	select {
	case <-g.exited:
	case <-time.After(20 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.exited
		g.t.Errorf("gateway %s did not stop on %v", g.name, sig)
	}
}

// nodesUp returns the names of the nodes the gateway holds up.
func (g *gwProc) nodesUp(ctx context.Context) (map[string]*warrenv1.NodeStatus, error) {
	res, err := g.c.SystemService().NodeStatus(ctx, connect.NewRequest(&warrenv1.NodeStatusRequest{}))
	if err != nil {
		return nil, err
	}
	up := map[string]*warrenv1.NodeStatus{}
	for _, n := range res.Msg.GetNodes() {
		if n.GetUp() {
			up[n.GetName()] = n
		}
	}
	return up, nil
}

// waitNodes waits until every gateway holds exactly the named nodes up.
func (cl *cluster) waitNodes(within time.Duration, names ...string) {
	cl.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok := true
		var last string
		for _, g := range cl.gws {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			up, err := g.nodesUp(ctx)
			cancel()
			if err != nil || len(up) != len(names) {
				ok, last = false, fmt.Sprintf("%s: up %v, err %v", g.name, keys(up), err)
				break
			}
			for _, n := range names {
				if up[n] == nil {
					ok, last = false, fmt.Sprintf("%s: up %v", g.name, keys(up))
				}
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			cl.t.Fatalf("gateways do not hold nodes %v up after %v: %s\n%s", names, within, last, cl.gwLogs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (cl *cluster) gwLogs() string {
	var b strings.Builder
	for _, g := range cl.gws {
		data, _ := os.ReadFile(g.log)
		lines := strings.Split(string(data), "\n")
		fmt.Fprintf(&b, "--- gateway %s (tail)\n%s\n", g.name, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	return b.String()
}

// clusterConfig shapes a test cluster.
type clusterConfig struct {
	nodes    int
	nodeArgs func(i int) []string // more flags of node i's `warren serve`
	gwArgs   func(i int) []string // more flags of gateway i's `warren gateway`
	// checkpoints gives the nodes a shared checkpoint directory (a tmpfs
	// the test mounts), so that a sandbox hibernated on one is restored
	// on another.
	checkpoints bool
}

// clusterOptions vary newCluster's cluster.
type clusterOptions struct {
	// noCap leaves node1 without its --max-sandboxes of 3, so that the
	// three nodes are alike.
	noCap       bool
	checkpoints bool
}

// newCluster is three nodes (node1 capped at 3 sandboxes unless noCap)
// and two gateways.
func newCluster(t *testing.T, opts ...clusterOptions) *cluster {
	var o clusterOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	t.Helper()
	return newClusterOf(t, clusterConfig{nodes: 3, checkpoints: o.checkpoints, nodeArgs: func(i int) []string {
		if i == 1 && !o.noCap {
			return []string{"--max-sandboxes", "3"} // placement must honour it
		}
		return nil
	}})
}

func newClusterOf(t *testing.T, cc clusterConfig) *cluster {
	t.Helper()
	testutil.RequireRoot(t)
	bin := testutil.StaticBinary(t, "./cmd/warren")
	dir := t.TempDir()
	cl := &cluster{t: t, token: "cluster-token-" + fmt.Sprint(os.Getpid()), tokF: filepath.Join(dir, "token")}
	if err := os.WriteFile(cl.tokF, []byte(cl.token), 0o600); err != nil {
		t.Fatal(err)
	}
	keyF := filepath.Join(dir, "gossip-key")
	if err := os.WriteFile(keyF, []byte("gossip-key-"+fmt.Sprint(os.Getpid())), 0o600); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "images")
	var ck string
	if cc.checkpoints {
		ck = filepath.Join(dir, "checkpoints")
		if err := os.Mkdir(ck, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", ck, "tmpfs", 0, "size=1g,mode=0700"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(ck, unix.MNT_DETACH) })
	}
	gossip := []string{}
	for range cc.nodes {
		h := testutil.NewTestHost(t)
		cl.hosts = append(cl.hosts, h)
		gossip = append(gossip, net.JoinHostPort(h.Addr.String(), "7946"))
	}
	// The gateways are reached by the nodes at a host-side address of a
	// veth (the nodes' default routes lead to the test's namespace).
	gwGossip := []string{
		net.JoinHostPort(cl.hosts[0].Gateway.String(), fmt.Sprint(freePort(t))),
		net.JoinHostPort(cl.hosts[1].Gateway.String(), fmt.Sprint(freePort(t))),
	}
	for i, h := range cl.hosts {
		fd, err := unix.Dup(int(h.NS))
		if err != nil {
			t.Fatal(err)
		}
		nsf := os.NewFile(uintptr(fd), "netns")
		t.Cleanup(func() { nsf.Close() })
		args := []string{
			"--image-store", store,
			"--listen", net.JoinHostPort(h.Addr.String(), "7070"), "--token-file", cl.tokF,
			"--node-name", fmt.Sprintf("node%d", i),
			"--gossip", gossip[i], "--join", strings.Join(gwGossip, ","), "--gossip-key-file", keyF,
			"--userns-ids", usernsIDs(),
		}
		if ck != "" {
			args = append(args, "--checkpoint-dir", ck)
		}
		if cc.nodeArgs != nil {
			args = append(args, cc.nodeArgs(i)...)
		}
		cl.nodes = append(cl.nodes, newEnv(t, envOptions{bin: bin, serveArgs: args, netns: nsf, noImport: i > 0}))
	}
	for i := range 2 {
		g := &gwProc{t: t, bin: bin, name: fmt.Sprintf("gw%d", i), api: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			gossip: gwGossip[i], join: append([]string{gwGossip[1-i]}, gossip...), tokF: cl.tokF,
			log: filepath.Join(dir, fmt.Sprintf("gw%d.log", i)), keyF: keyF}
		if cc.gwArgs != nil {
			g.extra = cc.gwArgs(i)
		}
		g.start()
		c, err := client.New("http://"+g.api, client.WithToken(cl.token))
		if err != nil {
			t.Fatal(err)
		}
		g.c = c
		cl.gws = append(cl.gws, g)
		t.Cleanup(func() {
			g.stop(syscall.SIGTERM)
			c.Close()
			if t.Failed() {
				t.Log(cl.gwLogs())
			}
		})
	}
	var names []string
	for i := range cc.nodes {
		names = append(names, fmt.Sprintf("node%d", i))
	}
	cl.waitNodes(30*time.Second, names...)
	return cl
}

// TestClusterGatewayRoutesAndSurvivesNodeLoss checks the cluster's
// promises end to end: creates through either gateway land on the nodes
// placement picks (within a node's sandbox cap), every call on a sandbox
// (exec, stream, files, archives, list, by label) reaches its node
// through either gateway, a killed node's sandboxes are listed lost and
// its calls fail Unavailable naming it while creates avoid it, the node
// back is reconciled, and a gateway restarted mid-load costs the client
// retriable errors only.
func TestClusterGatewayRoutesAndSurvivesNodeLoss(t *testing.T) {
	cl := newCluster(t)
	ctx := ctxFor(t, 5*time.Minute)
	a, b := cl.gws[0].c, cl.gws[1].c

	// Creates through both gateways, spread by anti-affinity.
	var sbs []*warrenv1.Sandbox
	for i := range 6 {
		c := []*client.Client{a, b}[i%2]
		sb, err := c.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Labels: map[string]string{"job": "c", "i": fmt.Sprint(i)},
			AntiAffinity: []string{"job"}})
		if err != nil {
			t.Fatalf("create %d: %v\n%s", i, err, cl.gwLogs())
		}
		sbs = append(sbs, sb)
	}
	per := map[string]int{}
	for _, sb := range sbs {
		per[sb.GetNode()]++
		tag := sb.GetId()[:5]
		st, err := a.SystemService().NodeStatus(ctx, connect.NewRequest(&warrenv1.NodeStatusRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range st.Msg.GetNodes() {
			if n.GetName() == sb.GetNode() && n.GetTag() != tag {
				t.Errorf("sandbox %s on %s: id does not start with the node's tag %s", sb.GetId(), sb.GetNode(), n.GetTag())
			}
		}
	}
	t.Logf("placement: %v", per)
	if len(per) != 3 {
		t.Errorf("6 sandboxes with anti-affinity on %d nodes (%v), want all 3", len(per), per)
	}
	if per["node1"] > 3 {
		t.Errorf("node1 has %d sandboxes over its cap of 3", per["node1"])
	}

	// Every kind of call, through the other gateway than the create's.
	for i, sb := range sbs {
		c := []*client.Client{b, a}[i%2]
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Shell: "echo hi-$(hostname)"})
		if err != nil || res.GetExitCode() != 0 || !strings.HasPrefix(string(res.GetStdout()), "hi-") {
			t.Fatalf("exec on %s (%s): %v %v", sb.GetId(), sb.GetNode(), res, err)
		}
		if _, err := c.SandboxService().WriteFile(ctx, connect.NewRequest(&warrenv1.WriteFileRequest{SandboxId: sb.GetId(), Path: "/tmp/f", Content: []byte(sb.GetId())})); err != nil {
			t.Fatalf("write file: %v", err)
		}
		rf, err := c.SandboxService().ReadFile(ctx, connect.NewRequest(&warrenv1.ReadFileRequest{SandboxId: sb.GetId(), Path: "/tmp/f"}))
		if err != nil || string(rf.Msg.GetContent()) != sb.GetId() {
			t.Fatalf("read file: %v %v", rf, err)
		}
	}
	var out bytes.Buffer
	if _, err := a.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: sbs[1].GetId(), Shell: "for i in 1 2 3; do echo $i; done"}, func(ev *warrenv1.ExecEvent) error {
		out.Write(ev.GetStdout())
		return nil
	}); err != nil || out.String() != "1\n2\n3\n" {
		t.Fatalf("exec stream through the gateway: %q %v", out.String(), err)
	}
	if err := b.Upload(ctx, sbs[2].GetId(), "/tmp", tarOf(t, map[string]string{"up.txt": "uploaded"})); err != nil {
		t.Fatalf("archive upload: %v", err)
	}
	rc, err := a.Download(ctx, sbs[2].GetId(), "/tmp/up.txt")
	if err != nil {
		t.Fatalf("archive download: %v", err)
	}
	data, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Contains(data, []byte("uploaded")) {
		t.Fatalf("archive download lacks the uploaded file")
	}
	// The gateway passes sparse=1 on: 1 GiB of holes is a few blocks.
	if _, err := a.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sbs[2].GetId(), Shell: "truncate -s 1G /tmp/holes"}); err != nil {
		t.Fatal(err)
	}
	if n, err := archiveLen(ctx, a, sbs[2].GetId(), "/tmp/holes"); err != nil || n > 64<<10 {
		t.Fatalf("sparse archive through the gateway: %d bytes, %v", n, err)
	}

	// List: every sandbox, paged, the same through both gateways.
	for _, c := range []*client.Client{a, b} {
		var got []string
		tok := ""
		for {
			res, err := c.SandboxService().List(ctx, connect.NewRequest(&warrenv1.ListRequest{Labels: map[string]string{"job": "c"}, PageSize: 4, PageToken: tok}))
			if err != nil {
				t.Fatal(err)
			}
			for _, sb := range res.Msg.GetSandboxes() {
				got = append(got, sb.GetId())
			}
			if tok = res.Msg.GetNextPageToken(); tok == "" {
				break
			}
		}
		if len(got) != 6 {
			t.Fatalf("paged list through the gateway: %d sandboxes, want 6", len(got))
		}
	}

	// The CLI and the Python SDK, unchanged, against a gateway.
	cliEnv := []string{"WARREN_TOKEN=" + cl.token}
	stdout, stderr, code := runCLI(t, cl.nodes[0].bin, cliEnv, nil, "--addr", "http://"+cl.gws[1].api, "sandbox", "exec", sbs[0].GetId(), "--", "echo", "from-cli")
	if code != 0 || strings.TrimSpace(stdout) != "from-cli" {
		t.Fatalf("warren exec through the gateway: %d %q %q", code, stdout, stderr)
	}
	pythonSDK(t, "http://"+cl.gws[0].api, cl.token)
	stdout, stderr, code = runCLI(t, cl.nodes[0].bin, cliEnv, nil, "--addr", "http://"+cl.gws[0].api, "nodes")
	if code != 0 || strings.Count(stdout, "true") != 3 {
		t.Fatalf("warren nodes through the gateway: %d %q %q", code, stdout, stderr)
	}

	// Kill node2: its sandboxes become lost, calls on them Unavailable
	// naming it, creates avoid it.
	var on2 []string
	for _, sb := range sbs {
		if sb.GetNode() == "node2" {
			on2 = append(on2, sb.GetId())
		}
	}
	cl.nodes[2].kill9()
	// At once, before any gateway has noticed: a create placed on node2
	// finds its port refusing and is placed again.
	for i := range 3 {
		sb, err := a.Create(ctx, &warrenv1.CreateRequest{Image: imageName, Labels: map[string]string{"job": "fast"}})
		if err != nil {
			t.Fatalf("create %d right after node2's death: %v", i, err)
		}
		if sb.GetNode() == "node2" {
			t.Fatalf("create right after node2's death landed on it")
		}
	}
	cl.waitNodes(30*time.Second, "node0", "node1")
	for _, c := range []*client.Client{a, b} {
		sbl, err := c.List(ctx, map[string]string{"job": "c"})
		if err != nil {
			t.Fatal(err)
		}
		lost := 0
		for _, sb := range sbl {
			if sb.GetNode() == "node2" {
				if sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_LOST {
					t.Errorf("%s on the dead node2 is %v, want LOST", sb.GetId(), sb.GetState())
				}
				lost++
			} else if sb.GetState() != warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
				t.Errorf("%s on %s is %v", sb.GetId(), sb.GetNode(), sb.GetState())
			}
		}
		if lost != len(on2) || len(sbl) != 6 {
			t.Errorf("list with node2 down: %d sandboxes, %d lost; want 6, %d", len(sbl), lost, len(on2))
		}
		_, err = c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: on2[0], Shell: "true"})
		wantCategory(t, err, client.CategoryUnavailable, "exec on a sandbox of a down node")
		if err != nil && !strings.Contains(err.Error(), "node2") {
			t.Errorf("error of a down node does not name it: %v", err)
		}
		if _, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: sbs[0].GetId(), Shell: "true"}); err != nil && sbs[0].GetNode() != "node2" {
			t.Errorf("exec on a live node's sandbox while node2 is down: %v", err)
		}
	}
	bc, err := a.SandboxService().BatchCreate(ctx, connect.NewRequest(&warrenv1.BatchCreateRequest{
		Template: &warrenv1.CreateRequest{Image: imageName, Labels: map[string]string{"job": "batch"}}, Count: 4}))
	if err != nil || len(bc.Msg.GetSandboxes()) != 4 {
		t.Fatalf("batch create of 4 with node2 down: %v %v", bc, err)
	}
	for _, sb := range bc.Msg.GetSandboxes() {
		if sb.GetNode() == "node2" {
			t.Errorf("batch create placed %s on the down node2", sb.GetId())
		}
	}

	// Capacity: node1 takes at most its --max-sandboxes of 3, however
	// many the others hold.
	all, err := a.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	per = map[string]int{}
	for _, sb := range all {
		per[sb.GetNode()]++
	}
	if per["node1"] > 3 || per["node0"]+per["node1"] != 11 {
		t.Errorf("with node2 down, 11 live sandboxes on node0 and node1 as %v; node1 capped at 3", per)
	}

	// node2 back: reconciled, its sandboxes run and answer again.
	cl.nodes[2].start()
	cl.waitNodes(30*time.Second, "node0", "node1", "node2")
	deadline := time.Now().Add(20 * time.Second)
	for {
		sb, err := b.Get(ctx, on2[0])
		if err == nil && sb.GetState() == warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s of the restarted node2: %v %v", on2[0], sb.GetState(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := cl.nodes[2].shOK(on2[0], "cat /tmp/f"); got != on2[0] {
		t.Fatalf("file of %s after node2's restart: %q", on2[0], got)
	}
	if _, err := a.Exec(ctx, &warrenv1.ExecRequest{SandboxId: on2[0], Shell: "true"}); err != nil {
		t.Fatalf("exec through the gateway after node2's return: %v", err)
	}

	// By label: one stream over the three nodes.
	pr, err := b.PauseByLabel(ctx, &warrenv1.PauseByLabelRequest{Labels: map[string]string{"job": "c"}}, nil)
	if err != nil || pr.Total != 6 || pr.Failed != 0 || len(pr.Events) != 6 {
		t.Fatalf("pause by label through the gateway: %+v %v", pr, err)
	}
	for _, sb := range sbs {
		if got, err := a.Get(ctx, sb.GetId()); err != nil || got.GetState() != warrenv1.SandboxState_SANDBOX_STATE_PAUSED {
			t.Fatalf("%s on %s after pause by label: %v %v", sb.GetId(), sb.GetNode(), got.GetState(), err)
		}
	}
	if rr, err := a.ResumeByLabel(ctx, &warrenv1.ResumeByLabelRequest{Labels: map[string]string{"job": "c"}}, nil); err != nil || rr.Total != 6 || rr.Failed != 0 {
		t.Fatalf("resume by label through the gateway: %+v %v", rr, err)
	}

	// Restart gateway 0 under load: execs on every sandbox retried on
	// retriable errors only; none is lost.
	var (
		done     atomic.Bool
		ops      atomic.Int64
		retried  atomic.Int64
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	for _, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				for {
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					res, err := a.Exec(cctx, &warrenv1.ExecRequest{SandboxId: sb.GetId(), Shell: "cat /tmp/f"})
					cancel()
					if err == nil && string(res.GetStdout()) == sb.GetId() {
						ops.Add(1)
						break
					}
					if client.IsUnavailable(err) {
						retried.Add(1)
						time.Sleep(50 * time.Millisecond)
						continue
					}
					errMu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("exec on %s during a gateway restart: %v %v", sb.GetId(), res, err)
					}
					errMu.Unlock()
					return
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	cl.gws[0].stop(syscall.SIGKILL)
	cl.gws[0].start()
	cl.waitNodes(30*time.Second, "node0", "node1", "node2")
	before := ops.Load()
	for ops.Load() < before+20 {
		time.Sleep(50 * time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	t.Logf("gateway restart under load: %d execs, %d retried on Unavailable", ops.Load(), retried.Load())

	// Cluster metrics, per node and in total.
	mres := httpGet(t, "http://"+cl.gws[0].api+"/metrics", cl.token)
	for _, want := range []string{`warren_cluster_node_up{node="node2"} 1`, `warren_cluster_nodes{state="up"} 3`, "warren_cluster_sandboxes 13"} {
		if !strings.Contains(mres, want) {
			t.Errorf("gateway metrics lack %q", want)
		}
	}

	// Delete everything through the gateways; each node's clean-up then
	// checks that nothing of its sandboxes is left on it.
	if all, err = b.List(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		if err := a.Delete(ctx, sb.GetId()); err != nil {
			t.Errorf("delete %s through the gateway: %v", sb.GetId(), err)
		}
	}
	for _, n := range cl.nodes {
		if left, err := n.c.List(ctx, nil); err != nil || len(left) != 0 {
			t.Errorf("node left with %d sandboxes (%v)", len(left), err)
		}
	}
}

// pythonSDK runs the Python SDK, as a user installs it, against addr.
func pythonSDK(t *testing.T, addr, token string) {
	t.Helper()
	venv := filepath.Join(t.TempDir(), "venv")
	for _, args := range [][]string{
		{"python3", "-m", "venv", venv},
		{filepath.Join(venv, "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", filepath.Join(testutil.ModuleRoot(), "sdk/python")},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	script := `
import warren
with warren.Warren() as w:
    with w.create("` + imageName + `", labels={"job": "py"}) as sb:
        r = sb.exec("echo from-python")
        assert r.exit_code == 0 and r.text.strip() == "from-python", r
        sb.write_file("/tmp/p", "pydata")
        assert sb.read_file("/tmp/p") == b"pydata"
        got = w.list({"job": "py"})
        assert [s.id for s in got] == [sb.id], got
        assert got[0].info.node.startswith("node"), got[0].info
    # The cluster RPCs: the gateway's nodes, a batch spread over them and
    # a list paged through the gateway.
    nodes = w.nodes()
    assert len(nodes) == 3 and all(n.up and n.address for n in nodes), nodes
    with w.batch_create(6, "` + imageName + `", labels={"job": "pybatch"}) as group:
        assert len(group) == 6 and not group.errors, group.errors
        assert len({sb.info.node for sb in group}) > 1, [sb.info.node for sb in group]
        paged = [s.id for s in w.list({"job": "pybatch"}, page_size=2)]
        assert sorted(paged) == sorted(sb.id for sb in group), paged
        assert paged == [s.id for s in w.list({"job": "pybatch"})], paged
    assert w.list({"job": "pybatch"}) == []
print("ok")
`
	cmd := exec.Command(filepath.Join(venv, "bin/python"), "-c", script)
	cmd.Env = append(os.Environ(), "WARREN_ADDR="+addr, "WARREN_TOKEN="+token)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("python SDK through the gateway: %v\n%s", err, out)
	}
}

func httpGet(t *testing.T, url, token string) string {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("GET %s: %s %s", url, res.Status, b)
	}
	return string(b)
}

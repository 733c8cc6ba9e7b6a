package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// e2bKeyFile writes a key file of one fresh E2B API key.
func e2bKeyFile(t *testing.T) (key, path string) {
	t.Helper()
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	key = "e2b_" + hex.EncodeToString(b)
	path = filepath.Join(t.TempDir(), "e2b-keys")
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return key, path
}

// e2bCall makes one HTTP call to an E2B door; h may set "Host".
func e2bCall(t *testing.T, base, method, path, body string, h map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	c := http.Client{Timeout: 60 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.Bytes()
}

// TestE2BGatewayRoutesEveryCall: the E2B door on the cluster's gateways
// (warren gateway --e2b-addr) serves the E2B API over two nodes: creates
// are placed on both nodes, every call of the official Python SDK's suite
// (lifecycle, commands, files, pause and connect, ports through
// get_host, a concurrent load) works through a gateway, a sandbox's
// envd token and its ports work through either gateway (and Warren's own
// port tunnel through a gateway), and a node that
// goes down fails the calls on its own sandboxes only, naming it, until
// it is back.
func TestE2BGatewayRoutesEveryCall(t *testing.T) {
	key, keyFile := e2bKeyFile(t)
	doors := []string{freeLoopbackAddr(t), freeLoopbackAddr(t)}
	const perNode = 12
	cl := newClusterOf(t, clusterConfig{nodes: 2,
		// Capped, so that more creates than one node takes must land on
		// both.
		nodeArgs: func(int) []string { return []string{"--max-sandboxes", fmt.Sprint(perNode)} },
		gwArgs: func(i int) []string {
			return []string{"--e2b-addr", doors[i], "--e2b-api-key-file", keyFile}
		}})
	ctx := ctxFor(t, 10*time.Minute)
	gw0, gw1 := "http://"+doors[0], "http://"+doors[1]
	auth := map[string]string{"X-API-Key": key}

	// Creates through the door are placed: more than one node holds land
	// on both. One sandbox of each node is kept for the checks below.
	type created struct{ SandboxID, EnvdAccessToken string }
	byNode := map[string][]created{}
	for i := range perNode + 2 {
		code, body := e2bCall(t, []string{gw0, gw1}[i%2], "POST", "/v2/sandboxes", fmt.Sprintf(`{"templateID": %q, "timeout": 600}`, imageName), auth)
		var c created
		if code != 201 || json.Unmarshal(body, &c) != nil {
			t.Fatalf("create %d through the gateway's door: %d %s\n%s", i, code, body, cl.gwLogs())
		}
		sb, err := cl.gws[0].c.Get(ctx, c.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		byNode[sb.GetNode()] = append(byNode[sb.GetNode()], c)
	}
	if len(byNode["node0"]) == 0 || len(byNode["node1"]) == 0 {
		t.Fatalf("%d creates through the door landed on %d nodes, want both", perNode+2, len(byNode))
	}
	keep := map[string]created{"node0": byNode["node0"][0], "node1": byNode["node1"][0]}
	for _, cs := range byNode {
		for _, c := range cs[1:] {
			if code, body := e2bCall(t, gw1, "DELETE", "/sandboxes/"+c.SandboxID, "", auth); code != 204 {
				t.Fatalf("kill through the door: %d %s", code, body)
			}
		}
	}

	// envd and a sandbox's server, through the other gateway than the
	// create's: tokens are the same on every gateway of one key file.
	for node, c := range keep {
		envd := map[string]string{"E2b-Sandbox-Id": c.SandboxID, "X-Access-Token": c.EnvdAccessToken}
		if code, body := e2bCall(t, gw1, "GET", "/health", "", envd); code != 204 {
			t.Fatalf("envd health of %s on %s through gateway 1: %d %s", c.SandboxID, node, code, body)
		}
		if code, body := e2bCall(t, gw0, "POST", "/files?path=/tmp/www/index.html", "served-by-"+node, map[string]string{
			"E2b-Sandbox-Id": c.SandboxID, "X-Access-Token": c.EnvdAccessToken, "Content-Type": "application/octet-stream"}); code != 200 {
			t.Fatalf("upload to %s through gateway 0: %d %s", c.SandboxID, code, body)
		}
		if res, err := cl.gws[1].c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: c.SandboxID, Shell: "busybox httpd -p 8080 -h /tmp/www"}); err != nil || res.GetExitCode() != 0 {
			t.Fatalf("start httpd in %s: %v %v", c.SandboxID, res, err)
		}
		waitPort(t, gw1, c.SandboxID, "served-by-"+node)
		// Warren's own port tunnel through a gateway reaches it too.
		conn, err := cl.gws[0].c.DialPort(ctx, c.SandboxID, 8080)
		if err != nil {
			t.Fatalf("port tunnel through gateway 0 to %s: %v", c.SandboxID, err)
		}
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		_, _ = io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n")
		got, _ := io.ReadAll(conn)
		conn.Close()
		if !bytes.HasSuffix(got, []byte("\r\n\r\nserved-by-"+node)) {
			t.Fatalf("port tunnel through gateway 0 to %s on %s: %q", c.SandboxID, node, got)
		}
	}

	// The official Python SDK's suite through gateway 0: a load of 20 at
	// once does not fit one node. With CRIU on the nodes, the hibernate
	// suite too (pause as hibernation, connect, fork, snapshots, paused
	// sandboxes outliving their timeout), routed to the owning node.
	suite, err := filepath.Abs(filepath.Join(e2bSuite, "test_e2b_sdk.py"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-m", "pytest", "-p", "no:cacheprovider", "-rfEs", "-v", suite}
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err == nil {
		hib, err := filepath.Abs(filepath.Join(e2bSuite, "hibernate"))
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, hib)
	}
	py := filepath.Join(e2bSDK(t, "py-newest"), "bin", "python")
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "E2B_API_URL="+gw0, "E2B_SANDBOX_URL="+gw0, "E2B_API_KEY="+key,
		"WARREN_E2B_TEMPLATE="+imageName, "WARREN_E2B_LOAD=20")
	out, err := cmd.CombinedOutput()
	t.Logf("the E2B SDK suite through gateway 0:\n%s", out)
	if err != nil || !bytes.Contains(out, []byte(" passed")) || bytes.Contains(out, []byte(" skipped")) {
		t.Fatalf("the E2B SDK suite through the gateway failed: %v\n%s", err, cl.gwLogs())
	}

	// node1 down: calls on its sandbox fail naming it (503, and 502 for
	// its server), node0's sandbox answers, the list holds node0's.
	cl.nodes[1].kill9()
	cl.waitNodes(30*time.Second, "node0")
	on0, on1 := keep["node0"].SandboxID, keep["node1"].SandboxID
	for _, door := range []string{gw0, gw1} {
		code, body := e2bCall(t, door, "GET", "/sandboxes/"+on1, "", auth)
		if code != 503 || !bytes.Contains(body, []byte("node1")) {
			t.Errorf("get of a sandbox of the down node1: %d %s, want 503 naming node1", code, body)
		}
		code, body = e2bCall(t, door, "GET", "/", "", map[string]string{"Host": "8080-" + on1 + ".e2b.local"})
		if code != 502 || !bytes.Contains(body, []byte("node1")) {
			t.Errorf("port of a sandbox of the down node1: %d %s, want 502 naming node1", code, body)
		}
		if code, body := e2bCall(t, door, "GET", "/sandboxes/"+on0, "", auth); code != 200 {
			t.Errorf("get of node0's sandbox while node1 is down: %d %s", code, body)
		}
		if code, body := e2bCall(t, door, "GET", "/", "", map[string]string{"Host": "8080-" + on0 + ".e2b.local"}); code != 200 || string(body) != "served-by-node0" {
			t.Errorf("port of node0's sandbox while node1 is down: %d %s", code, body)
		}
		code, body = e2bCall(t, door, "GET", "/v2/sandboxes", "", auth)
		if code != 200 || !bytes.Contains(body, []byte(on0)) || bytes.Contains(body, []byte(on1)) {
			t.Errorf("list while node1 is down: %d %s, want node0's sandbox only", code, body)
		}
	}

	// node1 back: its sandbox and its server answer again.
	cl.nodes[1].start()
	cl.waitNodes(30*time.Second, "node0", "node1")
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := e2bCall(t, gw0, "GET", "/sandboxes/"+on1, "", auth)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node1's sandbox after its return: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitPort(t, gw0, on1, "served-by-node1")
	for _, c := range keep {
		if code, body := e2bCall(t, gw0, "DELETE", "/sandboxes/"+c.SandboxID, "", auth); code != 204 {
			t.Errorf("kill: %d %s", code, body)
		}
	}
}

// waitPort waits until port 8080 of sandbox id answers want through the
// door (502 until its server listens).
func waitPort(t *testing.T, door, id, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := e2bCall(t, door, "GET", "/", "", map[string]string{"Host": "8080-" + id + ".e2b.local"})
		if code == 200 && string(body) == want {
			return
		}
		if code != 502 || time.Now().After(deadline) {
			t.Fatalf("port 8080 of %s through %s: %d %s, want 200 %q", id, door, code, body, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
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
	"github.com/warrenrl/warren/internal/testutil"
)

// e2bSuite is the pytest suite of the official E2B Python SDK.
const e2bSuite = "../../sdk/python/tests_e2b"

// e2bSDK is where scripts/e2b-sdks.sh installed the official E2B SDKs
// (deps.sh runs it): py-newest and py-older (virtualenvs with the newest
// Python SDK that passes and an older 2.x, and pytest) and js (the
// JavaScript SDK's node_modules).
func e2bSDK(t *testing.T, name string) string {
	t.Helper()
	prefix := os.Getenv("WARREN_E2B_SDK_PREFIX")
	if prefix == "" {
		prefix = "/opt/warren/e2b-sdk"
	}
	dir := filepath.Join(prefix, name)
	if _, err := os.Stat(filepath.Join(dir, "installed-from")); err != nil {
		t.Fatalf("the E2B SDK %s is not installed: run scripts/e2b-sdks.sh (%v)", name, err)
	}
	return dir
}

// startE2B starts a daemon serving the E2B door and returns it with its
// URL and key.
func startE2B(t *testing.T) (*env, string, string) {
	t.Helper()
	key := make([]byte, 20)
	_, _ = rand.Read(key)
	keyText := "e2b_" + hex.EncodeToString(key)
	keyFile := filepath.Join(t.TempDir(), "e2b-keys")
	if err := os.WriteFile(keyFile, []byte("# test key\n"+keyText+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr(t)
	e := newEnv(t, envOptions{serveArgs: []string{"--e2b-addr", addr, "--e2b-api-key-file", keyFile}})
	return e, "http://" + addr, keyText
}

// TestE2BSDK: the official E2B Python SDK, unchanged, drives Warren
// through --e2b-addr: create, commands (output, exit codes, env, cwd,
// timeout, background, kill, stdin), files (text, binary, multipart,
// octet-stream, list, mkdir, rename, remove, exists), list with metadata
// and paging, set_timeout expiry, pause and connect, kill, and 100
// sandboxes driven at once through the async API; with the newest SDK and
// an older 2.x. Nothing is left on the node after (newEnv's baseline
// check).
func TestE2BSDK(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	e, url, key := startE2B(t)
	suite, err := filepath.Abs(filepath.Join(e2bSuite, "test_e2b_sdk.py"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"newest", "older"} {
		t.Run(v, func(t *testing.T) {
			py := filepath.Join(e2bSDK(t, "py-"+v), "bin", "python")
			ver, _ := exec.Command(py, "-c", "import importlib.metadata as m; print(m.version('e2b'))").Output()
			cmd := exec.Command(py, "-m", "pytest", "-p", "no:cacheprovider", "-rfEs", "-v", suite)
			cmd.Dir = t.TempDir()
			cmd.Env = append(os.Environ(),
				"E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key,
				"WARREN_E2B_TEMPLATE="+imageName)
			out, err := cmd.CombinedOutput()
			t.Logf("e2b %s, pytest:\n%s", strings.TrimSpace(string(ver)), out)
			if err != nil {
				t.Fatalf("the E2B SDK suite failed: %v (daemon log: %s)", err, e.logPath)
			}
			if !bytes.Contains(out, []byte(" passed")) || bytes.Contains(out, []byte(" skipped")) {
				t.Fatalf("the E2B SDK suite did not run every test")
			}
		})
	}
}

// TestE2BRESTContract: what the SDKs rely on beyond the happy path: every
// REST call needs a configured X-API-Key; errors are {"code","message"}
// with the status the SDKs map; envd traffic needs the sandbox's own
// access token (a token of another sandbox is refused); ids are
// [a-z0-9]+ and also reach envd through a PORT-ID.DOMAIN host; a command
// started over envd's Connect stream and the token survive a daemon
// restart.
func TestE2BRESTContract(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	e, url, key := startE2B(t)
	do := func(method, path, body string, h map[string]string) (int, http.Header, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, url+path, strings.NewReader(body))
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
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, resp.Header, b.Bytes()
	}
	auth := map[string]string{"X-API-Key": key}

	// No key, a wrong key.
	for _, h := range []map[string]string{nil, {"X-API-Key": "e2b_" + strings.Repeat("ab", 20)}} {
		code, _, body := do("GET", "/v2/sandboxes", "", h)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if code != 401 || json.Unmarshal(body, &e) != nil || e.Code != 401 || e.Message == "" {
			t.Errorf("list with key %v: %d %s, want 401 {code,message}", h, code, body)
		}
	}
	// Unknown sandbox: 404 on get, kill, timeout.
	for _, c := range [][2]string{{"GET", "/sandboxes/nosuch"}, {"DELETE", "/sandboxes/nosuch"}, {"POST", "/sandboxes/nosuch/timeout"}} {
		if code, _, body := do(c[0], c[1], `{"timeout": 10}`, auth); code != 404 {
			t.Errorf("%s %s: %d %s, want 404", c[0], c[1], code, body)
		}
	}
	// E2B routes Warren does not serve are 501, not 404 (which the SDKs
	// read as "sandbox not found").
	if code, _, body := do("GET", "/sandboxes/nosuch/logs", "", auth); code != 501 {
		t.Errorf("logs: %d %s, want 501", code, body)
	}
	if code, _, body := do("GET", "/sandboxes/nosuch/metrics", "", auth); code != 404 {
		t.Errorf("metrics of an unknown sandbox: %d %s, want 404", code, body)
	}
	if code, _, _ := do("GET", "/no/such/route", "", auth); code != 404 {
		t.Errorf("an unknown route: %d, want 404", code)
	}
	// Create through the older route, as 2.x SDKs before v2 did.
	code, _, body := do("POST", "/sandboxes", fmt.Sprintf(`{"templateID": %q, "timeout": 60, "metadata": {"x": "1"}}`, imageName), auth)
	var sb struct {
		SandboxID, EnvdVersion, EnvdAccessToken string
	}
	if code != 201 || json.Unmarshal(body, &sb) != nil || sb.SandboxID == "" || sb.EnvdAccessToken == "" {
		t.Fatalf("POST /sandboxes: %d %s", code, body)
	}
	for _, r := range sb.SandboxID {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			t.Errorf("sandbox id %q is not [a-z0-9]+", sb.SandboxID)
		}
	}
	code, _, body = do("POST", "/sandboxes", fmt.Sprintf(`{"templateID": %q}`, imageName), auth)
	var other struct{ SandboxID, EnvdAccessToken string }
	if code != 201 || json.Unmarshal(body, &other) != nil {
		t.Fatalf("second create: %d %s", code, body)
	}

	health := func(h map[string]string) int {
		c, _, _ := do("GET", "/health", "", h)
		return c
	}
	if c := health(map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken}); c != 204 {
		t.Errorf("health with the sandbox's token: %d, want 204", c)
	}
	if c := health(map[string]string{"E2b-Sandbox-Id": sb.SandboxID}); c != 401 {
		t.Errorf("health without a token: %d, want 401", c)
	}
	if c := health(map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": other.EnvdAccessToken}); c != 401 {
		t.Errorf("health with another sandbox's token: %d, want 401", c)
	}
	// The host form: PORT-ID.DOMAIN, as wildcard-DNS deployments route.
	if c := health(map[string]string{"Host": "49983-" + sb.SandboxID + ".warren.test", "X-Access-Token": sb.EnvdAccessToken}); c != 204 {
		t.Errorf("health through a PORT-ID.DOMAIN host: %d, want 204", c)
	}
	// A file written and read back over plain /files.
	envd := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/octet-stream"}
	if c, _, b := do("POST", "/files?path=/tmp/x", "raw bytes", envd); c != 200 {
		t.Errorf("POST /files: %d %s", c, b)
	}
	if c, _, b := do("GET", "/files?path=/tmp/x", "", envd); c != 200 || string(b) != "raw bytes" {
		t.Errorf("GET /files: %d %q", c, b)
	}
	if c, _, b := do("GET", "/files?path=/tmp/none", "", envd); c != 404 {
		t.Errorf("GET /files of a missing file: %d %s, want 404", c, b)
	}

	// Fork goes through a checkpoint: 201 where the node can make one,
	// else 501 {code, message} naming it, not a fork that silently lacks
	// its state.
	if c, _, b := do("POST", "/sandboxes/"+sb.SandboxID+"/fork", `{"count": 1}`, auth); c != 201 {
		var e struct {
			Code    int
			Message string
		}
		if c != 501 || json.Unmarshal(b, &e) != nil || e.Code != 501 || !strings.Contains(e.Message, "checkpoint") {
			t.Errorf("fork: %d %s, want 201 or 501 naming the checkpoint", c, b)
		}
	} else {
		var forks []struct{ Sandbox struct{ SandboxID string } }
		if json.Unmarshal(b, &forks) != nil || len(forks) != 1 || forks[0].Sandbox.SandboxID == "" {
			t.Errorf("fork: %s", b)
		} else if c, _, b := do("DELETE", "/sandboxes/"+forks[0].Sandbox.SandboxID, "", auth); c != 204 {
			t.Errorf("kill the fork: %d %s", c, b)
		}
	}

	// A snapshot is a hibernated fork: 201 {snapshotID, names} where the
	// node can checkpoint, else 501 naming the checkpoint, as fork. It is
	// listed by GET /snapshots, not by the sandbox list, and goes with
	// DELETE /templates/{snapshotID} (204, then 404). A filesystem-only
	// snapshot, an unknown snapshot and deleting a template that is an
	// image are refused as such.
	if c, _, b := do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"memory": false}`, auth); c != 501 {
		t.Errorf("filesystem-only snapshot: %d %s, want 501", c, b)
	}
	if c, _, b := do("POST", "/sandboxes", `{"templateID": "snapshot:nosuch"}`, auth); c != 404 {
		t.Errorf("create from an unknown snapshot: %d %s, want 404", c, b)
	}
	if c, _, b := do("DELETE", "/templates/"+imageName, "", auth); c != 501 {
		t.Errorf("delete a template that is an image: %d %s, want 501", c, b)
	}
	if c, _, b := do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{}`, auth); c != 201 {
		var e struct {
			Code    int
			Message string
		}
		if c != 501 || json.Unmarshal(b, &e) != nil || e.Code != 501 || !strings.Contains(e.Message, "checkpoint") {
			t.Errorf("snapshot: %d %s, want 201 or 501 naming the checkpoint", c, b)
		}
	} else {
		var snap struct {
			SnapshotID string
			Names      []string
		}
		if json.Unmarshal(b, &snap) != nil || !strings.HasPrefix(snap.SnapshotID, "snapshot:") || snap.Names == nil {
			t.Fatalf("snapshot: %s", b)
		}
		if c, _, b := do("GET", "/snapshots?sandboxID="+sb.SandboxID, "", auth); c != 200 || !strings.Contains(string(b), snap.SnapshotID) {
			t.Errorf("list snapshots: %d %s, want %s", c, b, snap.SnapshotID)
		}
		if c, _, b := do("GET", "/v2/sandboxes", "", auth); c != 200 || strings.Contains(string(b), strings.TrimPrefix(snap.SnapshotID, "snapshot:")) {
			t.Errorf("the sandbox list shows the snapshot: %d %s", c, b)
		}
		if c, _, b := do("DELETE", "/templates/"+snap.SnapshotID, "", auth); c != 204 {
			t.Errorf("delete snapshot: %d %s, want 204", c, b)
		}
		if c, _, b := do("DELETE", "/templates/"+snap.SnapshotID, "", auth); c != 404 {
			t.Errorf("delete a deleted snapshot: %d %s, want 404", c, b)
		}
	}

	// A command started over envd's Connect stream (JSON codec, HTTP/1.1)
	// runs on across a daemon restart, and the same token reaches it
	// after: tokens are derived from the keys, not kept.
	startBody, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "echo started; sleep 600"}}, "stdin": false})
	frame := make([]byte, 5, 5+len(startBody)) // flags, then the big-endian length
	binary.BigEndian.PutUint32(frame[1:], uint32(len(startBody)))
	frame = append(frame, startBody...)
	req, _ := http.NewRequest("POST", url+"/process.Process/Start", bytes.NewReader(frame))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Two frames: start (pid), then data. The stream is left open.
	var pid float64
	for i := 0; i < 2; i++ {
		var hdr [5]byte
		if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
			t.Fatalf("read frame: %v", err)
		}
		msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(resp.Body, msg); err != nil {
			t.Fatal(err)
		}
		var ev struct {
			Event struct {
				Start *struct{ Pid float64 }
				Data  *struct{ Stdout []byte }
			}
		}
		if err := json.Unmarshal(msg, &ev); err != nil {
			t.Fatalf("frame %s: %v", msg, err)
		}
		switch {
		case i == 0 && ev.Event.Start != nil:
			pid = ev.Event.Start.Pid
		case i == 1 && ev.Event.Data != nil && string(ev.Event.Data.Stdout) == "started\n":
		default:
			t.Fatalf("frame %d: %s", i, msg)
		}
	}
	resp.Body.Close()
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	envdJSON := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken}
	code, _, body = do("POST", "/process.Process/List", "{}", envdJSON)
	var list struct{ Processes []struct{ Pid float64 } }
	if code != 200 || json.Unmarshal(body, &list) != nil || len(list.Processes) != 1 || list.Processes[0].Pid != pid {
		t.Errorf("after a restart, List: %d %s; want the one process %v", code, body, pid)
	}
	if c, _, b := do("GET", "/files?path=/tmp/x", "", envd); c != 200 || string(b) != "raw bytes" {
		t.Errorf("after a restart, GET /files: %d %q", c, b)
	}

	// Listing pages through X-Next-Token.
	_, h, body := do("GET", "/v2/sandboxes?limit=1", "", auth)
	var page []struct{ SandboxID string }
	if json.Unmarshal(body, &page) != nil || len(page) != 1 || h.Get("X-Next-Token") == "" {
		t.Fatalf("first page: %s, next %q", body, h.Get("X-Next-Token"))
	}
	_, h2, body := do("GET", "/v2/sandboxes?limit=1&nextToken="+h.Get("X-Next-Token"), "", auth)
	var page2 []struct{ SandboxID string }
	if json.Unmarshal(body, &page2) != nil || len(page2) != 1 || page2[0].SandboxID == page[0].SandboxID || h2.Get("X-Next-Token") != "" {
		t.Errorf("second page: %s, next %q", body, h2.Get("X-Next-Token"))
	}

	for _, id := range []string{sb.SandboxID, other.SandboxID} {
		if c, _, b := do("DELETE", "/sandboxes/"+id, "", auth); c != 204 {
			t.Errorf("kill %s: %d %s", id, c, b)
		}
	}
	// Gone: /health says "was not found" with 502 (the SDKs' "killed or
	// timed out"), file calls are not found.
	code, _, body = do("GET", "/health", "", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken})
	if code != 502 || !strings.Contains(string(body), "was not found") {
		t.Errorf("health of a killed sandbox: %d %s, want 502 ... was not found", code, body)
	}
	if c, _, _ := do("GET", "/files?path=/tmp/x", "", envd); c != 404 {
		t.Errorf("GET /files of a killed sandbox: %d, want 404", c)
	}
}

// TestE2BJSSDK: the official E2B JavaScript SDK (sdk/js_e2b, on Node)
// runs the same core flow unchanged: create, commands (output, exit code
// raising, env, cwd, background, list, kill), files (text, binary,
// exists, mkdir, list, rename, remove), list by metadata, set_timeout,
// pause and connect, kill.
func TestE2BJSSDK(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not installed (scripts/deps.sh)")
	}
	e, url, key := startE2B(t)
	src, err := filepath.Abs("../../sdk/js_e2b")
	if err != nil {
		t.Fatal(err)
	}
	// The script runs next to its node_modules (ES modules ignore
	// NODE_PATH).
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(e2bSDK(t, "js"), "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(src, "core_flow.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "core_flow.mjs"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "core_flow.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key, "WARREN_E2B_TEMPLATE="+imageName)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("JS SDK OK")) {
		t.Fatalf("the E2B JS SDK flow failed: %v\n%s\n(daemon log: %s)", err, out, e.logPath)
	}
}

// TestE2BHibernate: on a node that can checkpoint its sandboxes (CRIU
// 4.1), E2B's pause is a hibernation (the
// sandbox holds nothing on the node: HIBERNATED), connect restores it
// (201) with its files and processes, and fork copies a running sandbox;
// through the REST API and through the E2B Python SDK.
func TestE2BHibernate(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	if _, err := os.Stat("/opt/warren/criu/bin/criu"); err != nil {
		t.Skipf("no CRIU >= 4.2 at /opt/warren/criu (scripts/criu.sh installs it): %v", err)
	}
	key := make([]byte, 20)
	_, _ = rand.Read(key)
	keyText := "e2b_" + hex.EncodeToString(key)
	keyFile := filepath.Join(t.TempDir(), "e2b-keys")
	if err := os.WriteFile(keyFile, []byte(keyText+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr(t)
	url := "http://" + addr
	e := newEnv(t, envOptions{serveArgs: []string{"--e2b-addr", addr, "--e2b-api-key-file", keyFile}})
	ctx := ctxFor(t, 3*time.Minute)

	rest := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", keyText)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, body := rest("POST", "/v2/sandboxes", fmt.Sprintf(`{"templateID": %q}`, imageName))
	var sb struct{ SandboxID string }
	if code != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := rest("POST", "/sandboxes/"+sb.SandboxID+"/pause", ""); code != 204 {
		t.Fatalf("pause: %d %s", code, body)
	}
	if got, err := e.c.Get(ctx, sb.SandboxID); err != nil || got.State != warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED {
		t.Fatalf("after pause: %v, %v; want HIBERNATED", got.GetState(), err)
	}
	if code, body := rest("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout": 60}`); code != 201 {
		t.Fatalf("connect: %d %s, want 201 (resumed)", code, body)
	}
	if got, err := e.c.Get(ctx, sb.SandboxID); err != nil || got.State != warrenv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("after connect: %v, %v; want RUNNING", got.GetState(), err)
	}
	if code, body := rest("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", ""); code != 200 {
		t.Errorf("connect to a running sandbox: %d %s, want 200", code, body)
	}
	if code, body := rest("DELETE", "/sandboxes/"+sb.SandboxID, ""); code != 204 {
		t.Errorf("kill: %d %s", code, body)
	}

	py := filepath.Join(e2bSDK(t, "py-newest"), "bin", "python")
	suite, err := filepath.Abs(filepath.Join(e2bSuite, "hibernate"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "pytest", "-p", "no:cacheprovider", "-rfEs", "-v", suite)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+keyText, "WARREN_E2B_TEMPLATE="+imageName)
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil || !bytes.Contains(out, []byte("4 passed")) {
		t.Fatalf("the E2B SDK hibernate suite failed: %v (daemon log: %s)", err, e.logPath)
	}
}

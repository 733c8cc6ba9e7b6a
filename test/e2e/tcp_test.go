package e2e

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/testutil"
)

var tcpListenRE = regexp.MustCompile(`msg=listening addr=(\S+) network=tcp`)

// TestTCPToken serves the API on TCP with a bearer token: calls without
// it or with a wrong one are Unauthenticated, calls with it work.
func TestTCPToken(t *testing.T) {
	t.Parallel()
	const token = "e2e-secret-token-0123456789"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{serveArgs: []string{"--listen", "127.0.0.1:0", "--token-file", tokenFile}})
	ctx := ctxFor(t, 2*time.Minute)

	m := tcpListenRE.FindStringSubmatch(e.logTail(1000))
	if m == nil {
		t.Fatalf("no TCP listener in the daemon log:\n%s", e.logTail(20))
	}
	addr := m[1]
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("TCP listener on %s", addr)
	}

	e.create(&warrenv1.CreateRequest{Id: "tcp1"})
	clients := map[string][]client.Option{
		"no token":           {client.WithToken("")},
		"wrong token":        {client.WithToken("wrong")},
		"prefix of token":    {client.WithToken(token[:10])},
		"token with a space": {client.WithToken(token + " x")},
		"no token, HTTP/1":   {client.WithToken(""), client.WithHTTP1()},
		"wrong token HTTP/1": {client.WithToken("wrong"), client.WithHTTP1()},
	}
	for name, opts := range clients {
		c, err := client.New("http://"+addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Version(ctx)
		wantCategory(t, err, client.CategoryUnauthenticated, name+": Version")
		_, err = c.Get(ctx, "tcp1")
		wantCategory(t, err, client.CategoryUnauthenticated, name+": Get")
		_, err = c.Create(ctx, &warrenv1.CreateRequest{Id: "intruder", Image: imageName})
		wantCategory(t, err, client.CategoryUnauthenticated, name+": Create")
		_, err = c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "tcp1", Argv: []string{"true"}})
		wantCategory(t, err, client.CategoryUnauthenticated, name+": Exec")
		_, err = c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "tcp1", Argv: []string{"true"}}, nil)
		wantCategory(t, err, client.CategoryUnauthenticated, name+": ExecStream")
		err = c.Delete(ctx, "tcp1")
		wantCategory(t, err, client.CategoryUnauthenticated, name+": Delete")
		_, err = c.Download(ctx, "tcp1", "/etc")
		wantCategory(t, err, client.CategoryUnauthenticated, name+": Download")
		err = c.Upload(ctx, "tcp1", "/tmp", bytes.NewReader(emptyTar()))
		wantCategory(t, err, client.CategoryUnauthenticated, name+": Upload")
		_, err = c.ImportImageTar(ctx, "intruder", bytes.NewReader(emptyTar()))
		wantCategory(t, err, client.CategoryUnauthenticated, name+": ImportImageTar")
		c.Close()
	}
	// Nothing the rejected calls asked for happened.
	if sbs, err := e.c.List(ctx, nil); err != nil || len(sbs) != 1 || sbs[0].Id != "tcp1" {
		t.Errorf("after rejected calls: %v %v", sbs, err)
	}
	if _, err := e.c.GetImage(ctx, "intruder"); !client.IsNotFound(err) {
		t.Errorf("rejected image upload: %v", err)
	}

	// Plain HTTP: health is open, metrics and RPCs need the token.
	hc := &http.Client{Timeout: 10 * time.Second}
	get := func(path, auth string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("/healthz", ""); got != http.StatusOK {
		t.Errorf("GET /healthz without a token: %d", got)
	}
	for _, auth := range []string{"", "Bearer wrong", "Basic " + token, token, "Bearer"} {
		if got := get("/metrics", auth); got != http.StatusUnauthorized {
			t.Errorf("GET /metrics with Authorization %q: %d, want 401", auth, got)
		}
	}
	if got := get("/metrics", "Bearer "+token); got != http.StatusOK {
		t.Errorf("GET /metrics with the token: %d", got)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/warren.v1.SandboxService/List", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "unauthenticated") {
		t.Errorf("raw connect call without a token: HTTP %d %s", resp.StatusCode, body)
	}

	// With the token everything works, over gRPC (h2c) and HTTP/1.
	for name, opts := range map[string][]client.Option{
		"gRPC":   {client.WithToken(token)},
		"HTTP/1": {client.WithToken(token), client.WithHTTP1()},
	} {
		c, err := client.New("http://"+addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Version(ctx); err != nil {
			t.Errorf("%s: version with the token: %v", name, err)
		}
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: "tcp1", Shell: "echo over tcp"})
		if err != nil || string(res.Stdout) != "over tcp\n" {
			t.Errorf("%s: exec with the token: %v %v", name, res, err)
		}
		var streamed []byte
		if _, err := c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: "tcp1", Shell: "echo s"}, func(ev *warrenv1.ExecEvent) error {
			streamed = append(streamed, ev.GetStdout()...)
			return nil
		}); err != nil || string(streamed) != "s\n" {
			t.Errorf("%s: stream with the token: %q %v", name, streamed, err)
		}
		if err := c.Upload(ctx, "tcp1", "/tmp", bytes.NewReader(emptyTar())); err != nil {
			t.Errorf("%s: upload with the token: %v", name, err)
		}
		rc, err := c.Download(ctx, "tcp1", "/etc/passwd")
		if err != nil {
			t.Errorf("%s: download with the token: %v", name, err)
		} else {
			rc.Close()
		}
		id := "tcp-" + strings.ToLower(strings.ReplaceAll(name, "/", ""))
		if _, err := c.Create(ctx, &warrenv1.CreateRequest{Id: id, Image: imageName}); err != nil {
			t.Errorf("%s: create with the token: %v", name, err)
		} else if err := c.Delete(ctx, id); err != nil {
			t.Errorf("%s: delete with the token: %v", name, err)
		}
		c.Close()
	}

	// The CLI takes the token from $WARREN_TOKEN.
	out, stderr, code := runCLI(t, e.bin, []string{"WARREN_TOKEN=" + token}, nil, "--addr", "http://"+addr, "sandbox", "exec", "tcp1", "echo", "cli")
	if code != 0 || out != "cli\n" {
		t.Errorf("CLI with the token: exit %d %q %s", code, out, stderr)
	}
	_, stderr, code = runCLI(t, e.bin, []string{"WARREN_TOKEN=wrong"}, nil, "--addr", "http://"+addr, "sandbox", "ls")
	if code != 1 || !strings.Contains(stderr, "unauthenticated") {
		t.Errorf("CLI with a wrong token: exit %d %q", code, stderr)
	}
	_, stderr, code = runCLI(t, e.bin, []string{"WARREN_TOKEN="}, nil, "--addr", "http://"+addr, "sandbox", "ls")
	if code != 1 || !strings.Contains(stderr, "unauthenticated") {
		t.Errorf("CLI without a token: exit %d %q", code, stderr)
	}
	// The unix socket needs none.
	if _, err := e.c.Version(ctx); err != nil {
		t.Errorf("unix socket: %v", err)
	}
	if err := e.c.Delete(ctx, "tcp1"); err != nil {
		t.Fatal(err)
	}
}

// TestTCPRefusedWithoutToken: --listen without a token does not start.
func TestTCPRefusedWithoutToken(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	bin := testutil.StaticBinary(t, "./cmd/warren")
	dir := t.TempDir()
	_, stderr, code := runCLI(t, bin, []string{"WARREN_TOKEN="}, nil, "serve",
		"--state-dir", filepath.Join(dir, "state"), "--run-dir", filepath.Join(dir, "run"),
		"--socket", filepath.Join(dir, "s.sock"), "--cgroup-parent", "warren-e2e-refused",
		"--listen", "127.0.0.1:0")
	if code == 0 || !strings.Contains(stderr, "token") {
		t.Errorf("serve --listen without a token: exit %d %q", code, stderr)
	}
	empty := filepath.Join(dir, "empty-token")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = runCLI(t, bin, nil, nil, "serve",
		"--state-dir", filepath.Join(dir, "state"), "--run-dir", filepath.Join(dir, "run"),
		"--socket", filepath.Join(dir, "s.sock"), "--cgroup-parent", "warren-e2e-refused",
		"--listen", "127.0.0.1:0", "--token-file", empty)
	if code == 0 || !strings.Contains(stderr, "empty") {
		t.Errorf("serve --listen with an empty token file: exit %d %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); err == nil {
		t.Errorf("a daemon that refused to start created its state directory")
	}
}

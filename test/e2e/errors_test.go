package e2e

import (
	"archive/tar"
	"bytes"
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

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestBadInput checks that bad requests get the right category and status
// and leave nothing behind.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	c := e.c
	ctx := ctxFor(t, 3*time.Minute)

	t.Run("create", func(t *testing.T) {
		cases := []struct {
			name string
			req  *warrenv1.CreateRequest
			want client.Category
		}{
			{"unknown image", &warrenv1.CreateRequest{Id: "x1", Image: "no-such-image"}, client.CategoryNotFound},
			{"no image", &warrenv1.CreateRequest{Id: "x2"}, client.CategoryInvalid},
			{"id ../x", &warrenv1.CreateRequest{Id: "../x", Image: imageName}, client.CategoryInvalid},
			{"id with slash", &warrenv1.CreateRequest{Id: "a/b", Image: imageName}, client.CategoryInvalid},
			{"id upper case", &warrenv1.CreateRequest{Id: "ABC", Image: imageName}, client.CategoryInvalid},
			{"id too long", &warrenv1.CreateRequest{Id: strings.Repeat("a", 64), Image: imageName}, client.CategoryInvalid},
			{"memory 1 byte", &warrenv1.CreateRequest{Id: "x3", Image: imageName, Resources: &warrenv1.Resources{MemoryBytes: 1}}, client.CategoryInvalid},
			{"memory negative", &warrenv1.CreateRequest{Id: "x4", Image: imageName, Resources: &warrenv1.Resources{MemoryBytes: -1}}, client.CategoryInvalid},
			{"memory 2 TiB", &warrenv1.CreateRequest{Id: "x5", Image: imageName, Resources: &warrenv1.Resources{MemoryBytes: 2 << 40}}, client.CategoryInvalid},
			{"pids 1", &warrenv1.CreateRequest{Id: "x6", Image: imageName, Resources: &warrenv1.Resources{PidsMax: 1}}, client.CategoryInvalid},
			{"cpu negative", &warrenv1.CreateRequest{Id: "x7", Image: imageName, Resources: &warrenv1.Resources{CpuMillis: -5}}, client.CategoryInvalid},
			{"cpu 1000 cores", &warrenv1.CreateRequest{Id: "x8", Image: imageName, Resources: &warrenv1.Resources{CpuMillis: 1000000}}, client.CategoryInvalid},
			{"timeout negative", &warrenv1.CreateRequest{Id: "x9", Image: imageName, TimeoutSeconds: -1}, client.CategoryInvalid},
			{"timeout 10 days", &warrenv1.CreateRequest{Id: "x10", Image: imageName, TimeoutSeconds: 864000}, client.CategoryInvalid},
			{"relative workdir", &warrenv1.CreateRequest{Id: "x11", Image: imageName, Workdir: "tmp"}, client.CategoryInvalid},
			{"env with =", &warrenv1.CreateRequest{Id: "x12", Image: imageName, Env: map[string]string{"A=B": "c"}}, client.CategoryInvalid},
			{"hostname with /", &warrenv1.CreateRequest{Id: "x13", Image: imageName, Hostname: "a/b"}, client.CategoryInvalid},
			{"unknown backend", &warrenv1.CreateRequest{Id: "x14", Image: imageName, Backend: "vm"}, client.CategoryInvalid},
		}
		for _, tc := range cases {
			_, err := c.Create(ctx, tc.req)
			wantCategory(t, err, tc.want, tc.name)
		}
		sbs, err := c.List(ctx, nil)
		if err != nil || len(sbs) != 0 {
			t.Errorf("list after failed creates: %v %v", sbs, err)
		}
		e.expectBaseline("after failed creates")
		if _, err := os.Stat(filepath.Join(e.runDir, "x")); err == nil {
			t.Errorf("id ../x created %s", filepath.Join(e.runDir, "x"))
		}
	})

	// One sandbox for the rest.
	const id = "bad"
	e.create(&warrenv1.CreateRequest{Id: id})

	t.Run("duplicate id", func(t *testing.T) {
		_, err := c.Create(ctx, &warrenv1.CreateRequest{Id: id, Image: imageName})
		wantCategory(t, err, client.CategoryConflict, "duplicate id")
		if !client.IsAlreadyExists(err) {
			t.Errorf("duplicate id: code %v, want already_exists", connect.CodeOf(err))
		}
		// Concurrent creates of one id: exactly one wins.
		errs := make(chan error, 6)
		for range 6 {
			go func() {
				_, err := c.Create(ctx, &warrenv1.CreateRequest{Id: "race", Image: imageName})
				errs <- err
			}()
		}
		wins := 0
		for range 6 {
			if err := <-errs; err == nil {
				wins++
			} else if !client.IsAlreadyExists(err) {
				t.Errorf("concurrent create of one id: %v", err)
			}
		}
		if wins != 1 {
			t.Errorf("%d concurrent creates of one id succeeded", wins)
		}
		if err := c.Delete(ctx, "race"); err != nil {
			t.Error(err)
		}
		e.expectNoResources("race", "after deleting the raced id")
		// The original is untouched.
		e.shOK(id, "true")
		sbs, _ := c.List(ctx, nil)
		if len(sbs) != 1 {
			t.Errorf("%d sandboxes after a duplicate create", len(sbs))
		}
	})

	t.Run("unknown sandbox", func(t *testing.T) {
		const no = "nosuch"
		calls := map[string]func() error{
			"Get":    func() error { _, err := c.Get(ctx, no); return err },
			"Delete": func() error { return c.Delete(ctx, no) },
			"ExtendTimeout": func() error {
				_, err := c.ExtendTimeout(ctx, no, time.Minute)
				return err
			},
			"Exec": func() error {
				_, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: no, Argv: []string{"true"}})
				return err
			},
			"Exec with idempotency key": func() error {
				_, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: no, Argv: []string{"true"}, IdempotencyKey: "k"})
				return err
			},
			"ExecStream": func() error {
				_, err := c.ExecStream(ctx, &warrenv1.ExecRequest{SandboxId: no, Argv: []string{"true"}}, nil)
				return err
			},
			"StartProcess": func() error {
				_, err := c.StartProcess(ctx, &warrenv1.ExecRequest{SandboxId: no, Argv: []string{"true"}})
				return err
			},
			"ListProcesses": func() error { _, err := c.ListProcesses(ctx, no); return err },
			"WaitProcess": func() error {
				_, err := c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: no, ProcessId: "p-1"})
				return err
			},
			"SignalProcess": func() error {
				return c.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: no, ProcessId: "p-1"})
			},
			"WriteStdin": func() error {
				return c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: no, ProcessId: "p-1", Data: []byte("x")})
			},
			"WriteFile": func() error {
				return c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: no, Path: "/f", Content: []byte("x")})
			},
			"ReadFile": func() error {
				_, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: no, Path: "/etc/passwd"})
				return err
			},
			"ListFiles": func() error { _, err := c.ListFiles(ctx, no, "/"); return err },
			"StatFile":  func() error { _, err := c.StatFile(ctx, no, "/"); return err },
			"MakeDir": func() error {
				return c.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: no, Path: "/d"})
			},
			"RemoveFile": func() error {
				return c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: no, Path: "/etc"})
			},
			"Upload": func() error { return c.Upload(ctx, no, "/tmp", bytes.NewReader(emptyTar())) },
			"Download": func() error {
				rc, err := c.Download(ctx, no, "/etc")
				if err == nil {
					rc.Close()
				}
				return err
			},
			"GetImage":    func() error { _, err := c.GetImage(ctx, "no-such-image"); return err },
			"RemoveImage": func() error { return c.RemoveImage(ctx, "no-such-image") },
		}
		for name, call := range calls {
			wantCategory(t, call(), client.CategoryNotFound, name)
		}
		// Unknown processes of a known sandbox.
		_, err := c.WaitProcess(ctx, &warrenv1.WaitProcessRequest{SandboxId: id, ProcessId: "p-42"})
		wantCategory(t, err, client.CategoryNotFound, "WaitProcess of an unknown process")
		err = c.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: id, ProcessId: "p-42"})
		wantCategory(t, err, client.CategoryNotFound, "SignalProcess of an unknown process")
		err = c.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: "p-42", Data: []byte("x")})
		wantCategory(t, err, client.CategoryNotFound, "WriteStdin of an unknown process")
	})

	t.Run("bad exec", func(t *testing.T) {
		cases := []struct {
			name string
			req  *warrenv1.ExecRequest
			want client.Category
		}{
			{"missing binary", &warrenv1.ExecRequest{Argv: []string{"no-such-binary"}}, client.CategoryNotFound},
			{"missing absolute binary", &warrenv1.ExecRequest{Argv: []string{"/bin/no-such-binary"}}, client.CategoryNotFound},
			{"unknown user", &warrenv1.ExecRequest{Argv: []string{"true"}, User: "no-such-user"}, client.CategoryInvalid},
			{"unknown group", &warrenv1.ExecRequest{Argv: []string{"true"}, User: "nobody:no-such-group"}, client.CategoryInvalid},
			{"bad user syntax", &warrenv1.ExecRequest{Argv: []string{"true"}, User: "a:b:c"}, client.CategoryInvalid},
			{"no command", &warrenv1.ExecRequest{}, client.CategoryInvalid},
			{"argv and shell", &warrenv1.ExecRequest{Argv: []string{"true"}, Shell: "true"}, client.CategoryInvalid},
			{"relative cwd", &warrenv1.ExecRequest{Argv: []string{"true"}, Cwd: "tmp"}, client.CategoryInvalid},
			{"negative timeout", &warrenv1.ExecRequest{Argv: []string{"true"}, TimeoutMs: -1}, client.CategoryInvalid},
			{"negative output limit", &warrenv1.ExecRequest{Argv: []string{"true"}, OutputLimitBytes: -1}, client.CategoryInvalid},
			{"huge output limit", &warrenv1.ExecRequest{Argv: []string{"true"}, OutputLimitBytes: 1 << 40}, client.CategoryInvalid},
			{"env with NUL", &warrenv1.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A": "x\x00y"}}, client.CategoryInvalid},
		}
		for _, tc := range cases {
			tc.req.SandboxId = id
			_, err := c.Exec(ctx, tc.req)
			wantCategory(t, err, tc.want, "exec: "+tc.name)
			_, err = c.StartProcess(ctx, tc.req)
			wantCategory(t, err, tc.want, "start process: "+tc.name)
		}
		// A missing cwd.
		_, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"true"}, Cwd: "/no/such/dir"})
		if err == nil {
			t.Errorf("exec in a missing cwd succeeded")
		} else if cat := client.CategoryOf(err); cat != client.CategoryNotFound && cat != client.CategoryInvalid {
			t.Errorf("exec in a missing cwd: %v", err)
		}
		err = c.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: id, ProcessId: "p-1", Signal: 999})
		wantCategory(t, err, client.CategoryInvalid, "signal 999")
		// Nothing failed left a process behind.
		procs, _ := c.ListProcesses(ctx, id)
		for _, p := range procs {
			if p.Running {
				t.Errorf("process left running: %v", p)
			}
		}
		// Only the init is left in the sandbox.
		if err := e.waitProcs(id, func(n int) bool { return n == 1 }, 10*time.Second); err != nil {
			t.Errorf("after failed execs: %v", err)
		}
	})

	t.Run("path escapes", func(t *testing.T) {
		hostShadow, err := os.ReadFile("/etc/shadow")
		if err != nil || len(hostShadow) == 0 {
			t.Skipf("no host /etc/shadow to compare with: %v", err)
		}
		isHost := func(b []byte) bool { return len(b) > 0 && bytes.Contains(b, hostShadow[:min(len(hostShadow), 64)]) }
		readOK := func(path string) {
			t.Helper()
			rd, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: path})
			switch {
			case err == nil && isHost(rd.Content):
				t.Errorf("read %q returned the host's /etc/shadow", path)
			case err == nil && string(rd.Content) != "SANDBOX-SHADOW\n":
				t.Errorf("read %q = %q, want the sandbox's own file", path, rd.Content)
			case err != nil && client.CategoryOf(err) != client.CategoryNotFound && client.CategoryOf(err) != client.CategoryInvalid:
				t.Errorf("read %q: %v", path, err)
			}
		}
		// The busybox image has no /etc/shadow: escapes are not_found.
		for _, p := range []string{"/../../../etc/shadow", "/../../../../../../../../etc/shadow", "../../../etc/shadow", "/tmp/../../etc/shadow"} {
			rd, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: p})
			if err == nil {
				if isHost(rd.Content) {
					t.Errorf("read %q returned the host's /etc/shadow", p)
				} else {
					t.Errorf("read %q returned %q though the sandbox has no /etc/shadow", p, rd.Content)
				}
				continue
			}
			if cat := client.CategoryOf(err); cat != client.CategoryNotFound && cat != client.CategoryInvalid {
				t.Errorf("read %q: %v", p, err)
			}
		}
		e.shOK(id, "ln -s /etc/shadow /tmp/abs; ln -s ../../../../../../../../etc/shadow /tmp/rel; ln -s /etc /tmp/etcdir")
		for _, p := range []string{"/tmp/abs", "/tmp/rel", "/tmp/etcdir/shadow"} {
			_, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: p})
			wantCategory(t, err, client.CategoryNotFound, "read through symlink "+p+" before the sandbox has a shadow file")
		}
		e.shOK(id, "echo SANDBOX-SHADOW > /etc/shadow")
		for _, p := range []string{"/../../../etc/shadow", "/tmp/abs", "/tmp/rel", "/tmp/etcdir/shadow", "/tmp/etcdir/../../../etc/shadow"} {
			readOK(p)
		}
		// Stat and list resolve inside too.
		if fi, err := c.StatFile(ctx, id, "/tmp/etcdir/shadow"); err != nil || fi.Size != int64(len("SANDBOX-SHADOW\n")) {
			t.Errorf("stat through a symlinked dir: %v %v", fi, err)
		}
		// The archive of a symlink is the link, not the host file.
		rc, err := c.Download(ctx, id, "/tmp/abs")
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			if isHost(b) {
				t.Errorf("download of a symlink to /etc/shadow returned the host's file")
			}
		}
		rc, err = c.Download(ctx, id, "/tmp/etcdir/")
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			if isHost(b) {
				t.Errorf("download of a symlink to /etc returned the host's shadow file")
			}
		}

		// Writes never land on the host.
		hostDir := t.TempDir()
		marker := filepath.Join(hostDir, "pwned")
		e.shOK(id, fmt.Sprintf("ln -s %s /tmp/hostdir; ln -s %s /tmp/hostfile", hostDir, marker))
		writes := []string{
			"/../../../.." + marker,
			"../../../.." + marker,
			"/tmp/hostfile",
			"/tmp/hostdir/pwned",
		}
		for _, p := range writes {
			err := c.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: p, Content: []byte("x"), MakeParents: true})
			if err != nil && client.CategoryOf(err) != client.CategoryInvalid && client.CategoryOf(err) != client.CategoryNotFound {
				t.Errorf("write %q: %v", p, err)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("write %q created %s on the host", p, marker)
				os.Remove(marker)
			}
		}
		for _, p := range []string{"/tmp/hostdir/newdir", "/../../.." + hostDir + "/newdir"} {
			_ = c.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: id, Path: p, Parents: true})
			if _, err := os.Stat(filepath.Join(hostDir, "newdir")); err == nil {
				t.Errorf("mkdir %q created a directory on the host", p)
			}
		}
		// Remove through a symlinked directory must not touch the host.
		if err := os.WriteFile(filepath.Join(hostDir, "keep"), []byte("k"), 0o644); err != nil {
			t.Fatal(err)
		}
		_ = c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: id, Path: "/tmp/hostdir/keep"})
		_ = c.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: id, Path: "/../../.." + hostDir + "/keep"})
		if _, err := os.Stat(filepath.Join(hostDir, "keep")); err != nil {
			t.Errorf("remove through a symlink deleted a host file: %v", err)
		}
		// Tar uploads with .. entries, absolute names and symlink tricks.
		evil := func(hdrs ...*tar.Header) []byte {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range hdrs {
				if h.Typeflag == tar.TypeReg {
					h.Size = 1
				}
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				if h.Typeflag == tar.TypeReg {
					tw.Write([]byte("x"))
				}
			}
			tw.Close()
			return buf.Bytes()
		}
		tars := map[string][]byte{
			"dotdot":            evil(&tar.Header{Typeflag: tar.TypeReg, Name: "../../../../../../.." + marker, Mode: 0o644}),
			"absolute":          evil(&tar.Header{Typeflag: tar.TypeReg, Name: marker, Mode: 0o644}),
			"symlink then file": evil(&tar.Header{Typeflag: tar.TypeSymlink, Name: "esc", Linkname: hostDir}, &tar.Header{Typeflag: tar.TypeReg, Name: "esc/pwned", Mode: 0o644}),
			"hardlink to host":  evil(&tar.Header{Typeflag: tar.TypeLink, Name: "hl", Linkname: "/../../../../etc/shadow"}),
		}
		for name, b := range tars {
			err := c.Upload(ctx, id, "/tmp/up-"+strings.ReplaceAll(name, " ", "-"), bytes.NewReader(b))
			if err != nil && client.CategoryOf(err) != client.CategoryInvalid && client.CategoryOf(err) != client.CategoryNotFound {
				t.Errorf("upload %s: %v", name, err)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("upload %s created %s on the host", name, marker)
				os.Remove(marker)
			}
		}
		// A hard link that made it in must not be the host's shadow.
		if rd, err := c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: "/tmp/up-hardlink-to-host/hl"}); err == nil && isHost(rd.Content) {
			t.Errorf("uploaded hard link reads the host's /etc/shadow")
		}
		// Exec cannot leave the root either.
		res, err := c.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: "cat /etc/shadow; ls " + hostDir + " 2>&1; pwd", Cwd: "/../../.."})
		if err != nil {
			t.Fatal(err)
		}
		if isHost(res.Stdout) || !strings.HasSuffix(string(res.Stdout), "\n/\n") {
			t.Errorf("exec in /../../..: %q", res.Stdout)
		}
	})

	t.Run("raw connect JSON", func(t *testing.T) {
		hc := e.rawHTTP()
		post := func(proc, body string) (int, string, http.Header) {
			t.Helper()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://warren/warren.v1.SandboxService/"+proc, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), resp.Header
		}
		type connectErr struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		check := func(name string, status int, body string, wantStatus int, wantCode string) {
			t.Helper()
			var ce connectErr
			if err := json.Unmarshal([]byte(body), &ce); err != nil {
				t.Errorf("%s: body %q is not a JSON error: %v", name, body, err)
			}
			if status != wantStatus || ce.Code != wantCode {
				t.Errorf("%s: HTTP %d code %q (%s), want HTTP %d code %q", name, status, ce.Code, ce.Message, wantStatus, wantCode)
			}
		}
		for name, body := range map[string]string{
			"truncated":   `{"image": "bb"`,
			"not JSON":    `this is not json`,
			"wrong type":  `{"image": 42}`,
			"wrong shape": `[1, 2, 3]`,
		} {
			status, b, _ := post("Create", body)
			check("create with "+name+" JSON", status, b, http.StatusBadRequest, "invalid_argument")
		}
		status, b, h := post("Create", `{"id": "../x", "image": "bb"}`)
		check("create with a bad id", status, b, http.StatusBadRequest, "invalid_argument")
		if got := h.Get(client.CategoryHeader); got != "invalid" {
			t.Errorf("category header %q, want invalid", got)
		}
		status, b, h = post("Get", `{"id": "nosuch"}`)
		check("get of an unknown sandbox", status, b, http.StatusNotFound, "not_found")
		if got := h.Get(client.CategoryHeader); got != "not_found" {
			t.Errorf("category header %q, want not_found", got)
		}
		status, b, _ = post("Create", `{"id": "bad", "image": "bb"}`)
		check("create of a duplicate id", status, b, http.StatusConflict, "already_exists")
		// The same with curl itself, where it is installed.
		if curl, err := exec.LookPath("curl"); err == nil {
			out, err := exec.CommandContext(ctx, curl, "-sS", "--unix-socket", e.sock,
				"-H", "Content-Type: application/json", "-d", `{"image": `,
				"-w", "\nHTTP %{http_code}", "http://warren/warren.v1.SandboxService/Create").CombinedOutput()
			if err != nil || !strings.Contains(string(out), `"code":"invalid_argument"`) || !strings.HasSuffix(string(out), "HTTP 400") {
				t.Errorf("curl with bad JSON: %v\n%s", err, out)
			}
		}
		// A good request works on the same endpoint.
		status, b, _ = post("Exec", `{"sandboxId": "bad", "argv": ["echo", "raw"]}`)
		if status != http.StatusOK || !strings.Contains(b, `"stdout":"cmF3Cg=="`) {
			t.Errorf("raw exec: HTTP %d %s", status, b)
		}
		// Archive endpoints: plain JSON errors.
		for _, tc := range []struct {
			method, url string
			want        int
		}{
			{http.MethodGet, "http://warren/v1/sandboxes/nosuch/archive?path=/etc", http.StatusNotFound},
			{http.MethodGet, "http://warren/v1/sandboxes/bad/archive", http.StatusBadRequest},
			{http.MethodGet, "http://warren/v1/sandboxes/bad/archive?path=/no/such", http.StatusNotFound},
			{http.MethodPut, "http://warren/v1/sandboxes/bad/archive?path=/tmp", http.StatusBadRequest},
		} {
			req, _ := http.NewRequestWithContext(ctx, tc.method, tc.url, strings.NewReader("definitely not a tar archive, but long enough to look at: "+strings.Repeat("x", 1024)))
			req.Header.Set("Content-Type", "application/x-tar")
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s %s: HTTP %d %s, want %d", tc.method, tc.url, resp.StatusCode, b, tc.want)
			}
		}
		// The daemon still works.
		e.shOK(id, "true")
	})

	t.Run("nothing left", func(t *testing.T) {
		if err := c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		sbs, err := c.List(ctx, nil)
		if err != nil || len(sbs) != 0 {
			t.Errorf("list: %v %v", sbs, err)
		}
		e.expectBaseline("after the bad requests")
	})
}

func emptyTar() []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.Close()
	return buf.Bytes()
}

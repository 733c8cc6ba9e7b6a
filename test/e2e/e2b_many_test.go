package e2e

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/testutil"
)

// TestE2BManyCommands: an agent loop runs more commands in one sandbox
// than a sandbox holds background processes at once (every E2B command is
// one): 1,400 commands over envd's Connect stream, one after another, past
// the 1,024 running processes of MaxProcessesPerSandbox and the 1,280
// records the daemon keeps, each with its output and exit code. Before
// exited processes were forgotten, the 1,025th Start was refused (429).
func TestE2BManyCommands(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	const n = 1400
	_, url, key := startE2B(t)

	req, _ := http.NewRequest("POST", url+"/sandboxes", strings.NewReader(fmt.Sprintf(`{"templateID": %q}`, imageName)))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct{ SandboxID, EnvdAccessToken string }
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}

	// run runs one command as the SDKs do (Start, a server stream of
	// Connect frames: start, data, end) and returns its stdout and exit
	// code.
	run := func(i int) (string, int) {
		start, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", fmt.Sprintf("echo %d; exit %d", i, i%7)}}, "stdin": false})
		frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(start)))
		req, _ := http.NewRequest("POST", url+"/process.Process/Start", bytes.NewReader(append(frame, start...)))
		req.Header.Set("Content-Type", "application/connect+json")
		req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
		req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("command %d: %d %s", i, resp.StatusCode, b)
		}
		var stdout []byte
		code := -1
		for {
			var hdr [5]byte
			if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
				t.Fatalf("command %d: read frame: %v", i, err)
			}
			msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
			if _, err := io.ReadFull(resp.Body, msg); err != nil {
				t.Fatalf("command %d: %v", i, err)
			}
			if hdr[0]&2 != 0 { // end of stream: {} or an error
				if string(msg) != "{}" {
					t.Fatalf("command %d: stream ended with %s", i, msg)
				}
				return string(stdout), code
			}
			var ev struct {
				Event struct {
					Data *struct{ Stdout []byte }
					End  *struct {
						ExitCode int
						Exited   bool
					}
				}
			}
			if err := json.Unmarshal(msg, &ev); err != nil {
				t.Fatalf("command %d: frame %s: %v", i, msg, err)
			}
			if d := ev.Event.Data; d != nil {
				stdout = append(stdout, d.Stdout...)
			}
			if e := ev.Event.End; e != nil {
				code = e.ExitCode
			}
		}
	}
	for i := range n {
		out, code := run(i)
		if out != strconv.Itoa(i)+"\n" || code != i%7 {
			t.Fatalf("command %d: stdout %q, exit %d; want %q, %d", i, out, code, strconv.Itoa(i)+"\n", i%7)
		}
	}
}

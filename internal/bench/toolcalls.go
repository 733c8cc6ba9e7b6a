package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// toolCall is one recorded step of an agent's session: a shell command
// (exec), a file read or a file write through the API.
type toolCall struct {
	Name    string
	Kind    string // "exec", "read", "write"
	Shell   string // exec: run with /bin/sh -c in repoDir
	Path    string // read, write
	Content []byte // write
}

// repoDir is where the synthetic workspace's repository is.
const repoDir = "/workspace/repo"

// toolCalls is the recorded sequence every sandbox of `bench layers` and
// `bench ondemand` runs: read some sources, grep over a few packages,
// edit and add files, "build" (hash and pack two packages, read the
// compiler, copy a slice of a library) and "test" (a shell loop over ten
// files, plus a Python checker where the image has python3), then look at
// the results. The first call is a plain exec: its result is the "first
// exec result" of start-time measurements.
var toolCalls = []toolCall{
	{Name: "read README", Kind: "exec", Shell: "cat README.md"},
	{Name: "open file", Kind: "read", Path: repoDir + "/src/pkg01/file0000.go"},
	{Name: "list tree", Kind: "exec", Shell: "find . -type f | wc -l"},
	{Name: "grep", Kind: "exec", Shell: "grep -rn TODO src/pkg00 src/pkg01 src/pkg02 src/pkg03 | wc -l; grep -rl 'func Handle' src/pkg00 src/pkg01 | wc -l"},
	{Name: "edit", Kind: "exec", Shell: "sed -i 's/TODO/DONE/g' src/pkg02/file0001.go && grep -c DONE src/pkg02/file0001.go"},
	{Name: "write test", Kind: "write", Path: repoDir + "/src/pkg02/patch_test.go", Content: []byte(strings.Repeat("// regression test for the DONE edit\n", 112))},
	{Name: "build", Kind: "exec", Shell: "sh scripts/build.sh"},
	{Name: "test", Kind: "exec", Shell: "sh scripts/run_tests.sh"},
	{Name: "read manifest", Kind: "read", Path: "/workspace/build/manifest.txt"},
	{Name: "write notes", Kind: "write", Path: repoDir + "/NOTES.md", Content: []byte("fixed the TODOs of pkg02/file0001.go; tests pass\n")},
	{Name: "status", Kind: "exec", Shell: "ls /workspace/build; cat /workspace/build/toolchain.sum"},
	// The first walk of a sandbox's tree builds its overlay's dentries
	// and inodes for every file (~3 us each here); the baseline's archive
	// extraction, which goes through the overlay, has built them before
	// its first "list tree". A second walk compares the two warm.
	{Name: "list tree again", Kind: "exec", Shell: "find . -type f | wc -l"},
}

// toolCallShell returns the shell command of an exec tool call as run
// inside the sandbox (for peers: /bin/sh -c this).
func toolCallShell(tc toolCall) string { return "cd " + repoDir + " && " + tc.Shell }

// seqResult is one run of the sequence in one sandbox.
type seqResult struct {
	Steps []time.Duration // per tool call
	Total time.Duration
	// Digest hashes every call's output (stdout of execs, content of
	// reads): the same content gives the same digest in every sandbox.
	Digest string
}

// runToolCalls runs calls in sandbox id, stopping at the first failure.
func runToolCalls(ctx context.Context, cl *client.Client, id string, calls []toolCall) (seqResult, error) {
	var r seqResult
	h := sha256.New()
	t0 := time.Now()
	for _, tc := range calls {
		ts := time.Now()
		switch tc.Kind {
		case "exec":
			res, err := cl.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Shell: tc.Shell, Cwd: repoDir, TimeoutMs: 120_000})
			if err != nil {
				return r, fmt.Errorf("tool call %q: %w", tc.Name, err)
			}
			if res.GetExitCode() != 0 {
				return r, fmt.Errorf("tool call %q: exit code %d, stderr %q", tc.Name, res.GetExitCode(), truncate(string(res.GetStderr()), 300))
			}
			fmt.Fprintf(h, "%s\x00%d\x00", tc.Name, len(res.GetStdout()))
			h.Write(res.GetStdout())
		case "read":
			res, err := cl.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: tc.Path})
			if err != nil {
				return r, fmt.Errorf("tool call %q: %w", tc.Name, err)
			}
			fmt.Fprintf(h, "%s\x00%d\x00", tc.Name, len(res.GetContent()))
			h.Write(res.GetContent())
		case "write":
			if err := cl.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: tc.Path, Content: tc.Content, MakeParents: true}); err != nil {
				return r, fmt.Errorf("tool call %q: %w", tc.Name, err)
			}
		default:
			return r, fmt.Errorf("tool call %q: unknown kind %q", tc.Name, tc.Kind)
		}
		r.Steps = append(r.Steps, time.Since(ts))
	}
	r.Total = time.Since(t0)
	r.Digest = hex.EncodeToString(h.Sum(nil))[:16]
	return r, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestLayersCLI drives named layers through the CLI of the real binary:
// build (by path and by upload), create with --layer, commit, stats,
// verify, rm (refused while in use), and a restart that keeps the layer
// mounts of running sandboxes and drops the others at shutdown.
func TestLayersCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	src := filepath.Join(e.root, "ws")
	if err := os.MkdirAll(filepath.Join(src, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("from the layer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "etc", ".wh.group"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cliOK := func(args ...string) string {
		t.Helper()
		out, stderr, code := e.cli(nil, args...)
		if code != 0 {
			t.Fatalf("warren %v: exit %d: %s", args, code, stderr)
		}
		return out
	}
	cliOK("layer", "build", "ws", src)
	cliOK("layer", "build", "--upload", "ws-up", src)
	out := cliOK("--json", "layer", "ls")
	var ls warrenv1.ListLayersResponse
	if protojson.Unmarshal([]byte(out), &ls) != nil || len(ls.Layers) != 2 || ls.Layers[0].Digest != ls.Layers[1].Digest {
		t.Fatalf("layer ls: %s", out)
	}

	cliOK("sandbox", "create", "--image", imageName, "--layer", "ws", "--id", "withws")
	if got := e.shOK("withws", "cat /hello; test -e /etc/group || echo nogroup"); got != "from the layer\nnogroup\n" {
		t.Fatalf("sandbox with a layer: %q", got)
	}
	e.shOK("withws", "echo changed > /hello; mkdir -p /data; echo d > /data/f; rm /etc/passwd")
	out = cliOK("--json", "sandbox", "commit", "withws", "snap")
	var l warrenv1.Layer
	if protojson.Unmarshal([]byte(out), &l) != nil || l.Name != "snap" || !strings.HasPrefix(l.Digest, "sha256:") {
		t.Fatalf("commit: %s", out)
	}
	cliOK("sandbox", "create", "--image", imageName, "--layer", "ws", "--layer", "snap", "--id", "fromsnap")
	if got := e.shOK("fromsnap", "cat /hello /data/f; test -e /etc/passwd || echo nopasswd"); got != "changed\nd\nnopasswd\n" {
		t.Fatalf("sandbox of the committed layer: %q", got)
	}

	out = cliOK("--json", "image", "stats", imageName, "layer:snap")
	var st warrenv1.ImageStatsResponse
	if protojson.Unmarshal([]byte(out), &st) != nil || len(st.Layers) != 2 || !st.Layers[0].Mounted || st.Layers[0].Refs != 2 || st.Layers[0].Resident <= 0 {
		t.Fatalf("image stats: %s", out)
	}
	if out := cliOK("image", "verify"); strings.Count(out, " ok\n") != 3 {
		t.Fatalf("image verify: %q", out)
	}
	if _, stderr, code := e.cli(nil, "layer", "rm", "snap"); code != 1 || !strings.Contains(stderr, "conflict") {
		t.Fatalf("layer rm of a layer in use: exit %d %s", code, stderr)
	}

	// A restart: the mounts of running sandboxes stay and are reused.
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if got := e.shOK("fromsnap", "cat /hello"); got != "changed\n" {
		t.Fatalf("after restart: %q", got)
	}
	cliOK("sandbox", "rm", "withws", "fromsnap")
	if out := cliOK("layer", "rm", "snap", "ws", "ws-up"); out != "snap\nws\nws-up\n" {
		t.Fatalf("layer rm: %q", out)
	}
	if sbs, err := e.c.ListLayers(ctx); err != nil || len(sbs) != 0 {
		t.Fatalf("layers left: %v %v", sbs, err)
	}
}

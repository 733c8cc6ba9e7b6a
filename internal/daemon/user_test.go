package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/warrenrl/warren/internal/errdefs"
)

const testPasswd = `root:x:0:0:root:/root:/bin/sh
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
broken line
agent:x:1000:1001:RL agent,,,:/home/agent:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
`

const testGroup = `root:x:0:
daemon:x:1:
agents:x:1001:agent
docker:x:998:agent
nogroup:x:65534:
`

// dirReader reads files of a directory tree the way the daemon reads the
// sandbox's (a missing file is NotFound).
func dirReader(t *testing.T, files map[string]string) fileReader {
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return func(path string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, path))
		if os.IsNotExist(err) {
			return nil, errdefs.NotFoundf("%s not found", path)
		}
		return b, err
	}
}

func TestResolveUser(t *testing.T) {
	read := dirReader(t, map[string]string{"etc/passwd": testPasswd, "etc/group": testGroup})
	cases := []struct {
		spec     string
		uid, gid uint32
		home     string
	}{
		{"", 0, 0, "/root"},
		{"root", 0, 0, "/root"},
		{"0", 0, 0, "/root"},
		{"agent", 1000, 1001, "/home/agent"},
		{"1000", 1000, 1001, "/home/agent"},
		{"1000:5", 1000, 5, "/home/agent"},
		{"agent:docker", 1000, 998, "/home/agent"},
		{"agent:0", 1000, 0, "/home/agent"},
		{"4242", 4242, 4242, ""}, // no entry: gid = uid
		{"4242:7", 4242, 7, ""},
		{"nobody", 65534, 65534, "/nonexistent"},
		{"1:nogroup", 1, 65534, "/usr/sbin"},
	}
	for _, c := range cases {
		id, err := resolveUser(c.spec, read)
		if err != nil {
			t.Errorf("%q: %v", c.spec, err)
			continue
		}
		if id.UID != c.uid || id.GID != c.gid || id.Home != c.home {
			t.Errorf("%q: got %+v, want %d:%d %s", c.spec, id, c.uid, c.gid, c.home)
		}
	}
	for _, bad := range []string{"ghost", "agent:ghosts", ":", "agent:", ":0", "1:2:3", "4294967295", "a b", "../x"} {
		if _, err := resolveUser(bad, read); errdefs.CategoryOf(err) != errdefs.Invalid {
			t.Errorf("%q: want Invalid, got %v", bad, err)
		}
	}
}

func TestResolveUserWithoutFiles(t *testing.T) {
	// A sandbox without /etc/passwd: numbers work, names do not.
	read := dirReader(t, map[string]string{})
	id, err := resolveUser("1000", read)
	if err != nil || id.UID != 1000 || id.GID != 1000 {
		t.Fatalf("%+v %v", id, err)
	}
	if _, err := resolveUser("agent", read); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("name: %v", err)
	}
	// A backend without a host root or backend.Files: numbers only;
	// names are unsupported there (not invalid: they are fine elsewhere).
	id, err = resolveUser("7:8", nil)
	if err != nil || id.UID != 7 || id.GID != 8 {
		t.Fatalf("%+v %v", id, err)
	}
	if _, err := resolveUser("agent", nil); errdefs.CategoryOf(err) != errdefs.Unsupported {
		t.Fatalf("name without root: %v", err)
	}
	if _, err := resolveUser("7:staff", nil); errdefs.CategoryOf(err) != errdefs.Unsupported {
		t.Fatalf("group name without root: %v", err)
	}
}

func TestResolveUserReadError(t *testing.T) {
	read := func(string) ([]byte, error) { return nil, errdefs.Internalf("disk on fire") }
	if _, err := resolveUser("agent", read); errdefs.CategoryOf(err) != errdefs.Internal {
		t.Fatalf("got %v", err)
	}
}

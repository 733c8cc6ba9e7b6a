// Package kubernetes holds Warren's Kubernetes manifests; its test
// validates them against the Kubernetes schemas and checks their flags
// against the warren binary's.
package kubernetes

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/internal/cli"
)

// validator finds kubernetes-validate: scripts/kubernetes-validate.sh
// installs it (scripts/deps.sh runs that).
func validator(t *testing.T) string {
	t.Helper()
	prefix := os.Getenv("WARREN_KUBE_VALIDATE_PREFIX")
	if prefix == "" {
		prefix = "/opt/warren/kubernetes-validate"
	}
	if p := filepath.Join(prefix, "bin", "kubernetes-validate"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("kubernetes-validate"); err == nil {
		return p
	}
	t.Fatal("kubernetes-validate is not installed: run scripts/kubernetes-validate.sh")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func manifests(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	return files
}

func validate(t *testing.T, files ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(validator(t), append([]string{"--strict", "--no-warn"}, files...)...).CombinedOutput()
	return string(out), err
}

// The manifests are valid Kubernetes objects (strict: no unknown fields).
func TestManifestsValidate(t *testing.T) {
	if out, err := validate(t, manifests(t)...); err != nil {
		t.Fatalf("kubernetes-validate: %v\n%s", err, out)
	}
}

// The validator run above fails on a broken manifest: a mistyped field, a
// wrong type, a missing required field.
func TestValidatorRejectsBrokenManifests(t *testing.T) {
	node, err := os.ReadFile("20-node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := os.ReadFile("30-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, broken := range map[string]string{
		"unknown-field": strings.Replace(string(node), "hostPID: true", "hostPIDs: true", 1),
		"wrong-type":    strings.Replace(string(gw), "replicas: 2", "replicas: two", 1),
		"no-selector":   strings.Replace(string(gw), "  selector:\n    matchLabels:\n      app.kubernetes.io/name: warren-gateway\n  strategy:", "  strategy:", 1),
	} {
		if broken == string(node) || broken == string(gw) {
			t.Fatalf("%s: the edit did not apply", name)
		}
		p := filepath.Join(t.TempDir(), name+".yaml")
		if err := os.WriteFile(p, []byte(broken), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := validate(t, p); err == nil {
			t.Errorf("%s: a broken manifest passed validation:\n%s", name, out)
		}
	}
}

var argFlag = regexp.MustCompile(`^\s+- (--[a-z0-9-]+)`)

// Every flag the manifests pass to `warren serve` and `warren gateway`
// exists in this binary (a renamed flag would crash-loop every pod), and
// the node daemon keeps the host access it needs.
func TestManifestFlagsExist(t *testing.T) {
	root := cli.NewRootCommand()
	if cmd, _, err := root.Find([]string{"gateway"}); err != nil || cmd == root {
		// Built on a branch before the gateway merged: the cluster flags
		// (--join, --gossip-*, --node-name) are not in this binary yet.
		t.Skip("this binary has no `warren gateway`: the manifests' cluster flags cannot be checked")
	}
	for file, sub := range map[string]string{"20-node.yaml": "serve", "30-gateway.yaml": "gateway"} {
		cmd, _, err := root.Find([]string{sub})
		if err != nil || cmd == root {
			t.Errorf("%s: warren has no %q command", file, sub)
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(data), "\n") {
			m := argFlag.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			n++
			if !hasFlag(cmd, strings.TrimPrefix(m[1], "--")) {
				t.Errorf("%s: warren %s has no flag %s", file, sub, m[1])
			}
		}
		if n == 0 {
			t.Errorf("%s: no flags found", file)
		}
	}
}

// The node daemon keeps the host access it needs (docs/DEPLOY.md).
func TestNodeDaemonSetHostAccess(t *testing.T) {
	node, err := os.ReadFile("20-node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"privileged: true", "hostPID: true", "hostNetwork: true", "path: /var/lib/warren\n", "path: /run/warren", "path: /sys/fs/cgroup", "ReadWriteMany"} {
		if !strings.Contains(string(node), want) {
			t.Errorf("20-node.yaml lost %q", want)
		}
	}
}

func hasFlag(cmd *cobra.Command, name string) bool {
	return cmd.Flags().Lookup(name) != nil || cmd.InheritedFlags().Lookup(name) != nil
}

package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestOtherArchAgent: the committed arm64 agent (amd64 on an arm64 host)
// serves the protocol, run under qemu user-mode emulation where it is
// installed (scripts/deps.sh): it is built from the same source, but only
// this test ever runs it on this machine.
func TestOtherArchAgent(t *testing.T) {
	o, ok := map[string][2]string{
		"amd64": {"arm64", "qemu-aarch64"},
		"arm64": {"amd64", "qemu-x86_64"},
	}[runtime.GOARCH]
	if !ok {
		t.Skipf("no agent of another architecture to run on linux/%s", runtime.GOARCH)
	}
	other, qemu := o[0], o[1]
	q, err := exec.LookPath(qemu)
	if err != nil {
		t.Skipf("%s not installed (qemu-user)", qemu)
	}
	b, err := os.ReadFile(filepath.Join("..", "agentbin", "warren-agent-"+other))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "agent-"+other)
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	a := startAgentArgv(t, nil, q, bin)
	if res := run(t, a.client, sh(`echo ok; echo err >&2; exit 3`), ""); res.stdout != "ok\n" || res.stderr != "err\n" || res.status.Code != 3 {
		t.Errorf("exec under %s: %+v", qemu, res)
	}
}

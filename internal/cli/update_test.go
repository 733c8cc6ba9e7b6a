package cli

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func (f *fakeManager) UpdateSandbox(_ context.Context, r *warrenv1.UpdateSandboxRequest) (*warrenv1.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastUpdate = r
	return &warrenv1.Sandbox{Id: r.Id, State: warrenv1.SandboxState_SANDBOX_STATE_RUNNING,
		Resources: &warrenv1.Resources{CpuMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(), PidsMax: r.GetPidsMax()},
		Labels:    r.SetLabels, Network: r.Network}, nil
}

// TestSandboxUpdate: `sandbox update` sends exactly the fields whose flags
// were given (a flag at 0 is sent as 0, an absent one not at all), labels
// to set and to remove, and prints the updated sandbox.
func TestSandboxUpdate(t *testing.T) {
	f, addr := startDaemon(t)
	r := run(t, addr, "", "sandbox", "update", "sb1", "--cpu", "1.5", "--memory", "1Gi", "--pids", "0",
		"--timeout", "90s", "--label", "a=1", "--label", "b=2", "--remove-label", "c")
	if r.code != 0 || !strings.Contains(r.stdout, "1.5") || !strings.Contains(r.stdout, "a=1,b=2") {
		t.Fatalf("%+v", r)
	}
	want := &warrenv1.UpdateSandboxRequest{Id: "sb1", CpuMillis: proto.Int64(1500), MemoryBytes: proto.Int64(1 << 30),
		PidsMax: proto.Int64(0), TimeoutSeconds: proto.Int64(90), SetLabels: map[string]string{"a": "1", "b": "2"}, RemoveLabels: []string{"c"}}
	if !proto.Equal(f.lastUpdate, want) {
		t.Fatalf("sent %v, want %v", f.lastUpdate, want)
	}
	r = run(t, addr, "", "sandbox", "update", "sb1", "--pids", "64")
	if r.code != 0 || f.lastUpdate.CpuMillis != nil || f.lastUpdate.MemoryBytes != nil || f.lastUpdate.TimeoutSeconds != nil ||
		f.lastUpdate.GetPidsMax() != 64 || len(f.lastUpdate.SetLabels) != 0 || !slices.Equal(f.lastUpdate.RemoveLabels, nil) {
		t.Fatalf("%+v sent %v", r, f.lastUpdate)
	}
	// --network sends the policy as written and shows the new one.
	r = run(t, addr, "", "sandbox", "update", "sb1", "--network", "allow:10.1.0.0/16:443/tcp,192.0.2.1")
	port := uint32(443)
	wantNet := &warrenv1.NetworkPolicy{Mode: "allowlist", Allow: []*warrenv1.NetworkRule{
		{Cidr: "10.1.0.0/16", Port: &port, Protocol: "tcp"}, {Cidr: "192.0.2.1"}}}
	if r.code != 0 || !proto.Equal(f.lastUpdate.GetNetwork(), wantNet) || !strings.Contains(r.stdout, "allow:10.1.0.0/16:443/tcp,192.0.2.1") {
		t.Fatalf("%+v sent %v", r, f.lastUpdate)
	}
	if r := run(t, addr, "", "sandbox", "update", "sb1", "--pids", "1"); r.code != 0 || f.lastUpdate.Network != nil {
		t.Fatalf("no --network sent a network: %v", f.lastUpdate)
	}
	for _, bad := range [][]string{{"--cpu", "-1"}, {"--memory", "lots"}, {"--label", "novalue"}, {"--timeout", "-5s"}, {"--network", "closed"}, {"--network", "allow:10.0.0.0/8:x"}} {
		if r := run(t, addr, "", append([]string{"sandbox", "update", "sb1"}, bad...)...); r.code != 2 {
			t.Errorf("%v: %+v, want usage error", bad, r)
		}
	}
}

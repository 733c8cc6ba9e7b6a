package daemon

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/warrenrl/warren/internal/backend"
)

// TestProcTagFits: the record the agent keeps for the next daemon stays
// within the agent's tag limit whatever the command line, and says where
// it was cut.
func TestProcTagFits(t *testing.T) {
	long := make([]string, 100)
	for i := range long {
		long[i] = strings.Repeat("x", 1000)
	}
	for _, argv := range [][]string{{"sh", "-c", "echo hi"}, long} {
		b := procTag{ID: "p-7", Seq: 7, Argv: argv, StartedMs: 1, TimeoutMs: 2}.encode()
		var back procTag
		if len(b) > backend.MaxTag || json.Unmarshal(b, &back) != nil || back.ID != "p-7" || back.Seq != 7 {
			t.Fatalf("tag of %d bytes: %s", len(b), b)
		}
		if len(argv) == 3 && strings.Join(back.Argv, " ") != "sh -c echo hi" {
			t.Fatalf("short argv came back as %q", back.Argv)
		}
		if len(argv) == 100 && (len(back.Argv) < 2 || back.Argv[len(back.Argv)-1] != "..." || len(back.Argv[0]) != 259) {
			t.Fatalf("long argv came back as %d args, last %q", len(back.Argv), back.Argv[len(back.Argv)-1])
		}
	}
}

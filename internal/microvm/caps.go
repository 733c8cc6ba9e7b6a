package microvm

import "github.com/warrenrl/warren/internal/backend"

// SandboxCheckpoints says whether this build's microVM sandboxes
// implement backend.Checkpointer: `warren bench vm` measures snapshot and
// restore when they do, and names the skip when they do not.
func SandboxCheckpoints() bool {
	_, ok := any((*sandbox)(nil)).(backend.Checkpointer)
	return ok
}

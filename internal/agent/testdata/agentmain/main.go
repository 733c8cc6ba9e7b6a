// Command agentmain is a minimal binary that embeds the sandbox agent, for
// the agent package's tests. Run with _WARREN_AGENT_FD set, it never
// reaches main.
package main

import (
	"fmt"
	"os"

	_ "github.com/warrenrl/warren/internal/agent"
)

func main() {
	fmt.Fprintln(os.Stderr, "agentmain: _WARREN_AGENT_FD is not set")
	os.Exit(2)
}

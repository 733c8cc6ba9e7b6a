// Command initmain is a minimal static binary carrying the container init
// stage and the agent, used as the sandbox init by the backend's tests
// (the test binary itself is dynamically linked).
package main

import (
	_ "github.com/warrenrl/warren/internal/container"
)

func main() {}

//go:build !amd64 && !arm64

package agentbin

// No agent is built for this architecture: Open refuses to start.
var binary []byte

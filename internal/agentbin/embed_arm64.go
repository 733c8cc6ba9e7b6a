package agentbin

import _ "embed"

//go:embed warren-agent-arm64
var binary []byte

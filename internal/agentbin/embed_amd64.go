package agentbin

import _ "embed"

//go:embed warren-agent-amd64
var binary []byte

// Package e2b is Warren's E2B-compatible front door: one HTTP server that
// speaks the lifecycle REST API of E2B's control plane and the in-sandbox
// agent protocol of its SDKs ("envd": Connect RPCs with the JSON codec
// plus plain HTTP /files and /health), so that the official E2B SDKs work
// against a Warren node unchanged.
//
// It holds no sandbox behaviour of its own: every call becomes one or a
// few calls of a Manager, the same ones the Connect API (internal/server)
// makes: the daemon's on a node, the gateway's in a cluster (which places
// creates and routes every call to the sandbox's node). Commands are Warren background processes
// (StartProcess, then AttachProcess for their output), files go through
// the Manager's file calls, pause is Hibernate (Pause where the node cannot
// hibernate) and connect is Resume.
//
// Routing: a request whose Host is 49983-ID.DOMAIN, or one to an envd
// path (/process.Process/*, /filesystem.Filesystem/*, /files, /health)
// carrying E2b-Sandbox-Id (what the SDKs send when E2B_SANDBOX_URL is
// set), is envd traffic for that sandbox; one whose Host is PORT-ID.DOMAIN
// with another port, or with E2b-Sandbox-Id and E2b-Sandbox-Port naming
// another port, goes through a reverse proxy to that port in the sandbox
// (proxy.go: Manager.DialPort); everything else is the REST API. REST calls
// need an X-API-Key from the configured key file; envd calls need the
// X-Access-Token the REST API issued for that sandbox (an HMAC of its id
// under the keys, so it survives a daemon restart and no table is kept).
//
// docs/E2B.md says what is and is not supported.
package e2b

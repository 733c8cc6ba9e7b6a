//go:build linux && cgo

package agent

// The agent itself is agent_linux.c: an ELF constructor that takes over the
// process before the Go runtime starts when EnvFD is set. This file only
// makes cgo compile and link it into every binary that imports the package.

// #cgo CFLAGS: -O2 -Wall
import "C"

const embedded = true

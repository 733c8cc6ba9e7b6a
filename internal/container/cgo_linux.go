//go:build linux && cgo

package container

// The init stage is init_linux.c: an ELF constructor that runs before the
// Go runtime when initEnv is set, and hands over to the agent in place.

// #cgo CFLAGS: -O2 -Wall
import "C"

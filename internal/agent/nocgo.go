//go:build !(linux && cgo)

package agent

const embedded = false

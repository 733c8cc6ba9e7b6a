//go:build !race

package tarx

// deepLevels is the depth of the deep-tree test (see race_test.go).
const deepLevels = 30000

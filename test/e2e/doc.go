// Package e2e holds end-to-end tests of the real warren binary: each test
// builds it statically, starts its own daemon (`warren serve`) with private
// directories and cgroup parent, and drives it through the public Go SDK
// and the command line, as root, on the real kernel. Besides the API
// behaviour the tests check that the node's mounts, cgroups, network
// namespaces, processes and per-sandbox directories return to their
// baseline, also across daemon crashes and restarts.
//
// Each daemon logs at debug level to a file that is printed (its tail)
// when a test fails, or always with WARREN_E2E_LOG=1.
//
// Files a test keeps for CI (the dashboard test's screenshots) go under
// $WARREN_ARTIFACTS when it is set, else to the test's temporary directory.
package e2e

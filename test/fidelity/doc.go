// Package fidelity is the environment-fidelity suite (issue #10): CPython's
// own regression tests, from Debian bookworm's libpython3.11-testsuite
// package, run in a Warren sandbox of the default Debian image (the
// package as a named layer on it) and, in the same run, in a plain
// unshare+chroot of the same files with the host's /etc/hosts, /proc, /dev
// and network, as a normal Debian machine has them. Every test case that
// passes in the chroot must pass in the sandbox, unless exceptions.txt
// lists it with its reason; the counts are printed as a table and written
// as JSON. See docs/FIDELITY.md.
//
// The suite runs as root (debootstrap, namespaces, mounts) and needs the
// Debian mirror of the system's apt sources the first time; the
// debootstrap tree and the .debs are cached below
// /var/cache/warren/fidelity. WARREN_FIDELITY=skip skips it.
package fidelity

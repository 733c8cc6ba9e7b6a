// Package seccomp is the system-call filter every sandbox process runs
// under: the policy (which calls a sandbox may make, which are refused
// and with what errno) and a compiler from that policy to the classic BPF
// program the kernel takes (seccomp(SECCOMP_SET_MODE_FILTER)).
//
// The daemon compiles the policy once and hands the program to each
// sandbox's init stage (internal/container/init_linux.c), which installs
// it with no_new_privs as its last step before it becomes the agent; every
// process of the sandbox inherits it, the agent included.
//
// The policy is an allow-list, like Docker's default profile: a call the
// policy does not name fails with ENOSYS, the answer of a kernel that
// lacks it, so programs fall back (glibc's clone3 -> clone) instead of
// failing on EPERM. Calls that reach the kernel's shared state (modules,
// kexec, bpf, perf, keyrings, mounts, the clock, swap) or that agents have
// abused (filesystem-metadata ioctls, namespaces, vsock) fail with EPERM
// or the errno of an unsupported operation. sync(2) and syncfs(2) succeed
// without doing anything: one sandbox's sync would otherwise write back
// every sandbox's dirty pages on the node.
//
// The program is a binary search over the syscall number (about nine
// comparisons per call instead of one per allowed call), with the few
// argument checks (ioctl commands, clone and unshare flags, socket
// families) in the leaves. Arguments are compared on their low 32 bits
// only where the kernel reads them as 32-bit values (an ioctl command is
// an unsigned int): comparing all 64 bits would let a caller set the high
// bits to slip past an equality test.
package seccomp

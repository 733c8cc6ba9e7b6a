// Package fncall is the `fncall` backend: one job (a few programs run in
// order, with limits, files in and out) in a fresh, isolated environment
// in about a millisecond, thousands of times per second per node.
//
// An environment is a container sandbox (internal/container: the same
// namespaces, cgroup, overlay root over the image's layers, seccomp
// filter, no_new_privs, user namespace and masks), made ahead of time and
// kept in a pool per image. A call draws one, sends the whole job to its
// agent in one frame (internal/agent, "Jobs"), and gets each step's
// status, output, CPU and wall time and peak memory back as the step
// ends, then one frame after the reset: no round trip per step.
// The agent then resets the environment before it replies: every
// process killed (kill(-1) as its PID 1, waited for until none is left),
// the work directory and the scratch directories (/tmp, /var/tmp,
// /dev/shm) emptied, SysV IPC objects removed; the container backend
// then unlinks the POSIX message queues the job left (internal/container,
// mqueue.go), which the agent cannot list. A reset that fails, or
// any error from the environment, destroys it; the pool makes another.
//
// What it promises: a job sees no file, process or IPC object of an
// earlier job; a program's failure (exit code, signal, limit) is a
// step's status, never an error; an error means Warren failed. Programs
// run as an unprivileged user (JobUID) in their environment, so the image's
// files are read-only to them and the reset knows every place they
// could have written.
//
// A job's disk quota (StepLimits.DiskBytes, the largest of its steps',
// or Options.DiskBytes) is its environment's writable layer: a
// filesystem of that size (the container backend's disk limit), so there
// is a pool per image and quota; a step that fills it ends in the output
// limit.
//
// GPU jobs (gpu.go): a job may ask for GPUs (JobOptions). Their device
// nodes are made in its environment's /dev for the job and removed after
// the reset; the environment (of a pool of GPU environments) has the
// driver's control nodes and its files bound read-only. A GPU runs one
// exclusive job, or any number of shared ones, at a time; a job takes all
// of its GPUs at once, and one that asks for more than the node has is
// invalid.
//
// The same pools are a sandbox backend (sandbox.go, Backend: Create with
// backend "fncall"): an environment taken ready-made becomes a sandbox,
// and is destroyed with it, never reset into a pool.
//
// Pools adapt to load: each keeps as many environments, idle or in use,
// as were in use at once in the last second plus one spare, refills in
// the background as calls draw them, and an image's pool that sees no call
// for IdleTimeout has its environments destroyed.
package fncall
